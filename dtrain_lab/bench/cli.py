"""``python -m dtrain_lab.bench`` (``make bench``, ``dtrain-lab bench``): run the rows, write
``bench-results/bench.json``, print the table."""
from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

from dtrain_lab import caps
from dtrain_lab.bench.collectives import collectives
from dtrain_lab.bench.ddp_overlap import ddp_overlap_row
from dtrain_lab.bench.memory import zero_memory_row
from dtrain_lab.bench.plan_memory import plan_memory_row
from dtrain_lab.bench.restarts import restart_reliability
from dtrain_lab.bench.rows import compression, launch_output, launch_overhead, pipeline_rows
from dtrain_lab.bench.table import table
from dtrain_lab.i18n import tr

ROWS = ("launch", "output", "collectives", "ddp", "compression", "zero", "pipeline", "plan", "restarts", "fairness")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m dtrain_lab.bench")
    ap.add_argument("--quick", action="store_true", help=tr("bench_quick_help"))
    ap.add_argument("--out", default="bench-results", help=tr("bench_out_help"))
    ap.add_argument("--only", default="", help=tr("cli_bench_only_help"))
    args = ap.parse_args(argv)
    repeats = 2 if args.quick else 5
    max_bytes = (1 << 20) if args.quick else (16 << 20)
    only = {x.strip() for x in args.only.split(",") if x.strip()}
    if only - set(ROWS):
        ap.error(tr("bench_unknown_rows", rows=", ".join(sorted(only - set(ROWS))), known=", ".join(ROWS)))

    def want(name: str) -> bool:
        return not only or name in only

    rows = []
    if want("launch"):
        rows.append(launch_overhead(repeats))
    if want("output"):
        rows.append(launch_output(2 if args.quick else 3))
    if want("collectives"):
        rows.extend(collectives(max_bytes, repeats=3 if args.quick else 7))
    if want("ddp"):
        from dtrain_lab.demos.ddp_step_time import bench_ddp

        rows.append(bench_ddp(repeats=repeats))
        rows.append(ddp_overlap_row(repeats=3 if args.quick else 7))
    if want("compression"):
        rows.append(compression(steps=100 if args.quick else 200))
    if want("zero"):
        rows.append(zero_memory_row())
    if want("pipeline"):
        rows.extend(pipeline_rows())
    if want("plan"):
        rows.append(plan_memory_row())
    if want("restarts"):
        rows.append(restart_reliability(trials=3 if args.quick else 10))
    if want("fairness"):
        from dtrain_lab.bench.fairness import fairness_row

        rows.append(fairness_row(repeats=1 if args.quick else 3))
    import torch

    meta = {"python": platform.python_version(), "platform": platform.platform(), "cpus": caps.cores(),
            "time": time.strftime("%Y-%m-%dT%H:%M:%S"), "torch": torch.__version__}
    Path(args.out).mkdir(parents=True, exist_ok=True)
    path = Path(args.out) / "bench.json"
    path.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    print(table(rows))
    print("\n" + tr("bench_wrote", path=str(path)))
    return 0
