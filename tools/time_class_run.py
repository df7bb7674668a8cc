"""Wall time of a class run: N lab 10 notebooks graded by ``dtrain-lab grade FOLDER -j J``.

    .venv/bin/python tools/time_class_run.py --students 30 -j 2 [--exercises rank_branch send_send]

Each notebook holds the given lab 10 exercises, in turn the solution, a plausible wrong fix
(tests/submissions/lab10/) and the learner's untouched stub, so that the class has passes, failures and
refusals as a real one does. Prints the wall time, the launches (exercise x world size) it ran, the load
average before and after, and checks the outcomes (solutions pass, wrong fixes and stubs do not).
Not part of the test suite: a class takes minutes.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))


def main() -> int:
    from lab10_cases import PROGRAMS, WRONG

    from dtrain_lab.grading import registry

    ap = argparse.ArgumentParser()
    ap.add_argument("--students", type=int, default=30)
    ap.add_argument("-j", "--jobs", type=int, default=2)
    ap.add_argument("--exercises", nargs="+", default=["rank_branch"])
    args = ap.parse_args()
    kinds = ("solution", "wrong", "learner")
    with tempfile.TemporaryDirectory(prefix="dtrain-class-timing-") as tmp:
        folder, out = Path(tmp) / "class", Path(tmp) / "grades"
        folder.mkdir()
        expected = {}
        for s in range(args.students):
            kind = kinds[s % 3]
            cells = []
            for name in args.exercises:
                body = (WRONG / f"{name}_wrong.py").read_text() if kind == "wrong" else PROGRAMS[name][kind]
                cells.append({"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None,
                              "source": f"%%writefile lab10_{name}.py\n" + body})
            (folder / f"student{s:02d}.ipynb").write_text(json.dumps({"nbformat": 4, "nbformat_minor": 5,
                                                                      "metadata": {}, "cells": cells}))
            expected[f"student{s:02d}"] = kind
        launches = sum(len(registry.get(f"lab10.{n}").world_sizes) for n in args.exercises) * \
            sum(1 for k in expected.values() if k != "learner")
        load0 = os.getloadavg()
        t0 = time.monotonic()
        r = subprocess.run([sys.executable, "-m", "dtrain_lab.cli", "grade", str(folder), "-j", str(args.jobs),
                            "--out", str(out), "--lang", "en"], capture_output=True, text=True)
        wall = time.monotonic() - t0
        load1 = os.getloadavg()
        if r.returncode != 0:
            print(r.stdout[-3000:], r.stderr[-3000:])
            return 1
        results = json.loads((out / "results.json").read_text(encoding="utf-8"))
        bad = []
        for sub in results["submissions"]:
            for v in sub["verdicts"]:
                want_pass = expected[sub["student"]] == "solution"
                if (v["outcome"] == "pass") != want_pass:
                    bad.append((sub["student"], v["exercise"], v["outcome"], v["feedback"][:300]))
        print(f"{args.students} notebooks x {len(args.exercises)} lab 10 exercise(s), -j {args.jobs}: "
              f"{wall:.1f} s wall, {launches} launches (stubs are refused before launching), "
              f"{wall / args.students:.2f} s per notebook; load average {load0[0]:.1f} before, {load1[0]:.1f} after, "
              f"{os.cpu_count()} CPUs")
        for b in bad:
            print("UNEXPECTED", b)
        return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
