"""Peak bytes of tensor storage alive in this process, by category — what a rank really holds.

``PeakTensorMemory`` is a ``TorchDispatchMode``: every tensor an operator returns inside it (and every
tensor handed to :meth:`track` beforehand: the model, the optimizer state) has its *storage*
registered through a weak reference; after each operator the live storages are summed (``nbytes()``
read then, so ``untyped_storage().resize_`` — how ZeRO-3 and FSDP free gathered parameters — counts
too) and the largest sum is kept with its break-down. Views share an allocation and count once (told
apart by address).

It sees what goes through PyTorch's dispatcher: parameters, gradients, optimizer state, activations,
temporaries, and the buffers collectives are given (FSDP2's all-gather and reduce-scatter buffers).
It does not see memory a library allocates for itself in C++ (gloo's or NCCL's internal buffers), the
allocator's cache or fragmentation, nor the Python interpreter: tensor bytes, not RSS.
PyTorch's own ``torch.distributed._tools.MemTracker`` works the same way and also runs on CPU; it is
not used here because it refuses a second iteration and files a sharded optimizer's buffers made in
``step()`` under "optimizer state", which hides the very difference this measurement is about.
"""
from __future__ import annotations

import weakref
from typing import Callable, Iterable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


def _local(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard (its storage is what this rank holds); any other tensor itself."""
    return getattr(t, "_local_tensor", t)


def storages(items) -> list[torch.UntypedStorage]:
    """The storages behind tensors, modules (parameters, gradients, buffers) and optimizers (state)."""
    out = []
    for obj in items if isinstance(items, (list, tuple, set)) else [items]:
        if isinstance(obj, torch.Tensor):
            out.append(_local(obj).untyped_storage())
        elif isinstance(obj, torch.nn.Module):
            for p in obj.parameters():
                out.append(_local(p).untyped_storage())
                if p.grad is not None:
                    out.append(_local(p.grad).untyped_storage())
            out += [_local(b).untyped_storage() for b in obj.buffers()]
        elif isinstance(obj, torch.optim.Optimizer):
            for state in obj.state.values():
                out += [_local(v).untyped_storage() for v in state.values() if isinstance(v, torch.Tensor)]
        elif isinstance(obj, Iterable):
            out += storages(list(obj))
    return out


class PeakTensorMemory(TorchDispatchMode):
    """``with PeakTensorMemory(classify) as mem: ...`` then ``mem.peak`` (bytes), ``mem.peak_parts``.

    ``classify()`` returns ``{category: [tensors, modules or optimizers]}``; it is called whenever a
    new peak is reached, and each live storage is put in the first category that holds it (the rest
    is ``"other"``: activations, temporaries, communication buffers). ``track(*objs)`` registers what
    existed before the block."""

    def __init__(self, classify: Callable[[], dict] | None = None):
        super().__init__()
        self.classify = classify
        self._live: dict[int, weakref.ref] = {}
        self.peak = 0
        self.peak_parts: dict[str, int] = {}
        self.peak_other: list[int] = []      # sizes of the "other" storages at the peak, largest first
        self.peak_op = ""

    def track(self, *objs) -> "PeakTensorMemory":
        for st in storages(list(objs)):
            self._add(st)
        self._update("start")
        return self

    def _add(self, st: torch.UntypedStorage) -> None:
        key = id(st)
        if key not in self._live:
            self._live[key] = weakref.ref(st, lambda _r, k=key: self._live.pop(k, None))

    def live(self) -> list[torch.UntypedStorage]:
        return [st for st in (r() for r in list(self._live.values())) if st is not None]

    def _by_address(self) -> dict[int, int]:
        """Bytes per distinct allocation: two Python storage objects can wrap one allocation (views
        made inside C++), so allocations are told apart by address; a freed one (size 0) has none."""
        out: dict[int, int] = {}
        for st in self.live():
            if st.nbytes():
                out[st.data_ptr()] = max(out.get(st.data_ptr(), 0), st.nbytes())
        return out

    def current(self) -> int:
        return sum(self._by_address().values())

    def _update(self, where: str) -> None:
        now = self.current()
        if now > self.peak:
            self.peak, self.peak_op = now, where
            self.peak_parts = self._parts()

    def _parts(self) -> dict[str, int]:
        live = self._by_address()
        parts, seen = {}, set()
        for name, objs in (self.classify() if self.classify else {}).items():
            ids = {st.data_ptr() for st in storages(list(objs))} & set(live) - seen
            parts[name] = sum(live[i] for i in ids)
            seen |= ids
        other = sorted((v for k, v in live.items() if k not in seen), reverse=True)
        parts["other"] = sum(other)
        self.peak_other = [v for v in other if v][:8]
        return parts

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0] + tree_flatten(args)[0]:
            if isinstance(t, torch.Tensor):
                self._add(_local(t).untyped_storage())
        self._update(str(func))
        return out
