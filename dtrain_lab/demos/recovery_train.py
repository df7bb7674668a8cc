"""Training that survives a crash: checkpoint, die, restart, resume — and end bit-identical.

    torchrun --standalone --nproc-per-node 2 --max-restarts 2 -m dtrain_lab.demos.recovery_train CKPT_DIR
    # with a fault: DTRAIN_FAIL_AT_STEP=7 DTRAIN_FAIL_RANK=1 DTRAIN_FAIL_MODE=sigkill \\
    #               DTRAIN_FAIL_ONCE_FILE=/tmp/failed_once  torchrun ... (see dtrain_lab.resilience.recovery.FAIL_ENV)

Arguments: ``CKPT_DIR [STEPS_PER_CKPT=5] [EPOCHS=3]``. A small model with dropout (so every rank's
RNG matters) trains with PyTorch's DDP, SGD with momentum and weight decay (optimizer state), a
StepLR schedule and a :class:`~dtrain_lab.resilience.recovery.ResumableDistributedSampler` over 64 samples
(4 per rank per step: 8 steps per epoch). Every step also draws from Python ``random`` and NumPy
(input jitter), so all four generators must come back. Every ``STEPS_PER_CKPT`` steps the state
is captured on every rank and rank 0 saves it atomically (keeping 2). At start-up rank 0 picks
:func:`~dtrain_lab.resilience.recovery.latest` and every rank restores it.

One trap this program avoids: ``iter(DataLoader)`` draws a base seed from the *global* torch RNG
(``torch/utils/data/dataloader.py``, ``_base_seed``) each time an epoch starts, so a run resumed
mid-epoch would draw once more than an uninterrupted one and its dropout masks would drift. The
loader gets a generator of its own.

Reports per attempt: ``attempt``, ``resumed_from`` (step, 0 for a fresh start), ``ckpt_files`` (what
the folder held at start-up), ``started_at``; at the end ``params`` (flattened, exact float32 values),
``steps``. On the way, what lesson 09 draws, each with its ``attempt`` and wall-clock ``t``:
``progress`` (a step done), ``saving`` and ``saved`` (rank 0, around a checkpoint save) and ``fault``
(an injected fault, reported just before it fires: :data:`dtrain_lab.resilience.faults.on_fault`).
"""
import os
import random
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader

from dtrain_lab.resilience import faults, recovery
from dtrain_lab.jobs import runtime
from dtrain_lab.data import regression_dataset

BATCH, N_SAMPLES, LR = 4, 64, 0.05


def build():
    g = torch.Generator().manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 24), nn.ReLU(), nn.Dropout(0.25), nn.Linear(24, 2))
    with torch.no_grad():
        for p in model.parameters():   # same initial weights on every rank, without touching the global RNG
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return model


def main() -> None:
    rt = runtime.current()
    ckpt = sys.argv[1]
    every = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    epochs = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    hb_dir = os.path.join(ckpt, "heartbeats")
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))

    torch.manual_seed(1234 + rt.rank)          # per-rank dropout masks and input noise
    random.seed(99 + rt.rank)
    np.random.seed(7 + rt.rank)

    model = build()
    ddp = DistributedDataParallel(model) if rt.distributed else model
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9, weight_decay=1e-3)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=7, gamma=0.5)
    data = regression_dataset(n=N_SAMPLES, d_in=8, d_out=2, seed=0)
    sampler = recovery.ResumableDistributedSampler(data, num_replicas=rt.world_size, rank=rt.rank,
                                                   shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=BATCH, sampler=sampler, generator=torch.Generator().manual_seed(0))

    files = sorted(os.listdir(ckpt)) if os.path.isdir(ckpt) else []
    found = [None]
    if rt.rank == 0:
        path = recovery.latest(ckpt)            # skips (and warns about) a damaged newest checkpoint
        found = [None if path is None else str(path)]
    if rt.distributed:
        dist.broadcast_object_list(found, src=0)   # every rank resumes from the checkpoint rank 0 chose
    step = 0
    if found[0] is not None:
        step, _ = recovery.restore(recovery.load(found[0]), ddp, opt, sched, sampler)
    runtime.report(attempt=attempt, resumed_from=step, ckpt_files=files, started_at=time.time())

    def event(kind: str, **fields) -> None:      # one line each: it survives a SIGKILL right after
        runtime.report(**{kind: {"attempt": attempt, **fields, "t": time.time()}})

    faults.on_fault = lambda f: event("fault", **f)

    for epoch in range(sampler.epoch, epochs):
        sampler.set_epoch(epoch)
        for i, (x, y) in enumerate(loader):
            recovery.maybe_fail(step, rt.rank)
            jitter = 1.0 + 0.01 * random.random() + 0.01 * float(np.random.rand())
            x = x * jitter + 0.01 * torch.randn_like(x)
            opt.zero_grad(set_to_none=True)
            F.mse_loss(ddp(x), y).backward()
            opt.step()
            sched.step()
            step += 1
            recovery.heartbeat(hb_dir, step, rt.rank)
            event("progress", step=step)
            if step % every == 0:
                state = recovery.capture(ddp, opt, sched, sampler.position(i + 1, BATCH), step)
                if rt.rank == 0:
                    event("saving", step=step)
                    recovery.save(state, ckpt, step, keep=2)
                    event("saved", step=step)
                if rt.distributed:
                    dist.barrier()
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    runtime.report(params=flat.tolist(), steps=step, last=True)


if __name__ == "__main__":
    runtime.entrypoint(main)
