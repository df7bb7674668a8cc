"""Benchmarks: ratios against a reference measured in the same run, never absolute targets.

    python -m dtrain_lab.bench            # or: make bench
    python -m dtrain_lab.bench --quick    # fewer repeats, smaller messages

Rows (later lessons add theirs):

* ``launch_overhead``: wall time of ``dtrain_lab.launch`` / a bare ``torchrun`` of the same script
  (median of alternating repeats). What the launcher adds: stack-dump hooks, log tailing, clean-up.
* ``ring_vs_all_reduce``: our send/recv ring all-reduce / ``dist.all_reduce``, per message size.
* ``busbw``: bus bandwidth of ``dist.all_reduce`` against message size on this machine.
* ``ddp_step_time``: ``dtrain_lab.parallel.ddp.DDP`` step time / PyTorch ``DistributedDataParallel`` (same run).
* ``compression``: bytes sent and final loss of fp16, top-k (with and without error feedback) and
  PowerSGD, each divided by the uncompressed run's, same job, same seed (never timed).
* ``zero_memory``: counted per-rank model-state bytes (params + grads + Adam state, fp32, tensor
  bytes, not RSS) of FSDP2 on an MLP of 3.1 M parameters / ``perfmodel.zero_memory(stage=3, "fp32")``;
  with ``dtrain_lab.parallel.zero`` also its stages 1, 2 and 3 / the formula for that stage (never timed).

* ``pipeline_bubble``: measured idle fraction of 2 pipeline stages (GPipe and 1F1B, m = 1, 2, 4, 8;
  recorded per-stage timelines) / ``(p-1)/(m+p-1)``; ``pipeline_activations``: peak activation bytes
  kept by the executor, 1F1B / GPipe per stage, against ``min(p-s, m)/m``.

* ``restart_reliability``: clean resumes after one killed rank under ``torchrun --max-restarts 2``
  (``dtrain_lab.demos.recovery_restart_probe``: the job finishes, right result, after exactly one
  restart) out of N trials, for ``init_process_group`` as PyTorch does it, the same with
  ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``, and ``dtrain_lab.jobs.runtime`` (a key prefix per attempt);
  the modes alternate trial by trial. A race: counts, never times.

``--only NAME[,NAME]`` runs some rows (launch, collectives, ddp, compression, zero, pipeline, restarts).

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

from dtrain_lab.jobs.launch import PACKAGE_PARENT, launch
from dtrain_lab.perfmodel import human_bytes

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


COMPRESSION_LABELS = {"fp16": "fp16", "bf16": "bf16", "topk": "top-k + error feedback",
                      "topk_noef": "top-k, no error feedback", "powersgd": "PowerSGD + error feedback",
                      "powersgd_noef": "PowerSGD, no error feedback"}


def compression(steps: int = 200, nproc: int = 2, methods: str = "fp16,topk,topk_noef,powersgd",
                ratio: float = 0.01, rank: int = 1, start_iter: int = 10) -> dict:
    """Gradient compression against the uncompressed all-reduce, trained in the same job
    (``dtrain_lab.demos.compression_run``: same model, seed and data for every method). Per method:
    ``bytes_ratio`` (payload passed to collectives / uncompressed), ``wire_ratio`` (ring wire bytes /
    uncompressed), ``loss_ratio`` (final loss / uncompressed final loss). Counts, not times."""
    r = launch("dtrain_lab.demos.compression_run", nproc=nproc, timeout=600, quiet=True,
               args=["none," + methods, steps, f"ratio={ratio}", f"rank={rank}", f"start_iter={start_iter}"])
    if not r.ok:
        raise RuntimeError(r.summary())
    runs = r.metrics[0]["runs"]
    base = runs["none"]
    rows = []
    for name in methods.split(","):
        m = runs[name]
        rows.append({"method": name, "bytes_ratio": m["bytes"][-1] / base["bytes"][-1],
                     "wire_ratio": m["wire_bytes"][-1] / base["wire_bytes"][-1],
                     "loss_ratio": m["loss"][-1] / base["loss"][-1], "final_loss": m["loss"][-1],
                     "bytes": m["bytes"][-1]})
    return {"name": "compression", "nproc": nproc, "backend": r.metrics[0]["backend"], "steps": steps,
            "topk_ratio": ratio, "powersgd_rank": rank, "start_iter": start_iter, "params": base["params"],
            "none_final_loss": base["loss"][-1], "none_bytes": base["bytes"][-1], "methods": rows}


def zero_memory_row(nproc: int = 2) -> dict:
    """Measured / predicted model-state bytes per rank (``dtrain_lab.demos.fsdp_run memory,zero``):
    FSDP2 against ``zero_memory(stage=3, precision="fp32")``; ``dtrain_lab.parallel.zero``'s stages 1–3 too when
    that module works (else ``zero_note`` says why). ``ratio``: the largest |measured/predicted - 1|
    over ranks, as measured/predicted. Counts, not times."""
    r = launch("dtrain_lab.demos.fsdp_run", nproc=nproc, args=["memory,zero"], timeout=300, quiet=True)
    if not r.ok:
        raise RuntimeError(r.summary())

    def worst(values: list[float]) -> float:
        return max(values, key=lambda v: abs(v - 1))

    ms = [r.metrics[k] for k in sorted(r.metrics)]
    row = {"name": "zero_memory", "nproc": nproc, "backend": ms[0]["backend"],
           "num_params": ms[0]["memory"]["num_params"],
           "fsdp2": {"ratio": worst([m["memory"]["ratio"] for m in ms]),
                     "measured": [m["memory"]["measured_total"] for m in ms],
                     "predicted": ms[0]["memory"]["predicted"]["total"]}}
    if ms[0].get("zero_error"):
        row["zero_note"] = ms[0]["zero_error"]
    stages = {}
    for stage in ms[0].get("zero", {}):
        stages[stage] = {"ratio": worst([m["zero"][stage]["ratio"] for m in ms]),
                         "measured": [m["zero"][stage]["measured_total"] for m in ms],
                         "predicted": ms[0]["zero"][stage]["predicted"]["total"]}
    row["zero"] = stages
    return row


def pipeline_rows(nproc: int = 2, m: int = 4) -> tuple[dict, dict]:
    """Pipeline parallel (``dtrain_lab.demos.pp_run train,timing``, 2 stages; more stages than the
    machine has cores would time the OS scheduler). ``pipeline_bubble``: measured idle fraction
    (from the per-stage timelines the executor records; stages that sleep 20 ms forward / 40 ms
    backward) / ``(p-1)/(m+p-1)``, per schedule and m = 1, 2, 4, 8. ``pipeline_activations``:
    peak activation bytes the executor actually kept, 1F1B / GPipe, per stage, with m micro-batches
    (formula: min(p-s, m)/m). Ratios within one run."""
    from dtrain_lab.parallel.pipeline import idle_fraction

    r = launch("dtrain_lab.demos.pp_run", nproc=nproc, args=["train,timing", str(m)], timeout=300, quiet=True)
    if not r.ok:
        raise RuntimeError(r.summary())
    ms = [r.metrics[k] for k in sorted(r.metrics)]
    points = []
    for key, t in ms[0]["timing"].items():
        measured = idle_fraction([x["timing"][key]["timeline"] for x in ms])
        points.append({"schedule": key.split("_m")[0], "m": t["m"], "measured": measured,
                       "formula": t["formula"], "ratio": measured / t["formula"] if t["formula"] else None})
    bubble = {"name": "pipeline_bubble", "nproc": nproc, "backend": ms[0]["backend"], "points": points}
    stages = []
    for s, x in enumerate(ms):
        g, o = x["train"][f"gpipe_m{m}"], x["train"][f"1f1b_m{m}"]
        stages.append({"stage": s, "gpipe_bytes": g["peak_activation_bytes"], "1f1b_bytes": o["peak_activation_bytes"],
                       "ratio": o["peak_activation_bytes"] / g["peak_activation_bytes"],
                       "formula": min(nproc - s, m) / m})
    acts = {"name": "pipeline_activations", "nproc": nproc, "m": m, "stages": stages}
    return bubble, acts


RESTART_MODES = {
    "plain": (["plain"], {}),
    "plain + TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1": (["plain"], {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}),
    "dtrain_lab.jobs.runtime": (["runtime"], {}),
}


def restart_reliability(trials: int = 5, nproc: int = 2) -> dict:
    """Clean resumes out of ``trials`` per mode (see the module docstring), modes alternating."""
    counts = {m: {"clean": 0, "stale_keys_seen": 0, "outcomes": []} for m in RESTART_MODES}
    for _ in range(trials):
        for mode, (args, env) in RESTART_MODES.items():
            r = launch("dtrain_lab.demos.recovery_restart_probe", nproc=nproc, args=args, max_restarts=2,
                       timeout=60, quiet=True, env={"DTRAIN_PG_TIMEOUT": "10", **env})
            ms = list(r.metrics.values())
            clean = (r.ok and len(ms) == nproc and all(m.get("total") == float(nproc ** 4) for m in ms)
                     and all(m.get("attempt") == 1 for m in ms))
            c = counts[mode]
            c["clean"] += int(clean)
            c["stale_keys_seen"] += int(any(m.get("stale_keys") for m in ms))
            if clean:
                outcome = "clean"
            elif r.hung or not r.ok:
                outcome = "hang" if r.hung else "failed"
            else:
                outcome = "more restarts" if any(m.get("attempt") != 1 for m in ms) else "wrong result"
            c["outcomes"].append(outcome)
    base = counts["plain"]["clean"]
    return {"name": "restart_reliability", "trials": trials, "nproc": nproc, "modes": counts,
            "ratio": (counts["dtrain_lab.jobs.runtime"]["clean"] / base) if base else None}


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
        elif row["name"] == "compression":
            for m in row["methods"]:
                out.append(f"| {COMPRESSION_LABELS.get(m['method'], m['method'])}: bytes / uncompressed | "
                           f"{m['bytes_ratio']:.3g}× | final loss {m['loss_ratio']:.3g}× the uncompressed "
                           f"({m['final_loss']:.3g} vs {row['none_final_loss']:.3g}), {row['steps']} steps, "
                           f"{row['nproc']} ranks |")
        elif row["name"] == "zero_memory":
            f = row["fsdp2"]
            out.append(f"| FSDP2 model-state bytes / zero_memory(stage=3, fp32) | {f['ratio']:.4f}× | "
                       f"{human_bytes(max(f['measured']))} vs {human_bytes(f['predicted'])} per rank, "
                       f"{row['num_params']:,} params, {row['nproc']} ranks |")
            for stage, z in sorted(row.get("zero", {}).items()):
                out.append(f"| dtrain_lab.parallel.zero stage {stage} bytes / zero_memory(stage={stage}, fp32) | "
                           f"{z['ratio']:.4f}× | {human_bytes(max(z['measured']))} vs "
                           f"{human_bytes(z['predicted'])} per rank |")
            if row.get("zero_note"):
                out.append(f"| dtrain_lab.parallel.zero rows skipped | – | {row['zero_note']} |")
        elif row["name"] == "pipeline_bubble":
            for pt in row["points"]:
                out.append(f"| pipeline idle, measured / (p-1)/(m+p-1): {pt['schedule']}, m={pt['m']} | "
                           f"{pt['ratio']:.2f}× | {pt['measured']:.3f} vs {pt['formula']:.3f}, {row['nproc']} stages, "
                           f"sleeping stages, {row['backend']} |")
        elif row["name"] == "pipeline_activations":
            for st in row["stages"]:
                out.append(f"| pipeline peak activations 1F1B / GPipe, stage {st['stage']} | {st['ratio']:.3f}× | "
                           f"{st['1f1b_bytes']} B vs {st['gpipe_bytes']} B; min(p-s, m)/m = {st['formula']:.3f}, "
                           f"m={row['m']} |")
        elif row["name"] == "restart_reliability":
            for mode, c in row["modes"].items():
                out.append(f"| clean resumes after a killed rank: {mode} | {c['clean']}/{row['trials']} | "
                           f"old keys seen in {c['stale_keys_seen']}; {', '.join(c['outcomes'])} |")
        elif row["name"] == "busbw":
            for p in row["points"]:
                out.append(f"| busbw all_reduce {human_bytes(p['bytes'])} | {p['busbw_MBps']:.3g} MB/s | "
                           f"{p['seconds'] * 1e3:.3g} ms |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m dtrain_lab.bench")
    ap.add_argument("--quick", action="store_true", help="fewer repeats and smaller messages")
    ap.add_argument("--out", default="bench-results", help="folder for bench.json")
    ap.add_argument("--only", default="", help="comma-separated: launch, collectives, ddp, compression, zero, "
                                               "pipeline, restarts (default: all)")
    args = ap.parse_args(argv)
    repeats = 2 if args.quick else 5
    max_bytes = (1 << 20) if args.quick else (16 << 20)
    only = {x.strip() for x in args.only.split(",") if x.strip()}
    known = {"launch", "collectives", "ddp", "compression", "zero", "pipeline", "restarts"}
    if only - known:
        ap.error(f"unknown rows / 未知的测试项: {', '.join(sorted(only - known))} (known / 可选: {', '.join(sorted(known))})")

    def want(name: str) -> bool:
        return not only or name in only

    rows = []
    if want("launch"):
        rows.append(launch_overhead(repeats))
    if want("collectives"):
        rows.extend(collectives(max_bytes))
    if want("ddp"):
        from dtrain_lab.demos.ddp_step_time import bench_ddp

        rows.append(bench_ddp(repeats=2 if args.quick else 5))
    if want("compression"):
        rows.append(compression(steps=100 if args.quick else 200))
    if want("zero"):
        rows.append(zero_memory_row())
    if want("pipeline"):
        rows.extend(pipeline_rows())
    if want("restarts"):
        rows.append(restart_reliability(trials=3 if args.quick else 10))
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
