"""How often lab 09's mid-checkpoint kill lands inside the checkpoint write (issue 22).

Grades a non-atomic save (tests/submissions/lab09/resume_not_atomic.py: it writes straight onto the
checkpoint's final name) in the scenario "rank 0 killed while writing its second checkpoint", N times,
without a sandbox so that the job's /shared folder is on this machine's disk. A run counts as landed
when the supervisor's own record says it killed rank 0 of the first attempt at the grader's mark in
torch.save, step 8's checkpoint holds 40-60 % of a whole checkpoint's bytes and does not load, and the
second attempt crashed on it. With ``--sandbox`` the file cannot be seen from outside (the sandbox's
/shared is a tmpfs): the supervisor's record and the torn-file crash are counted.

    python tools/measure_lab09_faults.py [-n 20] [--sandbox]
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ["DTRAIN_KEEP_GRADE_DIRS"] = "1"

import torch  # noqa: E402

from dtrain_lab.grading import grader, lab09, registry, runner  # noqa: E402
from dtrain_lab.grading.checks.lab09 import SCENARIOS  # noqa: E402


def one(sandbox: bool) -> tuple[bool, str]:
    ex = dataclasses.replace(registry.get("lab09.resume"), runs=(SCENARIOS[1],))
    v = grader._grade_launched(ex, ROOT / "tests" / "submissions" / "lab09" / "resume_not_atomic.py", "en", sandbox)
    job = runner._job_root() / v.details["runs"][0]["job"]
    try:
        status = runner._status(job)          # the supervisor's records, read as the grader reads them
        faults = [(s["attempt"], s["rank"], s["mark"]) for s in status if s["event"] == "fault"]
        if faults != [(0, 0, lab09.MARK_SAVE)]:
            return False, f"faults {faults}"
        if v.outcome != "crash":      # the second attempt failed to load the torn checkpoint
            return False, f"verdict {v.outcome}"
        if sandbox:
            return True, "killed at the mark; the next attempt crashed loading step 8"
        ckpt = job / "shared" / "checkpoints"
        whole, torn = (ckpt / "step_000004.pt").stat().st_size, (ckpt / "step_000008.pt").stat().st_size
        try:
            torch.load(ckpt / "step_000008.pt", weights_only=True)
            return False, "step 8 loads"
        except Exception:  # noqa: BLE001 - torn
            pass
        return 0.4 * whole < torn < 0.6 * whole, f"{torn} of {whole} bytes"
    finally:
        shutil.rmtree(job, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=20)
    ap.add_argument("--sandbox", action="store_true")
    args = ap.parse_args()
    landed = 0
    t0 = time.monotonic()
    for i in range(args.n):
        ok, why = one(args.sandbox)
        landed += ok
        print(f"run {i + 1:2d}: {'inside the write' if ok else 'MISSED'} ({why})", flush=True)
    print(f"{landed}/{args.n} kills landed inside the checkpoint write "
          f"({'sandbox' if args.sandbox else 'no sandbox'}, {os.cpu_count()} cores, {time.monotonic() - t0:.0f} s)")
    return 0 if landed == args.n else 1


if __name__ == "__main__":
    sys.exit(main())
