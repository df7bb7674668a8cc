"""Gradient accumulation, and the communication that ``no_sync`` saves under data parallelism.

The effective (global) batch of one optimizer step is::

    B = b × k × W        micro-batch b samples, k accumulation steps, W data-parallel ranks

One optimizer step over k micro-batches of b samples on each of W ranks computes the gradient of the
mean loss over all B samples — the same as one step on one process over a batch of B — when

1. each micro-batch loss is a *mean* over its b samples and is **divided by k** before ``backward``:
   ``backward`` adds into ``.grad``, so the k scaled gradients sum to the mean over b·k samples, and
   DDP's average over W ranks makes it the mean over B. Without the division the gradient is k times
   too large (with SGD, a learning rate k times too large);
2. the micro-batches (and the ranks' shards) are of equal size, else each needs its own weight;
3. no layer depends on which samples share a batch: BatchNorm's batch statistics are computed per
   micro-batch, so a model with BatchNorm is *not* equal to its large-batch version.

Under DDP every backward outside ``no_sync()`` all-reduces the (accumulated) gradients. Wrapping the
first k-1 micro-batches — their forward *and* backward: DDP decides at forward time — in
``model.no_sync()`` accumulates locally and all-reduces once, at the k-th backward: 1 all-reduce per
bucket and optimizer step instead of k. Both give the same parameters (the all-reduce is linear).

:class:`AllReduceCounter` with :func:`counting_allreduce_hook` counts what PyTorch's
``DistributedDataParallel`` all-reduces, through its public communication-hook API
(``ddp.register_comm_hook(state, hook)``), instead of patching ``torch.distributed``.
"""
# No ``from __future__ import annotations`` here: PyTorch DDP compares a hook's return annotation
# with ``torch.futures.Future[torch.Tensor]`` and rejects the string a postponed annotation would be.
import contextlib
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch
import torch.distributed as dist

from dtrain_lab.comm import groups
from dtrain_lab.comm.groups import Group
from dtrain_lab.i18n import LabError

__all__ = ["micro_batches", "accumulation_step", "AllReduceCounter", "counting_allreduce_hook"]


def micro_batches(batch: Sequence[torch.Tensor], k: int) -> list[tuple[torch.Tensor, ...]]:
    """Split a batch ``(x, y, ...)`` into ``k`` micro-batches of equal size (condition 2 above)."""
    n = batch[0].shape[0]
    if isinstance(k, bool) or not isinstance(k, int) or k < 1 or n % k:
        raise LabError("accum_uneven", n=n, k=k)
    return list(zip(*(t.chunk(k) for t in batch)))


def accumulation_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                      micro: Sequence[tuple[torch.Tensor, ...]], loss_fn: Callable, *,
                      divide: bool = True, use_no_sync: bool = True,
                      autocast_dtype: torch.dtype | None = None, scaler=None) -> float:
    """One optimizer step over the micro-batches ``micro`` (each a tuple ``(x, y)``).

    * ``divide``: divide each micro-batch's mean loss by ``k = len(micro)`` (the correct choice;
      ``False`` is the bug the lesson shows).
    * ``use_no_sync``: if ``model`` has ``no_sync()`` (DDP, ours or PyTorch's), run the first k-1
      micro-batches inside it so that only the last backward all-reduces.
    * ``autocast_dtype``: run forward and loss under ``torch.autocast(device_type, dtype)``.
    * ``scaler``: a ``torch.amp.GradScaler``: each micro-batch's loss is scaled before backward, and
      ``scaler.step``/``scaler.update`` run **once** per optimizer step, after the last micro-batch.

    Returns the mean of the micro-batches' (unscaled, undivided) losses on this rank.
    """
    k = len(micro)
    optimizer.zero_grad(set_to_none=True)
    device_type = next(model.parameters()).device.type
    losses = []
    for i, (x, y) in enumerate(micro):
        last = i == k - 1
        quiet = use_no_sync and not last and hasattr(model, "no_sync")
        with model.no_sync() if quiet else contextlib.nullcontext():  # forward *and* backward inside
            with torch.autocast(device_type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
                loss = loss_fn(model(x), y)
            losses.append(loss.detach().float())
            contribution = loss / k if divide else loss
            if scaler is not None:
                contribution = scaler.scale(contribution)
            contribution.backward()
    if scaler is not None:
        scaler.step(optimizer)
        scaler.update()
    else:
        optimizer.step()
    return torch.stack(losses).mean().item()


@dataclass
class AllReduceCounter:
    """State of :func:`counting_allreduce_hook`: what PyTorch DDP handed to its gradient all-reduces."""

    process_group: Group = None
    calls: int = 0                      # all-reduces issued (one per bucket and synchronised backward)
    nbytes: int = 0                     # bytes of the buckets all-reduced
    dtypes: Counter = field(default_factory=Counter)   # bucket dtype -> number of all-reduces

    def as_dict(self) -> dict:
        return {"calls": self.calls, "bytes": self.nbytes, "dtypes": {str(k): v for k, v in self.dtypes.items()}}


def counting_allreduce_hook(state: AllReduceCounter, bucket) -> torch.futures.Future[torch.Tensor]:
    """A DDP communication hook that does what DDP does without one — average the bucket with one
    all-reduce (as ``torch.distributed.algorithms.ddp_comm_hooks.default_hooks.allreduce_hook``) —
    and counts it. ``ddp.register_comm_hook(AllReduceCounter(), counting_allreduce_hook)``."""
    group = state.process_group
    buf = bucket.buffer()
    state.calls += 1
    state.nbytes += groups.nbytes(buf)
    state.dtypes[buf.dtype] += 1
    buf.div_(groups.size(group))  # divide first: the sum of averages cannot overflow in fp16
    work = dist.all_reduce(buf, group=group, async_op=True)
    return work.get_future().then(lambda fut: fut.value()[0])
