"""ZeRO stages 1, 2 and 3: which elements of the parameters, the gradients and the optimizer state
each rank held when its optimizer stepped, read from the course's ZeRO objects in a run
(:func:`dtrain_lab.demos.zero_run.held`: ranges of the model's parameters laid end to end)."""
from __future__ import annotations

from dtrain_lab.figures._grid import color, new_figure
from dtrain_lab.i18n import tr

STAGES = ("1", "2", "3")
KINDS = ("params", "grads", "optimizer")


def inputs(metrics: dict) -> dict:
    """The figure's inputs from ``zero_run``'s per-rank metrics: the paper's stage 1 (``Adam/1rs``),
    stage 2 (``Adam/2``) and stage 3 (Net127 under ZeroStage3)."""
    ranks = sorted(metrics, key=int)
    m0 = metrics[ranks[0]]
    return {"world_size": len(ranks), "numel": m0["numel"],
            "stages": {"1": [metrics[r]["stage12"]["Adam/1rs"]["held"] for r in ranks],
                       "2": [metrics[r]["stage12"]["Adam/2"]["held"] for r in ranks],
                       "3": [metrics[r]["stage3"]["net"]["held"] for r in ranks]}}


def draw(data: dict, lang: str):
    p, numel = data["world_size"], data["numel"]
    names = {"params": tr("fig_zero_params", lang), "grads": tr("fig_zero_grads", lang),
             "optimizer": tr("fig_zero_optimizer", lang)}
    rows = [(r, k) for r in range(p) for k in KINDS]
    fig = new_figure(10.5, 0.34 * len(rows) + 1.6)
    axes = fig.subplots(1, len(STAGES), sharey=True)
    for ax, stage in zip(axes, STAGES):
        for y, (r, kind) in enumerate(rows):
            ranges = data["stages"][stage][r][kind]
            ax.broken_barh([(a, b - a) for a, b in ranges], (y - 0.38, 0.76), facecolors=color(r),
                           alpha=(1.0, 0.7, 0.45)[KINDS.index(kind)], edgecolor="white", linewidth=0.6)
            ax.text(numel * 1.02, y, str(sum(b - a for a, b in ranges)), va="center", fontsize=7.5)
        ax.set_xlim(0, numel * 1.13)
        ax.set_xticks([0, numel])
        ax.set_title(tr("fig_zero_stage", lang, stage=stage), fontsize=9.5)
        ax.set_xlabel(tr("fig_zero_elements", lang), fontsize=8)
        for y in range(3, len(rows), 3):
            ax.axhline(y - 0.5, color="grey", linewidth=0.6)
        for side in ("top", "right"):
            ax.spines[side].set_visible(False)
    axes[0].set_yticks(range(len(rows)), [tr("fig_zero_row", lang, r=r, kind=names[k]) for r, k in rows])
    axes[0].set_ylim(len(rows) - 0.5, -0.5)
    axes[0].tick_params(axis="y", length=0)
    fig.suptitle(tr("fig_zero_title", lang, p=p, numel=numel), fontsize=10)
    fig.tight_layout()
    return fig
