"""Megatron's MLP split on the ranks of a run (Shoeybi et al. 2019, Figure 3a): the column-parallel
``fc1`` and row-parallel ``fc2`` shards each rank held, and the collectives ``CommDebugMode`` counted
in forward and backward, which are exactly Megatron's ``f`` (identity forward, all-reduce backward)
and ``g`` (all-reduce forward, identity backward). From ``tp_run``'s reports (``mlp``)."""
from __future__ import annotations

from dtrain_lab.figures._grid import box, color, new_figure
from dtrain_lab.i18n import tr

GREY, DARK = "#8C8C8C", "#4D4D4D"


def inputs(metrics: dict) -> dict:
    ranks = sorted(metrics, key=int)
    mlp = [metrics[r]["mlp"] for r in ranks]
    return {"world_size": len(ranks), "held": [m["held"] for m in mlp],
            "forward": [m["forward"] for m in mlp], "backward": [m["backward"] for m in mlp]}


def _shape(s: list[int]) -> str:
    return "×".join(str(n) for n in s)


def _calls(counts: dict) -> str:
    return ", ".join(f"{op} ×{n}" for op, n in sorted(counts.items()))


def draw(data: dict, lang: str):
    p = data["world_size"]
    fig = new_figure(9.5, 1.35 * p + 1.9)
    ax = fig.add_subplot()
    ax.set_xlim(-0.6, 6.6)
    ax.set_ylim(p - 0.35, -0.75)
    ax.axis("off")
    for r, held in enumerate(data["held"]):
        shapes = held["shapes"]
        lo, hi = held["fc1_rows"]
        a, b = held["fc2_cols"]
        box(ax, 0, r, tr("fig_tp_x", lang, r=r, shape=_shape(held["x_shape"])), GREY, w=0.95, h=0.86, size=8.5)
        box(ax, 2, r, tr("fig_tp_fc1", lang, lo=lo, hi=hi, shape=_shape(shapes["fc1.weight"]),
                         full=_shape(held["full"]["fc1.weight"])), color(r), w=1.05, h=0.86, size=8.5)
        box(ax, 3, r, tr("fig_tp_act", lang), color(r), w=0.7, h=0.86, size=8.5)
        box(ax, 4, r, tr("fig_tp_fc2", lang, lo=a, hi=b, shape=_shape(shapes["fc2.weight"]),
                         full=_shape(held["full"]["fc2.weight"])), color(r), w=1.05, h=0.86, size=8.5)
        box(ax, 6, r, tr("fig_tp_y", lang, shape=_shape(held["x_shape"])), GREY, w=0.95, h=0.86, size=8.5)
        for x0, x1 in ((0.48, 0.78), (1.22, 1.47), (2.53, 2.65), (3.35, 3.47), (4.53, 4.78), (5.22, 5.52)):
            ax.annotate("", xy=(x1, r), xytext=(x0, r), arrowprops={"arrowstyle": "->", "color": DARK, "lw": 0.9})
    fwd, bwd = data["forward"][0], data["backward"][0]
    span = p - 1 + 0.86
    box(ax, 1, (p - 1) / 2, tr("fig_tp_f", lang, calls=_calls(bwd)), DARK, w=0.7, h=span, size=8.5)
    box(ax, 5, (p - 1) / 2, tr("fig_tp_g", lang, calls=_calls(fwd)), DARK, w=0.7, h=span, size=8.5)
    ax.set_title(tr("fig_tp_title", lang, p=p, fwd=_calls(fwd), bwd=_calls(bwd)), fontsize=10)
    fig.tight_layout()
    return fig
