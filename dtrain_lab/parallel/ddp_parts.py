"""The parts of :mod:`dtrain_lab.parallel.ddp` around its wrapper: the gradient buckets, the view of a
bucket a communication hook receives, the start broadcast, the walk of the autograd graph that
``find_unused_parameters=True`` pays for, and the one-all-reduce-per-parameter baseline.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterator

import torch
import torch.nn as nn

from dtrain_lab.comm import groups
from dtrain_lab.comm.counted import Comm
from dtrain_lab.comm.groups import Group

__all__ = ["MB", "Bucket", "HookBucket", "params_reached", "broadcast_coalesced", "naive_allreduce_grads"]

MB = 1024 * 1024  # PyTorch's bucket_cap_mb counts mebibytes


@dataclass
class Bucket:
    """One bucket: its parameters (indices into ``DDP.param_names``), their place in the flat buffer,
    and the state of the current iteration."""

    index: int
    params: list[int]
    offsets: list[int]
    numels: list[int]
    buffer: torch.Tensor
    pending: int = 0
    work: Any = None
    launched_in_backward: bool = False
    names: list[str] = field(default_factory=list)

    @property
    def nbytes(self) -> int:
        return groups.nbytes(self.buffer)


class HookBucket:
    """What a communication hook receives: the methods of PyTorch's ``dist.GradBucket`` that hooks use."""

    def __init__(self, bucket: Bucket, params: list[torch.Tensor], num_buckets: int):
        self._bucket, self._params, self._num_buckets = bucket, params, num_buckets
        self._buffer = bucket.buffer

    def index(self) -> int:
        return self._bucket.index

    def buffer(self) -> torch.Tensor:
        return self._buffer

    def set_buffer(self, tensor: torch.Tensor) -> None:
        self._buffer = tensor

    def gradients(self) -> list[torch.Tensor]:
        """Per-parameter views of the buffer, shaped like the parameters."""
        b = self._bucket
        return [self._buffer[o:o + n].view_as(p) for o, n, p in zip(b.offsets, b.numels, self._params)]

    def parameters(self) -> list[torch.Tensor]:
        return list(self._params)

    def is_last(self) -> bool:
        """The last bucket of the step (PyTorch: the one holding the first layers)."""
        return self._bucket.index == self._num_buckets - 1


def _tensors_in(obj: Any) -> Iterator[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for x in obj:
            yield from _tensors_in(x)
    elif isinstance(obj, dict):
        for x in obj.values():
            yield from _tensors_in(x)


def params_reached(outputs: Any, index: dict[int, int]) -> set[int]:
    """Indices (values of ``index``, keyed by ``id(param)``) of the parameters the autograd graph of
    ``outputs`` reaches: a walk over ``grad_fn.next_functions`` down to the ``AccumulateGrad`` leaves.
    This is the per-iteration graph traversal that ``find_unused_parameters=True`` pays for."""
    found: set[int] = set()
    seen: set[Any] = set()
    stack = []
    for t in _tensors_in(outputs):
        if t.grad_fn is not None:
            stack.append(t.grad_fn)
        elif t.requires_grad and id(t) in index:  # forward returned a parameter itself
            found.add(index[id(t)])
    while stack:
        fn = stack.pop()
        if fn in seen:
            continue
        seen.add(fn)
        var = getattr(fn, "variable", None)  # AccumulateGrad: the leaf it accumulates into
        if var is not None and id(var) in index:
            found.add(index[id(var)])
        for nxt, _ in fn.next_functions:
            if nxt is not None and nxt not in seen:
                stack.append(nxt)
    return found


def broadcast_coalesced(tensors: list[torch.Tensor], comm: Comm) -> int:
    """Broadcast ``tensors`` from the group's rank 0, one flat buffer per dtype/device. Returns the
    number of collectives issued."""
    by_key: dict[tuple, list[torch.Tensor]] = {}
    for t in tensors:
        by_key.setdefault((t.dtype, t.device), []).append(t)
    with torch.no_grad():
        for ts in by_key.values():
            flat = torch.cat([t.detach().reshape(-1) for t in ts])
            comm.broadcast(flat, src=0)
            offset = 0
            for t in ts:
                n = t.numel()
                t.copy_(flat[offset:offset + n].view_as(t))
                offset += n
    return len(by_key)


def naive_allreduce_grads(model: nn.Module, group: Group = None) -> dict:
    """The baseline: after backward, one blocking all-reduce per parameter gradient, then divide by
    the world size. Returns ``{"collectives": n, "bytes": b}``.

    Every rank must have the same parameters with a gradient (a ``None`` gradient on one rank only
    would pair different tensors across ranks). No-op on a world of one.
    """
    comm = Comm(group)
    if comm.size == 1:
        return {"collectives": 0, "bytes": 0}
    for p in model.parameters():  # tied parameters listed once
        if p.grad is None:
            continue
        comm.all_reduce(p.grad)
        p.grad.div_(comm.size)
    return {"collectives": comm.calls["all_reduce"], "bytes": comm.payload["all_reduce"]}
