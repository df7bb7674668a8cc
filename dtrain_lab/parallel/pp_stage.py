"""The pipeline executor: a stage of a model on each rank, running a schedule's actions over send/recv.

:func:`split_sequential` cuts a model into stages; :class:`PipelineStage` is this rank's stage and
its neighbours; :func:`run_schedule` runs the actions of :func:`dtrain_lab.parallel.pp_schedule.schedule`
for one training step (``dist.recv``/``dist.isend`` between neighbour ranks), records when each
action computed and the activation bytes it kept; :func:`train_step` adds the optimizer step.
The overview is in :mod:`dtrain_lab.parallel.pipeline`.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist
import torch.nn as nn

from dtrain_lab.comm import groups
from dtrain_lab.comm.groups import Group
from dtrain_lab.i18n import LabError
from dtrain_lab.parallel.pp_schedule import Action, PipelineError, as_action, check_int, static_problems

__all__ = ["split_sequential", "PipelineStage", "run_schedule", "train_step"]


def split_sequential(model: nn.Module, num_stages: int) -> list[nn.Sequential]:
    """Cut an ``nn.Sequential`` (or a model with a ``.layers`` Sequential, e.g. ``models.MLP``) into
    ``num_stages`` consecutive ``nn.Sequential`` parts with as equal numbers of parametrised layers
    as possible; a parameter-free layer (ReLU) stays with the layer before it. The parts share the
    model's modules (no copy)."""
    p = check_int("num_stages", num_stages)
    seq = model if isinstance(model, nn.Sequential) else getattr(model, "layers", None)
    if not isinstance(seq, nn.Sequential):
        raise LabError("pp_not_sequential", type=type(model).__name__)
    units: list[list[nn.Module]] = []
    for child in seq:
        if units and not any(True for _ in child.parameters()):
            units[-1].append(child)
        else:
            units.append([child])
    if len(units) < p:
        raise LabError("pp_too_few_layers", layers=len(units), p=p)
    base, extra = divmod(len(units), p)
    parts, i = [], 0
    for s in range(p):
        n = base + (1 if s < extra else 0)
        parts.append(nn.Sequential(*[mod for unit in units[i:i + n] for mod in unit]))
        i += n
    return parts


_DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]
_HEADER = 10   # ndim, dtype code, up to 8 sizes


class PipelineStage:
    """One stage of a pipeline: ``module_part`` on this rank, which is stage ``stage_index`` of
    ``num_stages``; neighbours are the group's ranks ``stage_index ± 1`` (``group=None``: the world).
    With ``num_stages == 1`` no process group is needed: the schedule runs as plain local code."""

    def __init__(self, module_part: nn.Module, stage_index: int, num_stages: int, group: Group = None):
        self.module = module_part
        self.num_stages = check_int("num_stages", num_stages)
        if isinstance(stage_index, bool) or not isinstance(stage_index, int) or not 0 <= stage_index < num_stages:
            raise LabError("pp_bad_stage_index", index=stage_index, p=num_stages)
        self.stage_index = stage_index
        self.group = group
        self.is_first, self.is_last = stage_index == 0, stage_index == num_stages - 1
        param = next(iter(module_part.parameters()), None)
        self.device = param.device if param is not None else torch.device("cpu")
        self.prev_rank = self.next_rank = None
        if num_stages > 1:
            if not groups.initialized():
                raise LabError("pp_no_group", p=num_stages)
            me, size = groups.rank_size(group)
            if size != num_stages or me != stage_index:
                raise LabError("pp_group_mismatch", size=size, rank=me, index=stage_index, p=num_stages)
            if not self.is_first:
                self.prev_rank = groups.global_rank(group, stage_index - 1)
            if not self.is_last:
                self.next_rank = groups.global_rank(group, stage_index + 1)
        self.timeline: list[tuple[float, float, Action]] = []
        self.stats: dict[str, Any] = {}

    # communication: activations carry a small header (shape, dtype) so that any stage boundary works
    def _send_act(self, t: torch.Tensor, works: list) -> None:
        if t.dim() > _HEADER - 2 or t.dtype not in _DTYPES:
            raise LabError("pp_bad_activation", shape=tuple(t.shape), dtype=str(t.dtype))
        header = torch.zeros(_HEADER, dtype=torch.int64, device=self.device)
        header[0], header[1] = t.dim(), _DTYPES.index(t.dtype)
        header[2:2 + t.dim()] = torch.tensor(t.shape, dtype=torch.int64)
        t = t.detach().contiguous()
        for buf in (header, t):   # isend: never blocks; the tensors stay referenced until waited
            works.append((dist.isend(buf, self.next_rank, group=self.group), buf))

    def _recv_act(self) -> torch.Tensor:
        header = torch.empty(_HEADER, dtype=torch.int64, device=self.device)
        dist.recv(header, self.prev_rank, group=self.group)
        ndim, code = int(header[0]), int(header[1])
        x = torch.empty([int(v) for v in header[2:2 + ndim]], dtype=_DTYPES[code], device=self.device)
        dist.recv(x, self.prev_rank, group=self.group)
        return x


def _tensor_key(t: torch.Tensor) -> tuple:
    """Identity of a tensor's data: its storage, offset and shape (views of one batch, as the
    micro-batches of ``tensor_split``, are counted by their own bytes, not their storage's)."""
    try:
        ptr = t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):   # tensors without storage (wrapper subclasses)
        ptr = id(t)
    return (ptr, t.device, t.storage_offset(), tuple(t.shape), tuple(t.stride()))


