"""Shared drawing pieces: a grid of labelled boxes (columns = steps, rows = ranks) and fixed colours."""
from __future__ import annotations

# colour-blind-safe (Okabe-Ito), one per chunk, block or shard; fixed so that a figure never changes
COLORS = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#999999")


def color(i: int) -> str:
    return COLORS[i % len(COLORS)]


def new_figure(width: float, height: float):
    """A figure that no pyplot state knows about (a notebook does not show it by itself)."""
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height))


def box(ax, x: float, y: float, text: str, fill: str, w: float = 0.9, h: float = 0.8, size: float = 8) -> None:
    """A filled box centred on (x, y) with white text."""
    from matplotlib.patches import FancyBboxPatch

    ax.add_patch(FancyBboxPatch((x - w / 2, y - h / 2), w, h, boxstyle="round,pad=0,rounding_size=0.08",
                                facecolor=fill, edgecolor="white", linewidth=1))
    ax.text(x, y, text, ha="center", va="center", fontsize=size, color="white")


def grid_axes(ax, cols: list[str], rows: list[str]) -> None:
    """Columns and rows labelled, no frame: the boxes carry the content."""
    ax.set_xlim(-0.5, len(cols) - 0.5)
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.set_xticks(range(len(cols)), cols)
    ax.set_yticks(range(len(rows)), rows)
    ax.xaxis.tick_top()
    ax.tick_params(length=0)
    for side in ("top", "right", "bottom", "left"):
        ax.spines[side].set_visible(False)
