"""Lesson 02: DDP's gradient buckets during one backward, from the events the wrapper told
(:attr:`dtrain_lab.parallel.ddp.DDP.on_event`, reported by ``dp_equivalence``): which parameter's
gradient became ready, when each bucket's all-reduce was launched, where backward ended and when the
final callback waited for each bucket. Order and bucket membership only: the times and the ``done``
events (their place depends on timing) are left out, they belong to the live timeline."""
from __future__ import annotations

from dtrain_lab.figures._grid import box, color, new_figure
from dtrain_lab.i18n import tr

VARIANTS = ("buckets", "buckets_no_overlap")
ORDERED = ("ready", "launch", "backward_end", "wait")     # events whose order does not depend on timing


def inputs(metrics: dict, rank: int = 0) -> dict:
    """The figure's inputs from ``dp_equivalence``'s per-rank metrics (one rank's events, without times)."""
    variants = metrics[rank]["variants"]
    keep = ("event", "param", "bucket")
    return {"world_size": len(metrics), "buckets": variants["buckets"]["buckets"],
            "variants": {v: [{k: e[k] for k in keep if k in e} for e in variants[v]["events"] if e["event"] in ORDERED]
                         for v in VARIANTS}}


def _panel(ax, events: list[dict], nb: int, title: str, lang: str) -> None:
    n = len(events)
    rows = [tr("fig_ddp_autograd", lang)] + [tr("fig_ddp_bucket_row", lang, b=b) for b in range(nb)]
    ax.set_xlim(-0.6, n - 0.4)
    ax.set_ylim(len(rows) - 0.45, -0.6)
    ax.set_yticks(range(len(rows)), rows)
    ax.set_xticks(range(n), [str(i + 1) for i in range(n)], fontsize=9)
    ax.tick_params(length=0)
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    launched = {}
    for x, e in enumerate(events):
        kind = e["event"]
        if kind == "ready":
            box(ax, x, 0, tr("fig_ddp_ready", lang, param="\n".join(e["param"].rsplit(".", 1))), color(e["bucket"]),
                w=0.94, h=0.8, size=9)
        elif kind == "launch":
            launched[e["bucket"]] = x
            box(ax, x, 1 + e["bucket"], tr("fig_ddp_launch", lang, b=e["bucket"]), color(e["bucket"]), w=0.94, h=0.8, size=9)
        elif kind == "wait":
            b = e["bucket"]
            if b in launched and x - launched[b] > 1:
                ax.plot([launched[b] + 0.47, x - 0.47], [1 + b, 1 + b], color=color(b), linewidth=1.2, linestyle=":")
            box(ax, x, 1 + b, tr("fig_ddp_wait", lang, b=b), color(b), w=0.94, h=0.8, size=9)
        elif kind == "backward_end":
            ax.axvline(x, color="black", linewidth=0.9, linestyle="--")
            ax.text(x, -0.55, tr("fig_ddp_backward_end", lang), ha="center", va="bottom", fontsize=9)
    ax.set_title(title, fontsize=10, loc="left", pad=14)
    ax.tick_params(axis="y", labelsize=9)


def draw(data: dict, lang: str):
    nb = len(data["buckets"])
    n = max(len(ev) for ev in data["variants"].values())
    fig = new_figure(0.8 * n + 2.0, 2 * (0.8 * (nb + 1) + 1.1) + 0.8)
    axes = fig.subplots(2, 1)
    for ax, v, key in zip(axes, VARIANTS, ("fig_ddp_overlap", "fig_ddp_no_overlap")):
        _panel(ax, data["variants"][v], nb, tr(key, lang), lang)
    axes[-1].set_xlabel(tr("fig_ddp_xlabel", lang), fontsize=9)
    fig.suptitle(tr("fig_ddp_title", lang, p=data["world_size"], nb=nb), fontsize=11)
    fig.tight_layout()
    return fig


def plot_timeline(metrics: dict, rank: int = 0):
    """The **measured** timeline of the same backward, live only (a measurement is never stored): on
    ``rank``, when each gradient was ready (ticks), each bucket's all-reduce from its launch to its
    completion (bars), and the end of backward, in milliseconds since ``backward()`` was called."""
    from dtrain_lab.viz import label, new_figure

    fig, axes = new_figure(2, 1, figsize=(8, 5), sharex=True)
    variants = metrics[rank]["variants"]
    nb = len(variants["buckets"]["buckets"])
    for ax, v, key in zip(axes, VARIANTS, ("fig_ddp_overlap", "fig_ddp_no_overlap")):
        events = variants[v]["events"]
        at = {}
        for e in events:
            at.setdefault((e["event"], e.get("bucket")), e["t"] * 1e3)
        for e in events:
            if e["event"] == "ready":
                ax.plot([e["t"] * 1e3] * 2, [-0.35, 0.35], color=color(e["bucket"]), linewidth=2)
        for b in range(nb):
            start = at.get(("launch", b))
            end = at.get(("done", b), at.get(("wait", b)))
            if start is not None and end is not None:
                ax.barh(1 + b, max(end - start, 1e-3), left=start, height=0.6, color=color(b))
        if ("backward_end", None) in at:
            ax.axvline(at[("backward_end", None)], color="black", linestyle="--", linewidth=0.9,
                       label=label("fig_ddp_backward_end"))
        ax.set_yticks(range(nb + 1), [label("fig_ddp_autograd")] + [label("fig_ddp_bucket_row", b=b) for b in range(nb)])
        ax.set_ylim(nb + 0.6, -0.6)
        ax.set_title(label(key), fontsize=9, loc="left")
        ax.legend(loc="upper right", fontsize=8)
    axes[-1].set_xlabel(label("fig_ddp_live_xlabel", rank=rank))
    fig.suptitle(label("fig_ddp_live_title"), fontsize=10)
    fig.tight_layout()
    return fig
