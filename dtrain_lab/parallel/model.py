"""Manual model parallelism: consecutive layers on consecutive ranks, activations passed by send/recv.

    torchrun --standalone --nproc-per-node 2 -m dtrain_lab.demos.mp_run

A model that does not fit on one device is cut into ``P`` consecutive parts (:func:`partition`); rank
``r`` keeps part ``r``. One training step:

* forward: rank 0 computes its part and ``send``s the activation to rank 1, which ``recv``s it,
  computes, sends on, …; the last rank computes the loss;
* backward: the last rank ``send``s ``∂L/∂(its input)`` back to rank ``P-2``, which continues
  backward through its part with ``out.backward(grad)``, and so on to rank 0;
* every rank then updates its own parameters: no gradient is ever communicated, only activations
  and their gradients.

Why only one rank works at a time: rank ``r + 1`` cannot start before rank ``r``'s activation arrives,
and rank ``r`` cannot run backward before rank ``r + 1``'s gradient comes back. With ``P`` ranks each
is idle about ``(P - 1)/P`` of the step: memory is divided by ``P``, time is not. Cutting the batch
into micro-batches so that rank 0 starts micro-batch 2 while rank 1 works on micro-batch 1 is
pipeline parallelism (GPipe, 1F1B: lesson 08, :mod:`dtrain_lab.parallel.pipeline`).

One process can also drive several GPUs itself (:class:`MultiDeviceModel`: part ``i`` on
``devices[i]``, ``.to(next_device)`` between parts, autograd crosses the devices by itself); it is
written for ``cuda:0, cuda:1, …`` and runs unchanged on ``["cpu", "cpu"]``.
"""
from __future__ import annotations

import copy
import time
from typing import Callable, Sequence

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from dtrain_lab import caps
from dtrain_lab.comm import groups
from dtrain_lab.comm.groups import Group
from dtrain_lab.i18n import LabError

__all__ = ["partition", "ModelParallelStage", "MultiDeviceModel", "timeline_chart",
           "busy_fraction"]


