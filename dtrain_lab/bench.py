"""Benchmarks: ratios against a reference measured in the same run, never absolute targets.

    python -m dtrain_lab.bench            # or: make bench
    python -m dtrain_lab.bench --quick    # fewer repeats, smaller messages

Rows (later lessons add theirs):

* ``launch_overhead``: wall time of ``dtrain_lab.launch`` / a bare ``torchrun`` of the same script
  (median of alternating repeats). What the launcher adds: stack-dump hooks, log tailing, clean-up.
* ``ring_vs_all_reduce``: our send/recv ring all-reduce / ``dist.all_reduce``, per message size.
* ``busbw``: bus bandwidth of ``dist.all_reduce`` against message size on this machine.
* ``ddp_step_time``: ``dtrain_lab.ddp.DDP`` step time / PyTorch ``DistributedDataParallel`` (same run).

Writes ``bench-results/bench.json`` and prints a table. CPU/gloo figures here say nothing about
NCCL on GPUs.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

from .launch import PACKAGE_PARENT, launch
from .perfmodel import human_bytes

SCRIPT = Path(__file__).resolve().parent / "demos" / "hello.py"


def _bare_torchrun(nproc: int) -> float:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([PACKAGE_PARENT, env.get("PYTHONPATH", "")])
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
                    str(SCRIPT)], env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   timeout=300)
    return time.perf_counter() - t0


def _ours(nproc: int) -> float:
    t0 = time.perf_counter()
    r = launch(str(SCRIPT), nproc=nproc, timeout=120, quiet=True)
    if not r.ok:
        raise RuntimeError(r.summary())
    return time.perf_counter() - t0


def launch_overhead(repeats: int, nproc: int = 2) -> dict:
    bare, ours = [], []
    for _ in range(repeats):  # alternate, so that drifting machine load hits both alike
        bare.append(_bare_torchrun(nproc))
        ours.append(_ours(nproc))
    b, o = statistics.median(bare), statistics.median(ours)
    return {"name": "launch_overhead", "bare_torchrun_s": b, "dtrain_launch_s": o, "ratio": o / b,
            "repeats": repeats, "nproc": nproc}


def collectives(max_bytes: int, nproc: int = 2) -> tuple[dict, dict]:
    r = launch("dtrain_lab.demos.bandwidth", nproc=nproc, args=[max_bytes, "all_reduce,ring_all_reduce"],
               timeout=600, quiet=True)
    if not r.ok:
        raise RuntimeError(r.summary())
    rows = r.metrics[0]["rows"]
    ref = {x["bytes"]: x for x in rows if x["op"] == "all_reduce"}
    ring = {x["bytes"]: x for x in rows if x["op"] == "ring_all_reduce"}
    per_size = [{"bytes": n, "ring_s": ring[n]["seconds"], "all_reduce_s": ref[n]["seconds"],
                 "ratio": ring[n]["seconds"] / ref[n]["seconds"]} for n in sorted(ref)]
    geo = math.exp(statistics.mean(math.log(p["ratio"]) for p in per_size))
    ratio_row = {"name": "ring_vs_all_reduce", "ratio": geo, "per_size": per_size, "nproc": nproc,
                 "backend": r.metrics[0]["backend"]}
    bw_row = {"name": "busbw", "backend": r.metrics[0]["backend"], "nproc": nproc,
              "points": [{"bytes": n, "busbw_MBps": ref[n]["busbw"] / 1e6, "seconds": ref[n]["seconds"]}
                         for n in sorted(ref)]}
    return ratio_row, bw_row


def table(rows: list[dict]) -> str:
    out = ["| row | value | detail |", "|---|---|---|"]
    for row in rows:
        if row["name"] == "launch_overhead":
            out.append(f"| launch overhead (dtrain_lab.launch / bare torchrun) | {row['ratio']:.2f}× | "
                       f"{row['dtrain_launch_s']:.2f} s vs {row['bare_torchrun_s']:.2f} s, median of {row['repeats']} |")
        elif row["name"] == "ring_vs_all_reduce":
            out.append(f"| ring all-reduce / dist.all_reduce (geo. mean) | {row['ratio']:.2f}× | "
                       f"{row['nproc']} ranks, {row['backend']} |")
            for p in row["per_size"]:
                out.append(f"|   {human_bytes(p['bytes'])} | {p['ratio']:.2f}× | "
                           f"{p['ring_s'] * 1e3:.3g} ms vs {p['all_reduce_s'] * 1e3:.3g} ms |")
        elif row["name"] == "ddp_step_time":
            out.append(f"| dtrain_lab DDP / PyTorch DDP step time | {row['ratio']:.2f}× | "
                       f"{row['ours_s'] * 1e3:.3g} ms vs {row['torch_s'] * 1e3:.3g} ms; naive per-parameter "
                       f"{row['naive_ratio']:.2f}×, no overlap {row['no_overlap_ratio']:.2f}× |")
        elif row["name"] == "busbw":
            for p in row["points"]:
                out.append(f"| busbw all_reduce {human_bytes(p['bytes'])} | {p['busbw_MBps']:.3g} MB/s | "
                           f"{p['seconds'] * 1e3:.3g} ms |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m dtrain_lab.bench")
    ap.add_argument("--quick", action="store_true", help="fewer repeats and smaller messages")
    ap.add_argument("--out", default="bench-results", help="folder for bench.json")
    args = ap.parse_args(argv)
    repeats = 2 if args.quick else 5
    max_bytes = (1 << 20) if args.quick else (16 << 20)
    rows = [launch_overhead(repeats)]
    rows.extend(collectives(max_bytes))
    from .ddp import bench_ddp

    rows.append(bench_ddp(repeats=2 if args.quick else 5))
    meta = {"python": platform.python_version(), "platform": platform.platform(), "cpus": os.cpu_count(),
            "time": time.strftime("%Y-%m-%dT%H:%M:%S")}
    try:
        import torch

        meta["torch"] = torch.__version__
    except ImportError:  # pragma: no cover
        pass
    Path(args.out).mkdir(parents=True, exist_ok=True)
    path = Path(args.out) / "bench.json"
    path.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    print(table(rows))
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
