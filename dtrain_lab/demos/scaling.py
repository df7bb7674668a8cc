"""Strong scaling of data-parallel training, measured on this machine: speed-up and efficiency for 1 to
``p`` ranks against Amdahl's law and the α-β model.

    torchrun --standalone --nproc-per-node 4 -m dtrain_lab.demos.scaling

One job of ``p`` processes (one start-up instead of ``p``): the same global batch of ``GLOBAL_BATCH``
samples is trained with PyTorch's DDP by groups of 1, 2, …, ``p`` ranks (``new_group(range(k))``), each
rank of a group taking ``GLOBAL_BATCH / k`` samples; ranks outside the group wait at a barrier. The group
sizes alternate in blocks, so that a change of load on the machine falls on all of them alike; a
size's step time is the median over its blocks of the slowest rank's mean step.

Each rank computes with one thread (``torch.set_num_threads(1)``), so ``k`` ranks need ``k`` cores:
with fewer cores than ranks the processes take turns on them (oversubscription), and the table says so.

What the models need is measured in the same job: on 1 rank the forward+backward time (the part that
is split across ranks) and the rest of a step (optimizer, Python); on the group of 2, ``dist.all_reduce``
at several sizes, fitted to the α-β model (:func:`dtrain_lab.perfmodel.fit_collective`).
"""
from __future__ import annotations

import statistics
import sys
import time

import torch

# DDP's constructor imports torch._dynamo (seconds on a busy CPU): count it as start-up
import torch._dynamo  # noqa: F401
import torch.distributed as dist
import torch.nn.functional as F

from dtrain_lab import caps
from dtrain_lab import perfmodel
from dtrain_lab.i18n import tr
from dtrain_lab.jobs import runtime
from dtrain_lab.models import MLP

GLOBAL_BATCH = 192            # divisible by 1, 2, 3 and 4
D_IN, D_HIDDEN, D_OUT, DEPTH = 128, 512, 128, 3
FIT_SIZES = (64 << 10, 256 << 10, 1 << 20, 4 << 20)


def _model() -> MLP:
    return MLP(D_IN, D_HIDDEN, D_OUT, depth=DEPTH, seed=0)


def _batch(k: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(rank)
    per = GLOBAL_BATCH // k
    return torch.randn(per, D_IN, generator=g), torch.randn(per, D_OUT, generator=g)


def _slowest(seconds: float, group) -> float:
    t = torch.tensor([seconds])
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return float(t.item())


def _steps(ddp, opt, x, y, n: int) -> tuple[float, float]:
    """Mean seconds per step, and of its forward+backward part, over ``n`` steps."""
    fb = 0.0
    start = time.perf_counter()
    for _ in range(n):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        F.mse_loss(ddp(x), y).backward()
        fb += time.perf_counter() - t0
        opt.step()
    return (time.perf_counter() - start) / n, fb / n


def measure(max_ranks: int, blocks: int = 3, steps: int = 5, warmup: int = 2) -> dict:
    from torch.nn.parallel import DistributedDataParallel

    torch.set_num_threads(1)
    rt = runtime.current()
    sizes = list(range(1, max_ranks + 1))
    pgs = {k: dist.new_group(list(range(k))) for k in sizes}       # every rank creates every group
    jobs = {}
    for k in sizes:
        if rt.rank < k:
            model = _model()
            ddp = DistributedDataParallel(model, process_group=pgs[k])
            jobs[k] = (ddp, torch.optim.SGD(model.parameters(), lr=1e-3), *_batch(k, rt.rank))
            _steps(*jobs[k], warmup)                                 # warm-up, DDP's bucket rebuild
        dist.barrier()
    seen = {k: [] for k in sizes}
    fb_one = []
    for block in range(blocks):
        order = sizes[block % len(sizes):] + sizes[:block % len(sizes)]
        for k in order:
            if rt.rank < k:
                step, fb = _steps(*jobs[k], steps)
                seen[k].append(_slowest(step, pgs[k]))
                if k == 1:
                    fb_one.append(fb)
            dist.barrier()
    # α and β of this machine's all-reduce, on the group of 2 (if there is one)
    alpha = beta = None
    if max_ranks >= 2:
        times = []
        for nbytes in FIT_SIZES:
            if rt.rank < 2:
                buf = torch.zeros(nbytes // 4)
                for _ in range(2):
                    dist.all_reduce(buf, group=pgs[2])
                best = float("inf")
                for _ in range(3):
                    t0 = time.perf_counter()
                    for _ in range(3):
                        dist.all_reduce(buf, group=pgs[2])
                    best = min(best, _slowest((time.perf_counter() - t0) / 3, pgs[2]))
                times.append(best)
            dist.barrier()
        if rt.rank < 2:
            alpha, beta = perfmodel.fit_collective("all_reduce", list(FIT_SIZES), times, p=2)
    grad_bytes = sum(p.numel() * p.element_size() for p in _model().parameters())
    return {"step": {k: statistics.median(v) for k, v in seen.items() if v},
            "fb_one": statistics.median(fb_one) if fb_one else None, "alpha": alpha, "beta": beta,
            "grad_bytes": grad_bytes, "global_batch": GLOBAL_BATCH, "cores": _cores(), "threads": 1}


def _cores() -> int:
    return caps.cores()


def scaling_table(m: dict) -> list[dict]:
    """Rows for 1..p ranks from :func:`measure`'s report: measured step time, speed-up and efficiency;
    Amdahl's law with the parallel fraction measured on one rank; the α-β model (the serial part,
    the parallel part divided by k, plus one ring all-reduce of the gradients)."""
    step = {int(k): v for k, v in m["step"].items()}
    t1, fb1 = step[1], m["fb_one"]
    parallel = min(1.0, fb1 / t1)                  # the share of a one-rank step that splits
    rows = []
    for k in sorted(step):
        speedup = t1 / step[k]
        model = None
        if m["alpha"] is not None:
            comm = perfmodel.collective_time("all_reduce", m["grad_bytes"], k, m["alpha"], m["beta"])
            model = t1 / (t1 * (1 - parallel) + t1 * parallel / k + comm)
        rows.append({"ranks": k, "seconds": step[k], "speedup": speedup, "efficiency": speedup / k,
                     "amdahl": perfmodel.amdahl_speedup(parallel, k), "alpha_beta": model,
                     "oversubscribed": k > m["cores"]})
    return rows


def format_table(m: dict) -> str:
    """The table of :func:`scaling_table` in the learner's language."""
    out = [tr("scale_head")]
    for r in scaling_table(m):
        model = "—" if r["alpha_beta"] is None else f"{r['alpha_beta']:.2f}"
        note = tr("scale_oversubscribed", cores=m["cores"]) if r["oversubscribed"] else ""
        out.append(f"{r['ranks']:>5} {r['seconds'] * 1e3:>10.1f} {r['speedup']:>10.2f} {r['efficiency']:>10.0%}"
                   f" {r['amdahl']:>10.2f} {model:>10}  {note}".rstrip())
    return "\n".join(out)


def main() -> None:
    rt = runtime.current()
    m = measure(rt.world_size, **{a.split("=")[0]: int(a.split("=")[1]) for a in sys.argv[1:] if "=" in a})
    if rt.rank == 0:             # the timings are already the slowest rank's
        runtime.report(**m)


if __name__ == "__main__":
    runtime.entrypoint(main)
