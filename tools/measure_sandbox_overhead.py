"""What the grader's sandbox costs per graded run: the same tiny job (world size 2, a run() that
returns at once, so the time is start-up and tear-down) with and without the sandbox, alternating,
the median of each. Prints the difference, the sandbox's overhead.

    .venv/bin/python tools/measure_sandbox_overhead.py [--repeat 5] [--world 2]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dtrain_lab import caps  # noqa: E402
from dtrain_lab.grading import channel, runner  # noqa: E402


def one(path: Path, world: int, sandboxed: bool) -> tuple[float, float]:
    spec = runner.JobSpec(exercise="tools.overhead", entry="run", submission=path, world_size=world, timeout=60,
                          inputs=[channel.encode({}) for _ in range(world)], sandboxed=sandboxed)
    t0 = time.monotonic()
    res = runner.run(spec)
    wall = time.monotonic() - t0
    if not res.ok:
        raise SystemExit(f"the job failed: {[(r.code, r.stderr[-500:]) for r in res.ranks]}")
    return wall, res.to_first_start or 0.0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--world", type=int, default=2)
    args = ap.parse_args()
    if not caps.sandbox_probe().ok:
        print(f"no sandbox on this machine: {caps.sandbox_probe().reason}")
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "noop.py"
        path.write_text("import torch.distributed as dist\n\n\ndef run():\n    dist.barrier()\n    return 1\n")
        one(path, args.world, True)          # warm the file cache once
        times = {True: [], False: []}
        starts = {True: [], False: []}
        for _ in range(args.repeat):
            for box in (True, False):
                wall, start = one(path, args.world, box)
                times[box].append(wall)
                starts[box].append(start)
    med = {k: statistics.median(v) for k, v in times.items()}
    first = {k: statistics.median(v) for k, v in starts.items()}
    print(f"world size {args.world}, {args.repeat} runs each, alternating (median seconds):")
    print(f"  sandboxed     whole job {med[True]:6.2f}   until the first rank's harness ran {first[True]:5.2f}")
    print(f"  --no-sandbox  whole job {med[False]:6.2f}   until the first rank's harness ran {first[False]:5.2f}")
    print(f"  overhead of the sandbox per run: {med[True] - med[False]:+.2f} s "
          f"(start-up {first[True] - first[False]:+.2f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
