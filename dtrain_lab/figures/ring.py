"""The ring all-reduce step by step, from the sends each rank recorded
(:func:`dtrain_lab.comm.collectives.ring_all_reduce` with ``trace=``): in each step of the
reduce-scatter and then of the all-gather, which chunk every rank sent to whom. Order only, never times."""
from __future__ import annotations

from dtrain_lab.figures._grid import box, color, grid_axes, new_figure
from dtrain_lab.i18n import tr

PHASES = ("reduce_scatter", "all_gather")


def inputs(metrics: dict) -> dict:
    """The figure's inputs from a launch's per-rank metrics (each rank reported ``ring_sends``)."""
    sends = [dict(e) for r in sorted(metrics, key=int) for e in metrics[r]["ring_sends"]]
    sends.sort(key=lambda e: (PHASES.index(e["phase"]), e["step"], e["src"]))
    return {"world_size": len(metrics), "sends": sends}


def draw(data: dict, lang: str):
    p, sends = data["world_size"], data["sends"]
    steps = {ph: sorted({e["step"] for e in sends if e["phase"] == ph}) for ph in PHASES}
    cols = [(ph, s) for ph in PHASES for s in steps[ph]]
    fig = new_figure(1.75 * len(cols) + 1.0, 0.62 * p + 1.6)
    ax = fig.add_subplot()
    grid_axes(ax, [tr("fig_step", lang, n=len(steps[ph][:steps[ph].index(s)]) + 1) for ph, s in cols],
              [tr("fig_rank", lang, r=r) for r in range(p)])
    for e in sends:
        x = cols.index((e["phase"], e["step"]))
        box(ax, x, e["src"], tr("fig_ring_send", lang, chunk=e["chunk"], dst=e["dst"], numel=e["numel"]),
            color(e["chunk"]), size=7.5)
    split = len(steps["reduce_scatter"]) - 0.5
    ax.axvline(split, color="black", linewidth=0.8, linestyle="--")
    for ph, key in zip(PHASES, ("fig_ring_reduce_scatter", "fig_ring_all_gather")):
        xs = [i for i, (c, _) in enumerate(cols) if c == ph]
        if xs:
            ax.text((xs[0] + xs[-1]) / 2, p - 0.5 + 0.12, tr(key, lang), ha="center", va="top", fontsize=9)
    ax.set_ylim(p - 0.5 + 0.5, -0.5)
    ax.set_title(tr("fig_ring_title", lang, p=p), fontsize=10, pad=22)
    fig.tight_layout()
    return fig
