"""Lesson 10: where each rank of a hung job waits, from the stacks the launcher took when it stopped
the job (``LaunchResult.waiting``: one :class:`~dtrain_lab.jobs.diagnose.WaitSite` per rank).

Each rank is a row: the program's own frames from the demo's function inward (the function and the
statement it was executing), then the call it is blocked in. The same call has the same colour, so
ranks blocked in *different* collectives (diverged programs) stand out. Never times, PIDs or paths:
a frame is named by its function and its statement only."""
from __future__ import annotations

import linecache
import re

from dtrain_lab.figures._grid import box, color, new_figure
from dtrain_lab.i18n import tr

GREY = "#6E6E6E"


def _statement(file: str, line: int) -> str:
    """The source line a frame was executing, without indentation or a trailing comment."""
    return re.sub(r"\s+#.*$", "", linecache.getline(file, line).strip())


def inputs(waiting: dict, entry: str) -> dict:
    """The figure's inputs from a hung launch's ``waiting`` (rank -> WaitSite): for each rank, the
    program's frames from the function ``entry`` inward (torch's frames left out), and its call."""
    ranks = []
    for r in sorted(waiting):
        site = waiting[r]
        frames = list(site.frames)                              # innermost first
        outer = next((i for i, f in enumerate(frames) if f.func == entry), len(frames) - 1)
        own = [f for f in reversed(frames[:outer + 1]) if "/torch/" not in f.file and "<frozen" not in f.file]
        ranks.append({"rank": r, "call": site.call,
                      "stack": [{"func": f.func, "code": _statement(f.file, f.line)} for f in own]})
    return {"world_size": len(ranks), "entry": entry, "ranks": ranks}


def draw(data: dict, lang: str):
    ranks = data["ranks"]
    p = len(ranks)
    depth = max(len(r["stack"]) for r in ranks) + 1
    calls = sorted({r["call"] for r in ranks})
    fig = new_figure(max(7.0, 2.45 * depth + 1.2), 0.95 * p + 1.9)
    ax = fig.add_subplot()
    ax.set_xlim(-0.55, depth - 0.45)
    ax.set_ylim(p - 0.45, -0.55)
    ax.set_yticks(range(p), [tr("fig_rank", lang, r=r["rank"]) for r in ranks])
    ax.set_xticks([])
    ax.tick_params(length=0)
    for side in ("top", "right", "bottom", "left"):
        ax.spines[side].set_visible(False)
    for y, r in enumerate(ranks):
        for x, f in enumerate(r["stack"]):
            box(ax, x, y, tr("fig_hang_frame", lang, func=f["func"], code=f["code"]), GREY, w=0.92, h=0.7, size=7.5)
            ax.annotate("", xy=(x + 0.55, y), xytext=(x + 0.46, y),
                        arrowprops={"arrowstyle": "->", "color": "black", "lw": 0.9})
        x = len(r["stack"])
        box(ax, x, y, tr("fig_hang_call", lang, call=r["call"]), color(calls.index(r["call"])), w=0.92, h=0.7, size=8.5)
    verdict = "fig_hang_differ" if len(calls) > 1 else "fig_hang_same"
    ax.set_xlabel(tr(verdict, lang, calls=", ".join(calls)), fontsize=9)
    ax.set_title(tr("fig_hang_title", lang, p=p, entry=data["entry"]), fontsize=10)
    fig.tight_layout()
    return fig
