"""CPU seconds and wall time to grade one lab 10 notebook with every exercise solved, in a fresh process,
as a learner's check() cells or a class-run worker would (issues 21 and 22). The whole process tree's
CPU is counted (os.wait4 on the grading process: every descendant it, its servers and their
supervisors waited for).

    .venv/bin/python tools/measure_grade_cpu.py [--repo PATH] [--repeat 3] [--no-sandbox]

``--repo`` grades with the dtrain_lab of another checkout (e.g. a git worktree of an older commit),
with this Python: the same machine, the same notebook, another grader.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

CHILD = """
import json, sys
from dtrain_lab.grading import grade_notebook
vs = grade_notebook(sys.argv[1], lang="en", sandbox=sys.argv[2] == "1")
vs = vs if isinstance(vs, list) else list(vs.values()) if isinstance(vs, dict) else [vs]
print(json.dumps([[getattr(v, "exercise", "?"), getattr(v, "outcome", "?"), round(getattr(v, "elapsed", 0) or 0, 2)]
                  for v in vs]))
"""


def notebook(path: Path) -> None:
    from lab10_cases import PROGRAMS

    cells = [{"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None,
              "source": f"%%writefile lab10_{name}.py\n" + p["solution"]} for name, p in sorted(PROGRAMS.items())]
    path.write_text(json.dumps({"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": cells}))


def _children_cpu() -> float:
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def one(repo: Path, nb: Path, sandbox: bool) -> tuple[float, float, list]:
    """This process is a child subreaper: the servers the grading process leaves behind when it exits
    are re-parented here and reaped, so that their CPU (and their reaped children's: supervisors,
    ranks) is counted too."""
    from dtrain_lab.sandbox import contain

    contain.subreaper(True)
    env = dict(os.environ, PYTHONPATH=str(repo))
    c0, t0 = _children_cpu(), time.monotonic()
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(nb), "1" if sandbox else "0"], env=env, cwd=str(repo),
                            stdout=subprocess.PIPE, text=True)
    out = proc.stdout.read()
    proc.wait()
    wall = time.monotonic() - t0
    while True:   # the servers end when their client's stdin closes; reap everything left
        try:
            os.wait()
        except ChildProcessError:
            break
    try:
        outcomes = json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        outcomes = [["?", f"exit {proc.returncode}"]]
    return _children_cpu() - c0, wall, outcomes


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repo", default=str(ROOT))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--no-sandbox", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="dtrain-grade-cpu-") as tmp:
        nb = Path(tmp) / "lab_10_deadlocks.ipynb"
        notebook(nb)
        cpus, walls = [], []
        for i in range(args.repeat):
            cpu, wall, outcomes = one(Path(args.repo), nb, not args.no_sandbox)
            cpus.append(cpu)
            walls.append(wall)
            print(f"run {i + 1}: {cpu:.1f} CPU s, {wall:.1f} s wall; {outcomes}", flush=True)
    print(f"median of {args.repeat}: {statistics.median(cpus):.1f} CPU s, {statistics.median(walls):.1f} s wall "
          f"({args.repo}, {'no sandbox' if args.no_sandbox else 'sandbox'}, {os.cpu_count()} cores)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
