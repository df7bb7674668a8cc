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
:func:`measure` runs one forward+backward of a :class:`dtrain_lab.models.TinyTransformer` with and
without checkpointing its blocks and reports saved bytes, block forward calls, the time and whether
the gradients are identical.

On GPUs the same trade is read with ``torch.cuda.max_memory_allocated()`` (peak memory, which also
holds temporaries); the recompute costs about one forward (roughly a third of a training step's
FLOPs) per checkpointed region.
"""
from __future__ import annotations

import contextlib
import time

import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

__all__ = ["saved_tensor_bytes", "checkpoint_blocks", "measure"]


class _Counter:
    def __init__(self) -> None:
        self.bytes = 0
        self.tensors = 0
        self._seen: set = set()

    def pack(self, t: torch.Tensor):
        try:
            key = (t.untyped_storage().data_ptr(), t.device)
            nbytes = t.untyped_storage().nbytes()
        except (RuntimeError, NotImplementedError):   # tensors without storage (e.g. wrapper subclasses)
            key, nbytes = (id(t), t.device), t.numel() * t.element_size()
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
    ``x @ W`` saves ``W``; :func:`measure` subtracts them)."""
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


def measure(*, checkpointed: bool, batch: int = 8, seq: int = 16, d: int = 64, n_layers: int = 4,
            vocab: int = 64, seed: int = 0, repeats: int = 3) -> dict:
    """One forward+backward of a TinyTransformer (same seed and data either way).

    Returns ``saved_bytes`` (activations saved for backward, parameters excluded),
    ``block_forwards`` (calls of the blocks' forward: doubled by checkpointing), ``seconds``
    (fastest of ``repeats`` forward+backward), ``grads`` (the gradients, to compare runs).
    """
    from dtrain_lab.models import Block, TinyTransformer

    model = TinyTransformer(vocab=vocab, d=d, n_heads=2, n_layers=n_layers, max_len=seq, seed=seed)
    if checkpointed:
        checkpoint_blocks(model)
    gen = torch.Generator().manual_seed(seed + 1)
    tokens = torch.randint(0, vocab, (batch, seq), generator=gen)
    calls = [0]
    # a *pre*-hook: by default the recomputation stops as soon as the last tensor backward needs is
    # rebuilt ("early stop", torch.utils.checkpoint.set_checkpoint_early_stop), so a block's
    # forward called again in backward may never return and a post-forward hook would miss it
    hooks = [m.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
             for m in model.modules() if isinstance(m, Block)]

    def step():
        model.zero_grad(set_to_none=True)
        logits = model(tokens[:, :-1])
        loss = nn.functional.cross_entropy(logits.reshape(-1, vocab), tokens[:, 1:].reshape(-1))
        return loss

    with saved_tensor_bytes() as counter:
        loss = step()
    # parameters saved by matmuls are model states, not activations: leave them out
    saved = counter.bytes - sum(p.untyped_storage().nbytes() for p in model.parameters()
                                if (p.untyped_storage().data_ptr(), p.device) in counter._seen)
    calls[0] = 0
    loss.backward()
    forwards_in_step = len([m for m in model.modules() if isinstance(m, Block)]) + calls[0]
    grads = {n.replace("block.", ""): p.grad.detach().clone() for n, p in model.named_parameters()}
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        step().backward()
        best = min(best, time.perf_counter() - t0)
    for h in hooks:
        h.remove()
    return {"saved_bytes": saved, "block_forwards": forwards_in_step, "seconds": best,
            "loss": float(loss.detach()), "grads": grads, "n_layers": n_layers}
