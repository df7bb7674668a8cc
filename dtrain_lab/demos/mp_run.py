"""Lesson 07 §1: manual model parallelism, checked against training the unsplit model.

    torchrun --standalone --nproc-per-node 2 -m dtrain_lab.demos.mp_run [steps] [d_hidden] [batch]

``MLP(16, d_hidden, 4, depth=3, seed=0)`` (four Linear layers) is cut into one part per rank
(:func:`dtrain_lab.parallel.model.partition`) and trained with SGD for ``steps`` steps on global
batches of ``regression_dataset(seed=0)``; activations go forward rank → rank+1 with ``dist.send``,
their gradients come back with ``dist.send`` too. Every rank also trains the whole model alone on
the same batches (it is tiny) and compares its part's parameters with the same layers of that
reference, and the in-process multi-device version (:class:`MultiDeviceModel` on ``["cpu"] * P``, or
on ``cuda:0 … cuda:P-1`` when one process sees that many GPUs). Each rank reports its busy intervals
per step (``time.perf_counter()`` readings, comparable across the ranks of one machine): the lesson
draws them to show the idle ranks.
"""
from __future__ import annotations

import sys
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from dtrain_lab import caps
from dtrain_lab.comm import groups
from dtrain_lab.comm.groups import Group
from dtrain_lab.data import global_batch, regression_dataset
from dtrain_lab.jobs import runtime
from dtrain_lab.models import MLP
from dtrain_lab.parallel.model import ModelParallelStage, MultiDeviceModel, partition

LR = 0.05


def train_model_parallel(model: nn.Module, batches, lr: float = 0.1, group: Group = None,
                         loss_fn: Callable = F.mse_loss, device=None) -> dict:
    """Train ``model`` split over the ranks of ``group`` with SGD on ``batches`` (an iterable of
    ``(x, y)``, the same on every rank); returns this rank's ``stage``, the ``losses`` (last rank)
    and its final part's parameters. With one rank it is ordinary training."""
    stage = ModelParallelStage(model, group, loss_fn, device)
    opt = torch.optim.SGD(stage.parameters(), lr=lr)
    losses = []
    for x, y in batches:
        opt.zero_grad(set_to_none=True)
        loss = stage.step(x, y)
        opt.step()                     # each rank updates only the layers it holds
        if loss is not None:
            losses.append(loss)
    return {"stage": stage, "losses": losses, "params": [p.detach().clone() for p in stage.parameters()]}


def reference(model, batches, lr):
    """Single-process SGD on the whole model: the parameters and losses model parallelism must match."""
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for x, y in batches:
        opt.zero_grad(set_to_none=True)
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def _cmp(a: list, b: list) -> dict:
    diffs = [(x - y).abs().max().item() for x, y in zip(a, b)]
    return {"equal": len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b)),
            "max_abs_diff": max(diffs) if diffs else 0.0, "count": len(a)}


def facts(steps: int = 5, d_hidden: int = 32, batch: int = 16, device="cpu") -> dict:
    rank, world = groups.rank_size()
    data = regression_dataset(n=256, d_in=16, d_out=4, seed=0)
    batches = [tuple(t.to(device) for t in global_batch(data, s, batch)) for s in range(steps)]
    make = lambda: MLP(16, d_hidden, 4, depth=3, seed=0)   # noqa: E731  same weights on every rank

    run = train_model_parallel(make(), batches, lr=LR, device=device)
    stage = run["stage"]
    ref_model = make().to(device)
    ref_losses = reference(ref_model, batches, LR)
    ref_part = partition(ref_model, world)[rank]          # the same layers, trained unsplit
    ref_params = [p.detach() for p in ref_part.parameters()]

    # the same model in one process, part i on devices[i]
    gpus = caps.gpu_count()
    on_gpu = torch.device(device).type == "cuda"
    devices = [f"cuda:{i}" for i in range(world)] if on_gpu and gpus >= world > 1 else ["cpu"] * world
    md = MultiDeviceModel(make(), devices)
    md_losses = reference(md, [(x.to(devices[0]), y.to(devices[-1])) for x, y in batches], LR)
    md_params = [p.detach().to(device) for p in md.parts[rank].parameters()]

    # absolute perf_counter readings: one clock for every process of this machine
    busy = [[(ph, t["t0"] + s, t["t0"] + e) for ph, s, e in t["busy"]] for t in stage.timeline]
    return {
        "rank": rank, "world": world, "steps": steps, "d_hidden": d_hidden, "batch": batch,
        "part": [type(m).__name__ + (f"({m.in_features}->{m.out_features})" if hasattr(m, "in_features") else "")
                 for m in stage.part],
        "part_params": sum(p.numel() for p in stage.part.parameters()),
        "full_params": sum(p.numel() for p in make().parameters()),
        "params_vs_single": _cmp(run["params"], ref_params),
        "losses": run["losses"], "ref_losses": ref_losses,
        "multi_device": {"devices": devices, "losses": md_losses, "params_vs_single": _cmp(md_params, ref_params)},
        "sent_bytes": stage.sent_bytes, "in_width": stage.in_width,
        "timeline": busy, "step_s": [t["total"] for t in stage.timeline],
    }


def main() -> None:
    args = [int(a) for a in sys.argv[1:]]
    steps, d_hidden, batch = (args + [5, 32, 16][len(args):])[:3]
    if not caps.have("cuda"):
        torch.set_num_threads(1)
    rt = runtime.current()
    runtime.report(backend=rt.backend, device=str(rt.device), **facts(steps, d_hidden, batch, rt.device))


if __name__ == "__main__":
    runtime.entrypoint(main)
