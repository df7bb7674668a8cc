"""Lesson 03's mixed-precision runs, in one process on the CPU: a training run per precision, a timed step.

:func:`train_losses` trains a :class:`~dtrain_lab.models.TinyTransformer` in fp32, bf16 autocast or
fp16 autocast with ``GradScaler`` from the same weights and data, and returns every step's loss;
:func:`step_time` times a training step of an MLP in fp32 and bf16. The mechanism they exercise
(formats, autocast, gradient census, loss scaling) lives in :mod:`dtrain_lab.parallel.amp`.
"""
from __future__ import annotations

import contextlib
import statistics
import time

import torch
import torch.nn.functional as F

from dtrain_lab.data import token_dataset
from dtrain_lab.i18n import LabError
from dtrain_lab.models import MLP, TinyTransformer
from dtrain_lab.parallel.amp import one_thread

__all__ = ["train_losses", "step_time"]


def _autocast(precision: str, device_type: str = "cpu"):
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type, dtype={"bf16": torch.bfloat16, "fp16": torch.float16}[precision])


@one_thread()
def train_losses(precision: str = "fp32", steps: int = 80, *, batch: int = 32, lr: float = 3e-3,
                 seed: int = 0) -> list[float]:
    """Train a :class:`~dtrain_lab.models.TinyTransformer` on the token task for ``steps`` Adam steps
    in ``precision`` ("fp32", "bf16" autocast, or "fp16" autocast with ``GradScaler("cpu")``), on the
    CPU, from the same weights and data every time. Returns the loss of every step."""
    if precision not in ("fp32", "bf16", "fp16"):
        raise LabError("amp_bad_precision", value=precision, choices="fp32, bf16, fp16")
    data = token_dataset(n=512, seq_len=8, vocab=16, seed=seed)
    model = TinyTransformer(vocab=16, d=32, n_heads=2, n_layers=2, max_len=8, seed=seed)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    scaler = torch.amp.GradScaler("cpu") if precision == "fp16" else None
    losses = []
    n = len(data)
    for step in range(steps):
        idx = (torch.arange(batch) + step * batch) % n
        x, y = data.tensors[0][idx], data.tensors[1][idx]
        opt.zero_grad(set_to_none=True)
        with _autocast(precision):
            logits = model(x)
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        if scaler is None:
            loss.backward()
            opt.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        losses.append(loss.item())
    return losses


@one_thread()
def step_time(precision: str = "fp32", *, d: int = 512, depth: int = 3, batch: int = 256, steps: int = 5,
              repeats: int = 3) -> float:
    """Seconds per training step (forward, backward, SGD) of an MLP of width ``d`` on the CPU, in
    ``precision`` ("fp32" or "bf16" autocast): the median over ``repeats`` blocks of ``steps`` steps,
    after one warm-up step. fp16 is left out on purpose: CPU fp16 matmuls can be very slow."""
    model = MLP(d, d, d, depth=depth, seed=0)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(batch, d, generator=g), torch.randn(batch, d, generator=g)

    def one():
        opt.zero_grad(set_to_none=True)
        with _autocast(precision):
            loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()

    one()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(steps):
            one()
        times.append((time.perf_counter() - t0) / steps)
    return statistics.median(times)
