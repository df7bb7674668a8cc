"""Lesson 02b §1–§4: the practices around a data-parallel training loop, one function each.

    torchrun --standalone --nproc-per-node 2 -m dtrain_lab.demos.dp_practices sampler_eval seeds sync_bn
    torchrun ... -m dtrain_lab.demos.dp_practices checkpoint --dir /tmp/ckpt
    torchrun ... -m dtrain_lab.demos.dp_practices rank0_eval          # the trap: hangs

The functions named on the command line run in order, in one job (starting a job costs seconds);
each reports its results with :func:`dtrain_lab.jobs.runtime.report` under its own keys.
"""
import copy
import os
import sys

import torch
import torch._dynamo  # noqa: F401  DistributedDataParallel imports it on first use: seconds of CPU
# time that belong in the job's start-up, not in the time the launcher allows the run.
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DistributedSampler

from dtrain_lab import caps
from dtrain_lab.i18n import tr
from dtrain_lab.jobs import runtime
from dtrain_lab.data import classification_dataset, regression_dataset, shard
from dtrain_lab.parallel.ddp import naive_allreduce_grads
from dtrain_lab.demos.dp_sync_bn import sync_bn
from dtrain_lab.models import MLP

EVAL_SAMPLES = 7   # odd: two ranks cannot split it evenly


# ------------------------------------------------------------------------------ §4 evaluation
def eval_model() -> MLP:
    """A fixed (untrained) classifier: what it predicts does not matter, only how we count."""
    return MLP(16, 32, 4, depth=2, seed=0)


def sampler_eval() -> None:
    """Accuracy over EVAL_SAMPLES samples, evaluated by every rank on its DistributedSampler shard."""
    rt = runtime.current()
    data = classification_dataset(n=EVAL_SAMPLES, d_in=16, n_classes=4, seed=3)
    model = eval_model().to(rt.device).eval()
    out = {}
    for drop_last in (False, True):
        sampler = DistributedSampler(data, shuffle=False, drop_last=drop_last)  # rank, world: from dist
        idx = list(sampler)
        x, y = data.tensors[0][idx].to(rt.device), data.tensors[1][idx].to(rt.device)
        with torch.no_grad():
            correct = (model(x).argmax(dim=1) == y).float()
        # position of each of my samples in the padded list: rank, rank + W, rank + 2W, ...
        position = torch.arange(len(idx), device=rt.device) * rt.world_size + rt.rank
        real = (position < len(data)).float()       # positions past the data set are padding
        sums = torch.stack([correct.sum(), torch.tensor(float(len(idx)), device=rt.device),
                            (correct * real).sum(), real.sum()])
        dist.all_reduce(sums)                       # every rank takes part, every rank gets the totals
        key = "drop_last" if drop_last else "padded"
        out[key] = {"indices": idx, "correct": correct.tolist(), "counted": sums[1].item(),
                    "accuracy": (sums[0] / sums[1]).item()}
        if not drop_last:
            out["exact"] = {"counted": sums[3].item(), "accuracy": (sums[2] / sums[3]).item()}
    runtime.report(sampler_eval=out)


# ------------------------------------------------------------------------------ §5 seeds
def first_weights(model: nn.Module) -> list:
    return [round(v, 6) for v in next(model.parameters()).detach().reshape(-1)[:3].tolist()]


def seeds() -> None:
    """What must be equal on every rank (the model), and what must differ (sampling, dropout)."""
    rt = runtime.current()
    out = {}
    runtime.seed_all(0)                          # the same seed everywhere ...
    out["init_same_seed"] = first_weights(MLP(16, 32, 4))       # ... the same initial model
    runtime.seed_all(1337 + rt.rank)             # a rank-offset seed before building the model ...
    model = MLP(16, 32, 4).to(rt.device)
    twin = copy.deepcopy(model)
    out["init_rank_seed"] = first_weights(model)                # ... a different model per rank
    # naive data parallelism never repairs that: the same averaged update on different weights
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = regression_dataset(n=64, seed=0)
    for step in range(3):
        x, y = (t[step * 16:(step + 1) * 16] for t in data.tensors)
        x, y = (t.to(rt.device) for t in shard((x, y), rt.rank, rt.world_size))
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        naive_allreduce_grads(model)
        opt.step()
    out["after_naive_training"] = first_weights(model)
    DistributedDataParallel(twin)                # its constructor broadcasts rank 0's parameters
    out["after_ddp_wrap"] = first_weights(twin)

    # randomness that must differ: which samples a rank draws, its dropout masks, its augmentations
    runtime.seed_all(0)
    out["draws_same_seed"] = torch.randint(0, 1000, (4,)).tolist()
    out["dropout_same_seed"] = F.dropout(torch.ones(8), p=0.5).tolist()
    gen = runtime.data_generator(seed=0)         # seed + 1_000_003 * rank
    out["draws_rank_generator"] = torch.randint(0, 1000, (4,), generator=gen).tolist()
    torch.manual_seed(1 + rt.rank)               # after the model is built: per-rank dropout
    out["dropout_rank_seed"] = F.dropout(torch.ones(8), p=0.5).tolist()
    runtime.report(seeds=out)