def partition(model: nn.Sequential | nn.Module, parts: int) -> list[nn.Sequential]:
    """Cut ``model`` (an ``nn.Sequential``, or a module with a ``layers`` Sequential such as
    :class:`dtrain_lab.models.MLP`) into ``parts`` consecutive pieces with about equal numbers of
    ``nn.Linear`` layers; an activation stays with the ``Linear`` before it. Deep copies: the
    pieces share nothing with ``model``."""
    seq = model if isinstance(model, nn.Sequential) else getattr(model, "layers", None)
    if not isinstance(seq, nn.Sequential):
        raise LabError("mp_not_sequential", kind=type(model).__name__)
    linear_at = [i for i, m in enumerate(seq) if isinstance(m, nn.Linear)]
    if parts < 1 or parts > len(linear_at):
        raise LabError("mp_bad_parts", parts=parts, linears=len(linear_at))
    # part p starts at its first Linear; the first part also takes anything before the first Linear
    firsts = [linear_at[(p * len(linear_at)) // parts] for p in range(parts)]
    bounds = [0] + firsts[1:] + [len(seq)]
    return [nn.Sequential(*[copy.deepcopy(seq[i]) for i in range(bounds[p], bounds[p + 1])]) for p in range(parts)]


def _in_width(part: nn.Sequential) -> int:
    return next(m for m in part if isinstance(m, nn.Linear)).in_features


class ModelParallelStage:
    """This rank's part of a model split over the ranks of ``group`` (rank ``r`` of the group runs
    part ``r``); :meth:`step` runs one forward and backward across all the ranks.

    Every rank calls ``step(x, y)`` with the same batch shape; only rank 0 reads ``x`` and only the
    last rank reads ``y``. ``timeline`` records, per step, this rank's busy intervals
    (``{"busy": [(phase, start_s, end_s), ...], "total": step_s, "t0": start}``, times from this
    rank's ``start``, a ``time.perf_counter()`` reading taken after a barrier); the rest of the step
    the rank waits in ``recv``. ``perf_counter`` is the system-wide monotonic clock on Linux, so the
    ``t0 + start_s`` of ranks on one machine can be compared.
    """

    def __init__(self, model: nn.Module, group: Group = None, loss_fn: Callable = F.mse_loss, device=None):
        self.group = group
        self.rank, self.world = groups.rank_size(group)
        parts = partition(model, self.world)
        self.device = torch.device(device or "cpu")
        self.part = parts[self.rank].to(self.device)
        self.in_width = _in_width(self.part)
        self.loss_fn = loss_fn
        self.timeline: list[dict] = []
        self.sent_bytes = 0

    def _peer(self, r: int) -> int:   # group rank -> global rank, for send/recv
        return groups.global_rank(self.group, r)

    def parameters(self):
        return self.part.parameters()

    def step(self, x: torch.Tensor, y: torch.Tensor) -> float | None:
        """Forward and backward of one batch; returns the loss on the last rank, ``None`` elsewhere."""
        first, last = self.rank == 0, self.rank == self.world - 1
        groups.barrier(self.group)
        t0, marks = time.perf_counter(), []

        def busy(phase, start):
            marks.append((phase, start - t0, time.perf_counter() - t0))

        # forward: receive the activation (or read x), compute, send it on
        if first:
            inp = x.to(self.device)
        else:
            inp = torch.empty(*x.shape[:-1], self.in_width, device=self.device)
            dist.recv(inp, src=self._peer(self.rank - 1))
            inp.requires_grad_(True)            # its gradient is what we send back
        s = time.perf_counter()
        out = self.part(inp)
        loss = self.loss_fn(out, y.to(self.device)) if last else None
        busy("forward", s)
        if not last:
            dist.send(out.detach().contiguous(), dst=self._peer(self.rank + 1))
            self.sent_bytes += out.numel() * out.element_size()
        # backward: start from the loss, or from the gradient the next rank sends back
        if last:
            s = time.perf_counter()
            loss.backward()
        else:
            grad = torch.empty_like(out)
            dist.recv(grad, src=self._peer(self.rank + 1))
            s = time.perf_counter()
            out.backward(grad)
        busy("backward", s)
        if not first:
            dist.send(inp.grad.contiguous(), dst=self._peer(self.rank - 1))
            self.sent_bytes += inp.grad.numel() * inp.grad.element_size()
        groups.barrier(self.group)
        self.timeline.append({"busy": marks, "total": time.perf_counter() - t0, "t0": t0})
        return loss.item() if last else None


class MultiDeviceModel(nn.Module):
    """Model parallelism inside one process: part ``i`` on ``devices[i]`` (``["cuda:0", "cuda:1"]``
    on a machine with 2 GPUs). The activation is moved with ``.to()`` between parts; autograd records
    the copy and moves the gradient back by itself, so no send/recv is written."""

    def __init__(self, model: nn.Module, devices: Sequence[str | torch.device]):
        super().__init__()
        devices = [torch.device(d) for d in devices]
        cuda = sorted({d.index or 0 for d in devices if d.type == "cuda"})
        if cuda:   # GPU path: checked here, never touched on a CPU machine
            have = caps.gpu_count()
            if cuda[-1] >= have:
                raise LabError("mp_missing_gpu", need=cuda[-1] + 1, have=have)
        self.devices = devices
        self.parts = nn.ModuleList(p.to(d) for p, d in zip(partition(model, len(devices)), devices))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for part, dev in zip(self.parts, self.devices):
            x = part(x.to(dev))   # on GPUs: a device-to-device copy (NVLink/PCIe)
        return x


def timeline_chart(timelines: list[list], step: int = -1, width: int = 60) -> str:
    """One text line per rank for one step: ``F`` forward, ``B`` backward, ``·`` waiting.

    ``timelines[r]`` is rank r's list of steps, each a list of ``(phase, start, end)`` readings of one
    clock shared by the ranks (what :mod:`dtrain_lab.demos.mp_run` reports as ``timeline``).
    """
    steps = [t[step] for t in timelines]
    t0 = min(s for busy in steps for _, s, _ in busy)
    t1 = max(e for busy in steps for _, _, e in busy)
    span = max(t1 - t0, 1e-12)
    lines = []
    for r, busy in enumerate(steps):
        row = ["·"] * width
        for phase, s, e in busy:
            a = int((s - t0) / span * width)
            b = max(a + 1, int(round((e - t0) / span * width)))
            for i in range(a, min(b, width)):
                row[i] = phase[0].upper()
        lines.append(f"rank {r} |{''.join(row)}|")
    return "\n".join(lines)


def busy_fraction(timelines: list[list]) -> list[float]:
    """Per rank: the share of the job's time (first start to last end of all steps, all ranks) spent
    computing its part."""
    t0 = min(s for t in timelines for busy in t for _, s, _ in busy)
    t1 = max(e for t in timelines for busy in t for _, _, e in busy)
    return [sum(e - s for busy in t for _, s, e in busy) / (t1 - t0) for t in timelines]
