"""Bench rows that launch a demo once and turn its report into ratios: launch overhead, gradient
compression, pipeline bubble and activations (moved here unchanged from the flat ``bench`` module)."""
from __future__ import annotations

import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from dtrain_lab.jobs.launch import PACKAGE_PARENT, launch

SCRIPT = Path(__file__).resolve().parent.parent / "demos" / "hello.py"


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)  # the agent, and the ranks it waited for
    return usage.ru_utime + usage.ru_stime


def _bare_torchrun(nproc: int) -> tuple[float, float]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([PACKAGE_PARENT, env.get("PYTHONPATH", "")])
    t0, c0 = time.perf_counter(), _children_cpu()
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
                    str(SCRIPT)], env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   timeout=300)
    return time.perf_counter() - t0, _children_cpu() - c0


def _ours(nproc: int, start: str | None) -> tuple[float, float]:
    t0, c0 = time.perf_counter(), _children_cpu()
    r = launch(str(SCRIPT), nproc=nproc, timeout=120, quiet=True, start=start)
    if not r.ok:
        raise RuntimeError(r.summary())
    return time.perf_counter() - t0, _children_cpu() - c0


def launch_overhead(repeats: int, nproc: int = 2) -> dict:
    """Wall and CPU seconds (the job's processes: agent and ranks) of ``dtrain_lab.launch`` of
    ``demos/hello.py`` against a bare ``torchrun`` of it, in alternating runs: with the ranks forked
    from the agent (``start="fork"``, the default without a CUDA GPU) and started as fresh Pythons
    (``"exec"``, torchrun's default)."""
    runs: dict[str, list[tuple[float, float]]] = {"bare": [], "fork": [], "exec": []}
    for _ in range(repeats):  # alternate, so that drifting machine load hits every variant alike
        runs["bare"].append(_bare_torchrun(nproc))
        runs["fork"].append(_ours(nproc, "fork"))
        runs["exec"].append(_ours(nproc, "exec"))
    wall = {k: statistics.median(w for w, _ in v) for k, v in runs.items()}
    cpu = {k: statistics.median(c for _, c in v) for k, v in runs.items()}
    return {"name": "launch_overhead", "bare_torchrun_s": wall["bare"], "dtrain_launch_s": wall["fork"],
            "ratio": wall["fork"] / wall["bare"], "exec_launch_s": wall["exec"], "exec_ratio": wall["exec"] / wall["bare"],
            "cpu_s": cpu, "cpu_ratio": cpu["fork"] / cpu["bare"], "exec_cpu_ratio": cpu["exec"] / cpu["bare"],
            "repeats": repeats, "nproc": nproc}


FLOOD = Path(__file__).resolve().parent / "flood.py"


def launch_output(repeats: int = 3, nproc: int = 2, lines: int = 20000) -> dict:
    """Wall seconds of a job whose ``nproc`` ranks print ``lines`` lines of 1 KiB each (40 MB at the
    defaults): ``dtrain_lab.launch`` (which tails every log, shows the first ``max_live_lines``, keeps
    the first ``max_output_lines``) against bare ``torchrun --redirects 3`` writing the same output to
    its log files, in alternating runs. What the launcher does per byte past its limits must stay cheap."""
    import tempfile

    runs: dict[str, list[float]] = {"bare": [], "ours": []}
    for _ in range(repeats):
        with tempfile.TemporaryDirectory() as logs:
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                            str(nproc), "--log-dir", logs, "--redirects", "3", str(FLOOD), str(lines)],
                           check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=600)
            runs["bare"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        r = launch(str(FLOOD), nproc=nproc, args=[lines], timeout=600, quiet=True)
        if not r.ok:
            raise RuntimeError(r.summary())
        runs["ours"].append(time.perf_counter() - t0)
    wall = {k: statistics.median(v) for k, v in runs.items()}
    return {"name": "launch_output", "bare_torchrun_s": wall["bare"], "dtrain_launch_s": wall["ours"],
            "ratio": wall["ours"] / wall["bare"], "megabytes": nproc * lines / 1024, "repeats": repeats,
            "nproc": nproc}


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
