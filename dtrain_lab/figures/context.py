"""Lesson 13's two exchanges, from what the ranks recorded.

* Ring attention (:func:`dtrain_lab.parallel.context.ring_attention`, ``stats["blocks"]``): at each
  step of the forward ring, whose K/V block every rank attended to; at each step of the backward
  ring, whose K/V block it used again and whose ``dK, dV`` accumulator it added to and passed on.
* MoE expert parallelism (:class:`dtrain_lab.parallel.expert.MoE`, ``last_stats``): how many token
  assignments each rank dispatched to each rank's experts, and how many rows came back in the combine.
"""
from __future__ import annotations

from dtrain_lab.figures._grid import box, color, grid_axes, new_figure
from dtrain_lab.i18n import tr

PHASES = ("forward", "backward")


def ring_inputs(metrics: dict, case: str) -> dict:
    """The ring figure's inputs from ``cp_run``'s per-rank metrics: the ``blocks`` of ``case``."""
    blocks = [dict(b) for r in sorted(metrics, key=int) for b in metrics[r]["equal"][case]["blocks"]]
    blocks.sort(key=lambda b: (PHASES.index(b["phase"]), b["step"], b["rank"]))
    return {"world_size": len(metrics), "case": case, "blocks": blocks}


def ring_table(data: dict, lang: str | None = None) -> str:
    """The (step, rank) -> block table as text, one line per step of each ring."""
    p = data["world_size"]
    lines = []
    for phase, key in zip(PHASES, ("fig_cp_forward_row", "fig_cp_backward_row")):
        for step in sorted({b["step"] for b in data["blocks"] if b["phase"] == phase}):
            held = {b["rank"]: b["owner"] for b in data["blocks"] if b["phase"] == phase and b["step"] == step}
            cells = "  ".join(tr("fig_cp_cell", lang, rank=r, owner=held[r]) for r in range(p) if r in held)
            lines.append(tr(key, lang, step=step + 1, cells=cells))
    return "\n".join(lines)


def draw_ring(data: dict, lang: str):
    p, blocks = data["world_size"], data["blocks"]
    cols = [(ph, s) for ph in PHASES for s in sorted({b["step"] for b in blocks if b["phase"] == ph})]
    fig = new_figure(1.25 * len(cols) + 1.0, 0.62 * p + 1.7)
    ax = fig.add_subplot()
    grid_axes(ax, [tr("fig_step", lang, n=s + 1) for _, s in cols], [tr("fig_rank", lang, r=r) for r in range(p)])
    for b in blocks:
        x = cols.index((b["phase"], b["step"]))
        key = "fig_cp_forward_box" if b["phase"] == "forward" else "fig_cp_backward_box"
        box(ax, x, b["rank"], tr(key, lang, owner=b["owner"]), color(b["owner"]), size=7.5)
    n_fwd = sum(ph == "forward" for ph, _ in cols)
    ax.axvline(n_fwd - 0.5, color="black", linewidth=0.8, linestyle="--")
    for ph, key in zip(PHASES, ("fig_cp_forward", "fig_cp_backward")):
        xs = [i for i, (c, _) in enumerate(cols) if c == ph]
        if xs:
            ax.text((xs[0] + xs[-1]) / 2, p - 0.5 + 0.12, tr(key, lang), ha="center", va="top", fontsize=9)
    ax.set_ylim(p, -0.5)
    ax.set_title(tr("fig_cp_title", lang, p=p), fontsize=10, pad=22)
    fig.tight_layout()
    return fig


def dispatch_inputs(metrics: dict) -> dict:
    """The MoE figure's inputs from ``ep_run``'s per-rank metrics: rows each rank sent to each rank
    (dispatch), rows each rank received, and the assignments each rank dropped."""
    ranks = sorted(metrics, key=int)
    return {"world_size": len(ranks), "sent": [list(metrics[r]["sent"]) for r in ranks],
            "received": [list(metrics[r]["received"]) for r in ranks],
            "dropped": [metrics[r]["dropped"] for r in ranks]}


def _matrix(ax, m: list[list[int]], title: str, ylabel: str, xlabel: str, lang: str) -> None:
    p = len(m)
    top = max(max(row) for row in m) or 1
    ax.imshow(m, cmap="Blues", vmin=0, vmax=top * 2)
    for i in range(p):
        for j in range(p):
            ax.text(j, i, str(m[i][j]), ha="center", va="center", fontsize=11,
                    color="black")
    ax.set_xticks(range(p), [tr("fig_rank", lang, r=r) for r in range(p)])
    ax.set_yticks(range(p), [tr("fig_rank", lang, r=r) for r in range(p)])
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)


def draw_dispatch(data: dict, lang: str):
    p, sent = data["world_size"], data["sent"]
    back = [[sent[j][i] for j in range(p)] for i in range(p)]   # combine: the same rows, returned
    fig = new_figure(3.3 * 2 + 0.6, 3.6)
    left, right = fig.subplots(1, 2)
    _matrix(left, sent, tr("fig_ep_dispatch", lang), tr("fig_ep_from_tokens", lang), tr("fig_ep_to_experts", lang), lang)
    _matrix(right, back, tr("fig_ep_combine", lang), tr("fig_ep_from_experts", lang), tr("fig_ep_to_tokens", lang), lang)
    fig.suptitle(tr("fig_ep_title", lang, p=p, dropped=", ".join(str(d) for d in data["dropped"])), fontsize=10)
    fig.tight_layout()
    return fig
