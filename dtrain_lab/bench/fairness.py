"""Fairness between classmates graded side by side (issue 22, point 4): a correct lab 10 submission is
graded in a ``-j 2`` class run next to an honest classmate, then next to a hostile one
(``tests/submissions/redteam/hostile_neighbour.py``: 300 busy loops in sessions of their own, a fork
bomb, a memory hog). The row is the ratio of the correct submission's grading time next to the
hostile neighbour to its time next to the honest one; the target is at most 1.5. On 2 cores, "alone"
has both cores to itself, so the fair reference is a neighbour that uses its share.

Each job runs in a cgroup of its own where the machine gives the grader one (:mod:`dtrain_lab.sandbox.cgroup`):
CPU is then shared per job, not per process. Without one the row says so: the ratio is measured and
reported, and is expected to miss the target."""
from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HOSTILE = REPO / "tests" / "submissions" / "redteam" / "hostile_neighbour.py"
SOURCE = REPO / "solutions" / "_source" / "lab_10_deadlocks.md"


def _notebook(code: str) -> str:
    cell = {"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None,
            "source": "%%writefile lab10_rank_branch.py\n" + code}
    return json.dumps({"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": [cell]})


def solution() -> str:
    from dtrain_lab import authoring

    return authoring.lab_programs("lab10", SOURCE)["lab10.rank_branch"]["solution"]


def pair(neighbour: str, sandbox: bool | None = None) -> dict:
    """A ``-j 2`` class run of the correct submission ("alice") and ``neighbour``'s code ("mallory"):
    ``{"alice": (outcome, seconds), "mallory": (outcome, seconds), "wall": seconds}``."""
    from dtrain_lab.grading import classrun

    with tempfile.TemporaryDirectory(prefix="dtrain-fair-") as tmp:
        folder = Path(tmp) / "class"
        folder.mkdir()
        (folder / "alice.ipynb").write_text(_notebook(solution()))
        (folder / "mallory.ipynb").write_text(_notebook(neighbour))
        t0 = time.monotonic()
        results = classrun.run_class(folder, jobs=2, lang="en", sandbox=sandbox)
        out = {s["student"]: (s["verdicts"][0]["outcome"], s["elapsed"]) for s in results["submissions"]}
        out["wall"] = time.monotonic() - t0
        return out


def fairness_row(repeats: int = 1) -> dict:
    from dtrain_lab.sandbox import cgroup

    honest, hostile, verdicts = [], [], []
    for _ in range(repeats):
        a = pair(solution())
        # the neighbour keeps it up for 30 s here: longer than the classmate's grade can take
        b = pair(HOSTILE.read_text(encoding="utf-8").replace("HOLD_S = 5.0", "HOLD_S = 30.0"))
        honest.append(a["alice"][1])
        hostile.append(b["alice"][1])
        verdicts.append(b["alice"][0])
    ratio = min(hostile) / min(honest)
    return {"name": "fairness", "next_to_honest_s": min(honest), "next_to_hostile_s": min(hostile),
            "ratio": ratio, "target": 1.5, "met": ratio <= 1.5, "verdicts_next_to_hostile": verdicts,
            "cgroup": not cgroup.why_not(), "why_no_cgroup": cgroup.why_not(), "repeats": repeats}