def _stored_bytes(counter: dict, module: nn.Module, extra: torch.Tensor | None) -> int:
    """Activation bytes kept for one micro-batch: the tensors autograd saved for backward, each
    counted once, parameters (and views of them, e.g. ``weight.t()``) excluded, plus the stage output
    the executor keeps for ``backward(output, grad)``."""
    params = {(p.untyped_storage().data_ptr(), p.device) for p in module.parameters()}
    total = sum(n for key, n in counter.items() if (key[0], key[1]) not in params)
    if extra is not None and _tensor_key(extra) not in counter:
        total += extra.numel() * extra.element_size()
    return total


def run_schedule(stage: PipelineStage, actions: Sequence[Action], microbatches: Sequence[torch.Tensor] | None,
                 targets: Sequence[torch.Tensor] | None, loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                 ) -> dict:
    """Run this stage's ``actions`` (from :func:`schedule`) for one training step; gradients of all
    micro-batches accumulate in ``.grad`` (call the optimizer afterwards, see :func:`train_step`).

    ``microbatches`` are needed on the first stage, ``targets`` on the last (``None`` elsewhere).
    The last stage's loss of micro-batch ``i`` is ``loss_fn(out_i, target_i) * rows_i / rows``: for a
    mean-reducing loss the accumulated gradient is that of the whole batch's mean loss (with equal
    micro-batches, ``1/m`` — what ``torch.distributed.pipelining`` does with ``scale_grads=True``).

    F: receive the activation from the previous stage (``dist.recv``), compute, ``dist.isend`` the
    output to the next. B: receive the output's gradient from the next stage, backward,
    ``dist.isend`` the input's gradient to the previous. Sends are waited for at the end.
    Returns ``losses`` (last stage), ``timeline`` (``(start, end, Action)``, ``time.perf_counter``,
    computation only: waiting for a message is idle time), ``peak_in_flight``,
    ``peak_activation_bytes`` and ``activation_bytes`` (per micro-batch) actually kept.
    """
    acts = [as_action(a) for a in actions]
    m = 1 + max((a.microbatch for a in acts), default=-1)
    probs = static_problems([acts], 1, max(m, 1))
    if probs:
        raise PipelineError(probs)
    if stage.is_first and (microbatches is None or len(microbatches) != m):
        raise LabError("pp_need_inputs", what="microbatches", stage=stage.stage_index, m=m,
                       got=None if microbatches is None else len(microbatches))
    if stage.is_last and (targets is None or len(targets) != m):
        raise LabError("pp_need_inputs", what="targets", stage=stage.stage_index, m=m,
                       got=None if targets is None else len(targets))
    rows = sum(int(t.shape[0]) for t in targets) if stage.is_last else 0
    works: list = []
    inflight: dict[int, tuple] = {}
    live_bytes, peak_bytes, peak = 0, 0, 0
    per_mb_bytes: list[int] = [0] * m
    losses: list[float] = []
    timeline: list[tuple[float, float, Action]] = []
    try:
        for a in acts:
            i = a.microbatch
            if a.kind == "F":
                if stage.is_first:
                    x = microbatches[i].to(stage.device)
                else:
                    x = stage._recv_act().requires_grad_(True)
                saved: dict = {}

                def pack(t, saved=saved):
                    saved[_tensor_key(t)] = t.numel() * t.element_size()
                    return t

                t0 = time.perf_counter()
                with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                    y = stage.module(x)
                    if stage.is_last:
                        y = loss_fn(y, targets[i].to(stage.device)) * (int(targets[i].shape[0]) / rows)
                t1 = time.perf_counter()
                timeline.append((t0, t1, a))
                nbytes = _stored_bytes(saved, stage.module, None if stage.is_last else y)
                inflight[i] = (x, y)
                per_mb_bytes[i] = nbytes
                live_bytes += nbytes
                peak_bytes, peak = max(peak_bytes, live_bytes), max(peak, len(inflight))
                if stage.is_last:
                    losses.append(float(y.detach()) * rows / int(targets[i].shape[0]))
                else:
                    stage._send_act(y, works)
            else:
                x, y = inflight.pop(i)
                if stage.is_last:
                    t0 = time.perf_counter()
                    y.backward()
                else:
                    grad = torch.empty_like(y)
                    dist.recv(grad, stage.next_rank, group=stage.group)
                    t0 = time.perf_counter()
                    torch.autograd.backward(y, grad)
                t1 = time.perf_counter()
                timeline.append((t0, t1, a))
                live_bytes -= per_mb_bytes[i]
                if not stage.is_first:
                    g = x.grad.detach()
                    works.append((dist.isend(g, stage.prev_rank, group=stage.group), g))
                del x, y
    finally:
        for work, _ in works:
            work.wait()
    stage.timeline = timeline
    stage.stats = {"losses": losses, "timeline": timeline, "peak_in_flight": peak,
                   "peak_activation_bytes": peak_bytes, "activation_bytes": per_mb_bytes}
    return stage.stats


def train_step(stage: PipelineStage, actions: Sequence[Action], microbatches, targets, loss_fn,
               optimizer: torch.optim.Optimizer) -> dict:
    """``zero_grad`` → :func:`run_schedule` (all micro-batches) → one ``optimizer.step()``."""
    optimizer.zero_grad(set_to_none=True)
    stats = run_schedule(stage, actions, microbatches, targets, loss_fn)
    optimizer.step()
    return stats