# ------------------------------------------------------------------------------ §7 logging, checkpoints
def checkpoint(directory: str) -> None:
    """Train with PyTorch's DDP; log and evaluate on rank 0; save on rank 0; load on every rank."""
    rt = runtime.current()
    model = MLP(16, 32, 4, depth=2, seed=0).to(rt.device)
    ddp = DistributedDataParallel(model, device_ids=[rt.device] if rt.backend == "nccl" else None)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    data = regression_dataset(n=64, seed=0)
    for step in range(3):
        x, y = (t[step * 16:(step + 1) * 16] for t in data.tensors)
        x, y = (t.to(rt.device) for t in shard((x, y), rt.rank, rt.world_size))
        loss = F.mse_loss(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        logged = loss.detach().clone()
        dist.all_reduce(logged)                  # on every rank: a collective is never inside `if rank == 0`
        runtime.print0(tr("dpp_step_loss", step=step, loss=logged.item() / rt.world_size))
    if rt.rank == 0:                             # evaluation on one rank: the plain module, no collective
        with torch.no_grad():
            val = F.mse_loss(ddp.module(data.tensors[0][48:].to(rt.device)), data.tensors[1][48:].to(rt.device))
        runtime.print0(tr("dpp_val_loss", loss=val.item()))
    path = os.path.join(directory, "checkpoint.pt")
    if rt.rank == 0:                             # one writer; write then rename, so no reader sees half a file
        state = {"model": ddp.module.state_dict(), "optimizer": opt.state_dict(), "step": 3}
        torch.save(state, path + ".tmp")
        os.replace(path + ".tmp", path)
    dist.barrier()                               # nobody reads before rank 0 has finished writing
    state = torch.load(path, map_location=rt.device, weights_only=True)
    fresh = MLP(16, 32, 4, depth=2, seed=1).to(rt.device)
    fresh.load_state_dict(state["model"])
    runtime.report(checkpoint={
        "wrote": rt.rank == 0, "step": state["step"],
        "equal_to_trained": all(torch.equal(a, b) for a, b in zip(fresh.state_dict().values(),
                                                                   model.state_dict().values())),
        "wrapper_key": next(iter(ddp.state_dict())), "module_key": next(iter(state["model"])),
        "momentum_saved": "momentum_buffer" in state["optimizer"]["state"][0]})


def rank0_eval(fix: bool = False) -> None:
    """The trap: evaluating through the DDP wrapper on rank 0 only, with a model that has buffers."""
    rt = runtime.current()
    model = nn.Sequential(nn.Linear(16, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 4)).to(rt.device)
    ddp = DistributedDataParallel(model)
    x = torch.randn(8, 16, generator=runtime.data_generator(seed=0)).to(rt.device)
    ddp(x).pow(2).mean().backward()              # one training step's forward and backward
    if rt.rank == 0:
        ddp.eval()
        with torch.no_grad():
            net = ddp.module if fix else ddp     # the bug: `ddp` broadcasts its buffers in forward
            net(x)
        ddp.train()
        print(tr("dpp_eval_done"))
    dist.barrier()                               # e.g. before saving a checkpoint
    runtime.report(passed=True)


def main() -> None:
    names = [a for a in sys.argv[1:] if not a.startswith("--")]
    directory = sys.argv[sys.argv.index("--dir") + 1] if "--dir" in sys.argv else None
    if directory in names:
        names.remove(directory)
    if not caps.have("cuda"):
        torch.set_num_threads(1)
    for name in names or ["sampler_eval", "seeds", "sync_bn"]:
        if name == "checkpoint":
            checkpoint(directory or os.environ.get("DTRAIN_JOB_DIR") or ".")
        elif name == "rank0_eval":
            rank0_eval(fix="--fix" in sys.argv)
        else:
            {"sampler_eval": sampler_eval, "seeds": seeds, "sync_bn": sync_bn}[name]()


if __name__ == "__main__":
    runtime.entrypoint(main)
