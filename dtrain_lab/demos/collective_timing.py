"""Timing of one collective on this machine: seconds per call, algbw and busbw (nccl-tests' terms).

Used by :mod:`dtrain_lab.demos.bandwidth` (a launch target) and the benchmarks; every rank of a
launched job calls :func:`measure_collective` with the same arguments.
"""
from __future__ import annotations

import time

import torch
import torch.distributed as dist

from dtrain_lab.comm import groups
from dtrain_lab.comm.collectives import naive_all_reduce, ring_all_reduce
from dtrain_lab.comm.groups import Group
from dtrain_lab.i18n import LabError
from dtrain_lab.perfmodel import bus_bandwidth

TIMED = ("all_reduce", "ring_all_reduce", "naive_all_reduce", "broadcast", "all_gather", "reduce_scatter")


def _sync(device) -> None:
    if torch.device(device).type == "cuda":  # GPU path: kernels are asynchronous
        torch.cuda.synchronize(device)


def _run_op(name: str, buf: torch.Tensor, out: torch.Tensor | None, group: Group) -> None:
    if name == "all_reduce":
        dist.all_reduce(buf, group=group)
    elif name == "ring_all_reduce":
        ring_all_reduce(buf, group=group)
    elif name == "naive_all_reduce":
        naive_all_reduce(buf, group=group)
    elif name == "broadcast":
        dist.broadcast(buf, src=groups.global_rank(group, 0), group=group)
    elif name == "all_gather":
        dist.all_gather_single(out, buf, group=group)
    else:
        dist.reduce_scatter_single(out, buf, group=group)


def measure_collective(name: str, nbytes: int, *, device="cpu", group: Group = None, min_time: float = 0.05,
                       max_iters: int = 50, warmup: int = 3, repeats: int = 3) -> dict:
    """Time one collective on a float32 buffer of ``nbytes`` (per rank; for all_gather/reduce_scatter
    ``nbytes`` is the whole gathered array, as nccl-tests counts it). Every rank must call it with the
    same arguments. Returns seconds per call (best of ``repeats`` averages, slowest rank) and
    algbw/busbw."""
    if name not in TIMED:
        raise LabError("comm_bad_choice", name="op", value=name, choices=", ".join(TIMED))
    p = groups.size(group)
    numel = max(p, nbytes // 4)
    numel -= numel % p  # all_gather/reduce_scatter need a multiple of p
    buf = torch.ones(numel, dtype=torch.float32, device=device)
    out = None
    if name == "all_gather":
        buf, out = buf[: numel // p].clone(), torch.empty(numel, dtype=torch.float32, device=device)
    elif name == "reduce_scatter":
        out = torch.empty(numel // p, dtype=torch.float32, device=device)
    for _ in range(warmup):
        _run_op(name, buf, out, group)
    # choose the iteration count on rank 0 and share it, so that every rank runs the same number
    groups.barrier(group)
    _sync(device)
    t = torch.tensor([0.0], device=device)   # NCCL groups serve CUDA tensors only
    start = time.perf_counter()
    _run_op(name, buf, out, group)
    _sync(device)
    one = time.perf_counter() - start
    iters = torch.tensor([min(max_iters, max(1, int(min_time / max(one, 1e-6))))], device=device)
    dist.broadcast(iters, src=groups.global_rank(group, 0), group=group)
    best = float("inf")
    for _ in range(repeats):  # best of a few repeats: the least disturbed by other processes
        groups.barrier(group)
        start = time.perf_counter()
        for _ in range(int(iters.item())):
            _run_op(name, buf, out, group)
        _sync(device)
        best = min(best, (time.perf_counter() - start) / int(iters.item()))
    t[0] = best
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    seconds = float(t.item())
    size = numel * 4
    algbw, busbw = bus_bandwidth(name.replace("ring_", "").replace("naive_", ""), size, seconds, p)
    return {"op": name, "bytes": size, "seconds": seconds, "iters": int(iters.item()),
            "algbw": algbw, "busbw": busbw}
