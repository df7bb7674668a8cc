"""Time several variants of a training step fairly, in one job: the piece ``ddp_step_time`` and
``dp_bucket_sweep`` share.

Timed blocks of ``steps`` steps alternate between the variants ``repeats`` times, so that a change of
load on the machine hits all of them alike. A block's time is the slowest rank's seconds per step
(an All-Reduce MAX: a data-parallel step is as slow as its slowest rank); a variant's time is the
median of its blocks.
"""
from __future__ import annotations

import statistics
import time
from typing import Callable, Iterable

import torch
import torch.distributed as dist
import torch.nn.functional as F

from dtrain_lab.parallel.ddp import naive_allreduce_grads


def mse_step(variants: dict, x: torch.Tensor, y: torch.Tensor) -> Callable[[str], None]:
    """``step(name)``: one SGD step of ``variants[name] = (net, optimizer)`` on MSE(net(x), y); the
    variant named ``naive`` all-reduces its gradients one parameter at a time after backward."""
    def step(name: str) -> None:
        net, opt = variants[name]
        opt.zero_grad(set_to_none=True)
        F.mse_loss(net(x), y).backward()
        if name == "naive":
            naive_allreduce_grads(net)
        opt.step()

    return step


def time_blocks(step: Callable[[str], None], names: Iterable[str], repeats: int, steps: int, warmup: int,
                device) -> tuple[dict[str, float], dict[str, list[float]]]:
    """``(median seconds per step, every block's seconds per step)`` of each variant ``name``;
    ``step(name)`` runs one step of it. ``warmup`` untimed steps each first (PyTorch's DDP rebuilds
    its buckets after its first step)."""
    names = list(names)
    cuda = torch.device(device).type == "cuda"
    for name in names:
        for _ in range(warmup):
            step(name)
    times: dict[str, list[float]] = {name: [] for name in names}
    t = torch.zeros(1, device=device)
    for _ in range(repeats):
        for name in names:
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(steps):
                step(name)
            if cuda:
                torch.cuda.synchronize()
            t[0] = (time.perf_counter() - t0) / steps
            dist.all_reduce(t, op=dist.ReduceOp.MAX)   # a step is as slow as the slowest rank
            times[name].append(float(t.item()))
    return {name: statistics.median(v) for name, v in times.items()}, times
