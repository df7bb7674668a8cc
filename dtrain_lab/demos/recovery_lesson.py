"""In-process helpers for lesson 09 (checkpointing and failure recovery), in a world of one.

:func:`parts` builds a small training run (dropout, Adam, StepLR, a
:class:`~dtrain_lab.resilience.recovery.ResumableDistributedSampler`, inputs jittered by Python ``random``,
NumPy and torch) and :func:`train` runs it; :func:`interrupted` stops it after ``stop_at`` steps,
saves the captured state, loads it into fresh objects (whose generators were re-seeded, as a new
process would), optionally leaving a part out, and trains on. Compare the result with an
uninterrupted :func:`train` using ``torch.equal``.
"""
from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader

from dtrain_lab.resilience import recovery
from dtrain_lab.data import regression_dataset

BATCH, EPOCHS = 4, 3


def parts(loader_generator: bool = True):
    """``(model, optimizer, scheduler, sampler, loader)``; every generator seeded at start-up."""
    torch.manual_seed(3)
    random.seed(4)
    np.random.seed(5)
    g = torch.Generator().manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 2))
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=4, gamma=0.5)
    data = regression_dataset(n=30, d_in=6, d_out=2, seed=1)
    sampler = recovery.ResumableDistributedSampler(data, num_replicas=1, rank=0, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=BATCH, sampler=sampler,
                        generator=torch.Generator() if loader_generator else None)
    return model, opt, sched, sampler, loader


def train(p, epochs: int = EPOCHS, stop_at: int | None = None, step: int = 0):
    """Train ``p`` (from :func:`parts`) from ``step``; return the captured state at ``stop_at``,
    else the final parameters as one flat tensor."""
    model, opt, sched, sampler, loader = p
    for epoch in range(sampler.epoch, epochs):
        sampler.set_epoch(epoch)
        for i, (x, y) in enumerate(loader):
            x = x * (1 + 0.1 * random.random()) + 0.1 * float(np.random.rand()) + 0.05 * torch.randn_like(x)
            opt.zero_grad()
            F.mse_loss(model(x), y).backward()
            opt.step()
            sched.step()
            step += 1
            if step == stop_at:
                return recovery.capture(model, opt, sched, sampler.position(i + 1, BATCH), step)
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def interrupted(directory: str | Path, stop_at: int = 6, leave_out: str | None = None,
                loader_generator: bool = True) -> torch.Tensor:
    """Train to ``stop_at``, save, "restart" (fresh objects), restore and finish.

    ``leave_out``: ``None`` (restore everything), ``"rng"`` (no RNG states), ``"optimizer"``
    (fresh optimizer state) or ``"data"`` (start the epoch again from its first batch).
    """
    state = train(parts(loader_generator), stop_at=stop_at)
    recovery.save(state, directory, stop_at)
    loaded = recovery.load(recovery.latest(directory))
    p = parts(loader_generator)                   # a new process: generators seeded again
    model, opt, sched, sampler, _ = p
    if leave_out == "rng":
        loaded["rng"] = None
    if leave_out == "data":
        loaded["data"] = {"epoch": loaded["data"]["epoch"], "index": 0}
    step, _ = recovery.restore(loaded, model, None if leave_out == "optimizer" else opt, sched, sampler)
    return train(p, step=step)
