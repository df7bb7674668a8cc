"""Lesson 05's activation-checkpointing measurement: one TinyTransformer step with and without it.

:func:`measure` runs one forward+backward of a :class:`dtrain_lab.models.TinyTransformer`, with or
without :func:`dtrain_lab.parallel.actckpt.checkpoint_blocks`, and reports the activation bytes autograd
saved (:func:`dtrain_lab.parallel.actckpt.saved_tensor_bytes`, parameters left out), the calls of the
blocks' forward, the time and the gradients (to compare runs).
"""
from __future__ import annotations

import time

import torch
import torch.nn as nn

from dtrain_lab.models import Block, TinyTransformer
from dtrain_lab.parallel.actckpt import checkpoint_blocks, saved_tensor_bytes

__all__ = ["measure"]


def measure(*, checkpointed: bool, batch: int = 8, seq: int = 16, d: int = 64, n_layers: int = 4,
            vocab: int = 64, seed: int = 0, repeats: int = 3) -> dict:
    """One forward+backward of a TinyTransformer (same seed and data either way).

    Returns ``saved_bytes`` (activations saved for backward, parameters excluded),
    ``block_forwards`` (calls of the blocks' forward: doubled by checkpointing), ``seconds``
    (fastest of ``repeats`` forward+backward), ``grads`` (the gradients, to compare runs).
    """
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
    saved = counter.bytes - sum(p.untyped_storage().nbytes() for p in model.parameters() if counter.seen(p))
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
