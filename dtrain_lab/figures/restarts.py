"""Lesson 09: a training job killed twice and restarted by torchrun, from what its ranks recorded
(``recovery_train``'s reports): for each attempt, the checkpoint it found and loaded, the checkpoints
rank 0 saved, the rank that an injected fault killed and where, and how far the attempt got.

Stored, the figure holds the order of events only (steps, never times; a leftover temporary file is
named without its PID). The same run with its wall-clock times is :func:`plot_timeline`, live only."""
from __future__ import annotations

import re

from dtrain_lab.figures._grid import color, new_figure
from dtrain_lab.i18n import tr

RED, DARK = "#D55E00", "#4D4D4D"


def _events(reports: list[dict], kind: str) -> list[dict]:
    return [r[kind] for r in reports if kind in r]


def inputs(reports: dict) -> dict:
    """The figure's inputs from a launch's per-rank ``reports`` (``{rank: [report, ...]}``)."""
    ranks = sorted(reports, key=int)
    r0 = reports[ranks[0]]
    starts = [r for r in r0 if "attempt" in r and "resumed_from" in r]
    faults = {f["attempt"]: {k: f[k] for k in ("rank", "step", "where")}
              for rank in ranks for f in _events(reports[rank], "fault")}
    saved = _events(r0, "saved")
    total = max(p["step"] for rank in ranks for p in _events(reports[rank], "progress"))
    attempts = []
    for s in starts:
        a = s["attempt"]
        files = [re.sub(r"\.tmp\.\d+$", ".tmp.<pid>", f) for f in s["ckpt_files"] if f != "heartbeats"]
        fault = faults.get(a)
        attempts.append({"attempt": a, "resumed_from": s["resumed_from"], "files": files,
                         "saved": [e["step"] for e in saved if e["attempt"] == a],
                         "fault": fault, "end": fault["step"] if fault else total})
    return {"world_size": len(ranks), "steps": total, "attempts": attempts}


def draw(data: dict, lang: str):
    p, total, attempts = data["world_size"], data["steps"], data["attempts"]
    rows = [(a, r) for a in attempts for r in range(p)]
    fig = new_figure(10.5, 0.55 * len(rows) + 2.0)
    ax = fig.add_subplot()
    ax.set_xlim(-0.5, total + 3.6)
    ax.set_ylim(len(rows) - 0.4, -0.8)
    ax.set_yticks(range(len(rows)), [tr("fig_rs_row", lang, attempt=a["attempt"], r=r) for a, r in rows])
    ax.set_xticks(range(0, total + 1, 2))
    ax.tick_params(length=0)
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    for y, (a, r) in enumerate(rows):
        c = color(a["attempt"])
        start, end = a["resumed_from"], a["end"]
        ax.barh(y, max(end - start, 0.05), left=start, height=0.56, color=c, alpha=0.9)
        if r == 0:
            key = "fig_rs_loaded" if start else "fig_rs_fresh"
            ax.text(start + 0.15, y, tr(key, lang, step=start), ha="left", va="center", fontsize=7, color="white")
            for s in a["saved"]:
                ax.plot(s, y, marker="D", color="white", markeredgecolor="black", markersize=7)
        f = a["fault"]
        if f is not None and f["rank"] == r:
            ax.plot(end, y, marker="X", color=RED, markersize=11, markeredgecolor="white")
            key = "fig_rs_killed_ckpt" if f["where"] == "ckpt_rename" else "fig_rs_killed_step"
            ax.text(end + 0.35, y, tr(key, lang, step=f["step"]), va="center", fontsize=7.5, color=RED)
        elif f is not None:
            ax.text(end + 0.35, y, tr("fig_rs_stopped", lang), va="center", fontsize=7.5, color=DARK)
        else:
            ax.text(end + 0.35, y, tr("fig_rs_done", lang, step=end), va="center", fontsize=7.5, color=DARK)
        if r == p - 1 and y + 1 < len(rows):
            ax.axhline(y + 0.5, color="grey", linewidth=0.6)
            nxt = rows[y + 1][0]
            files = ", ".join(nxt["files"]) or "-"
            ax.text(total + 3.5, y + 0.5, tr("fig_rs_restart", lang, attempt=nxt["attempt"], files=files),
                    ha="right", va="center", fontsize=7, color=DARK,
                    bbox={"facecolor": "white", "edgecolor": "none", "pad": 1})
    ax.plot([], [], marker="D", color="white", markeredgecolor="black", linestyle="none", label=tr("fig_rs_saved", lang))
    ax.plot([], [], marker="X", color=RED, linestyle="none", label=tr("fig_rs_fault", lang))
    ax.legend(loc="upper right", fontsize=7.5, frameon=False)
    ax.set_xlabel(tr("fig_rs_xlabel", lang), fontsize=8.5)
    ax.set_title(tr("fig_rs_title", lang, p=p, n=len(attempts), k=sum(a["fault"] is not None for a in attempts)),
                 fontsize=10)
    fig.tight_layout()
    return fig


def plot_timeline(reports: dict):
    """The same run with its **measured** wall-clock times, live only: the step each rank reached
    over time in each attempt, the checkpoints saved and the faults, from the first start."""
    from dtrain_lab.viz import label, new_figure as live_figure

    fig, ax = live_figure(figsize=(8, 3.8))
    ranks = sorted(reports, key=int)
    t0 = min(r["started_at"] for rank in ranks for r in reports[rank] if "started_at" in r)
    for rank in ranks:
        reps = reports[rank]
        for a in sorted({p["attempt"] for p in _events(reps, "progress")}):
            pts = [(p["t"] - t0, p["step"]) for p in _events(reps, "progress") if p["attempt"] == a]
            ax.plot(*zip(*pts), color=color(a), linestyle="-" if int(rank) == 0 else "--", marker=".",
                    label=label("fig_rs_live_line", attempt=a, r=rank))
        for s in _events(reps, "saved"):
            ax.plot(s["t"] - t0, s["step"], marker="D", color="white", markeredgecolor="black", linestyle="none")
        for f in _events(reps, "fault"):
            ax.plot(f["t"] - t0, f["step"], marker="X", color=RED, markersize=10, linestyle="none")
    ax.set_xlabel(label("fig_rs_live_xlabel"))
    ax.set_ylabel(label("fig_rs_live_ylabel"))
    ax.set_title(label("fig_rs_live_title"), fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    return fig
