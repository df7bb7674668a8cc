"""Activation checkpointing: what it saves, what it costs, measured on the tensors themselves.

Backward needs activations that forward computed. Autograd keeps them as *saved tensors* of the
graph until backward consumes them; for a transformer they grow with batch × sequence × width ×
layers and, past a few billion parameters, often outweigh the sharded model states of ZeRO-3.
Activation checkpointing (``torch.utils.checkpoint.checkpoint``) keeps only each checkpointed
region's *inputs* and runs the region's forward a second time during backward to rebuild the rest:
less memory, one extra forward per region.

:func:`saved_tensor_bytes` counts the bytes autograd keeps, with
``torch.autograd.graph.saved_tensors_hooks`` (each storage counted once): a count of tensors, not
process memory, so it is the same on every machine and on CPU as on GPU.
:func:`checkpoint_blocks` wraps a model's blocks. The run that measures both on a
:class:`dtrain_lab.models.TinyTransformer` (saved bytes, block forward calls, time, gradients) is a
driver: :func:`dtrain_lab.demos.actckpt_measure.measure`.

On GPUs the same trade is read with ``torch.cuda.max_memory_allocated()`` (peak memory, which also
holds temporaries); the recompute costs about one forward (roughly a third of a training step's
FLOPs) per checkpointed region.
"""
from __future__ import annotations

import contextlib

import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

__all__ = ["saved_tensor_bytes", "checkpoint_blocks"]


class _Counter:
    def __init__(self) -> None:
        self.bytes = 0
        self.tensors = 0
        self._seen: set = set()

    @staticmethod
    def _key(t: torch.Tensor):
        """``(storage key, storage bytes)``."""
        try:
            return (t.untyped_storage().data_ptr(), t.device), t.untyped_storage().nbytes()
        except (RuntimeError, NotImplementedError):   # tensors without storage (e.g. wrapper subclasses)
            return (id(t), t.device), t.numel() * t.element_size()

    def seen(self, t: torch.Tensor) -> bool:
        """Whether ``t``'s storage is among those counted."""
        return self._key(t)[0] in self._seen

    def pack(self, t: torch.Tensor):
        key, nbytes = self._key(t)
        if key not in self._seen:
            self._seen.add(key)
            self.bytes += nbytes
            self.tensors += 1
        return t

    @staticmethod
    def unpack(t: torch.Tensor) -> torch.Tensor:
        return t


@contextlib.contextmanager
def saved_tensor_bytes():
    """``with saved_tensor_bytes() as c: loss = model(x)...`` then ``c.bytes``: the bytes of the
    distinct storages autograd saved for backward while the block ran (parameters included, since
    ``x @ W`` saves ``W``; leave them out with ``c.seen(p)`` for each parameter ``p``)."""
    counter = _Counter()
    with torch.autograd.graph.saved_tensors_hooks(counter.pack, counter.unpack):
        yield counter


class _Checkpointed(nn.Module):
    def __init__(self, block: nn.Module):
        super().__init__()
        self.block = block

    def forward(self, *args):
        # use_reentrant=False: the variant PyTorch recommends (works with kwargs, nested
        # checkpoints and inputs that do not require grad)
        return checkpoint(self.block, *args, use_reentrant=False)


def checkpoint_blocks(model: nn.Module, attr: str = "blocks") -> nn.Module:
    """Wrap every module of ``model.<attr>`` (an ``nn.ModuleList``) so that its forward runs under
    activation checkpointing. Returns the model (changed in place)."""
    blocks = getattr(model, attr)
    for i, block in enumerate(blocks):
        if not isinstance(block, _Checkpointed):
            blocks[i] = _Checkpointed(block)
    return model
