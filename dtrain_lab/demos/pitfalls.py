"""Two pitfalls of data-parallel training loops, shown with evidence.

    torchrun --standalone --nproc-per-node 3 -m dtrain_lab.demos.pitfalls double_reduction

* :func:`double_reduction` (a launch target): PyTorch's DDP has already averaged the gradients when
  ``loss.backward()`` returns. A hand-written all-reduce of the gradients left on top of it (copied
  from code written before DDP, or kept "to be safe") sums ``p`` identical averages: every gradient
  is ``p`` times too large, which is an SGD learning rate ``p`` times too large.
* :func:`first_batch_forever` (plain code, no launch): ``next(iter(loader))`` inside the training
  loop builds a new iterator at every step, and a new iterator starts at the beginning: without
  shuffling it returns the first batch forever; with a ``DistributedSampler`` that is never given
  ``set_epoch``, it does so even with ``shuffle=True``.
"""
from __future__ import annotations

import sys

import torch

# DDP's constructor imports torch._dynamo (seconds on a busy CPU): do it before the process group is
# up, so that it counts as start-up (as in dtrain_lab.demos.failures)
if sys.argv[1:2] == ["double_reduction"]:
    import torch._dynamo  # noqa: F401

import torch.distributed as dist
import torch.nn.functional as F
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from dtrain_lab.data import global_batch, regression_dataset, shard
from dtrain_lab.jobs import runtime
from dtrain_lab.models import MLP

GLOBAL_BATCH = 24      # divisible by 1, 2, 3 and 4 ranks


def _grads(model) -> torch.Tensor:
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()])


def double_reduction() -> None:
    """One DDP step on this rank's shard; then the extra all-reduce; against one process."""
    from torch.nn.parallel import DistributedDataParallel

    rt = runtime.current()
    data = regression_dataset(seed=0)
    x, y = shard(global_batch(data, 0, GLOBAL_BATCH), rt.rank, rt.world_size)

    model = MLP(16, 32, 4, depth=2, seed=0)
    ddp = DistributedDataParallel(model)
    F.mse_loss(ddp(x), y).backward()           # DDP's hooks all-reduce and average: done here
    after_ddp = _grads(model).clone()

    for p in model.parameters():               # the pitfall: a second, hand-written reduction
        dist.all_reduce(p.grad)
    twice = _grads(model)

    # the reference: one process, the whole global batch
    ref = MLP(16, 32, 4, depth=2, seed=0)
    gx, gy = global_batch(data, 0, GLOBAL_BATCH)
    F.mse_loss(ref(gx), gy).backward()
    reference = _grads(ref)

    runtime.report(world_size=rt.world_size,
                   ddp_vs_one_process=(after_ddp - reference).abs().max().item(),
                   twice_vs_one_process=(twice - reference).abs().max().item(),
                   norm_ratio=(twice.norm() / reference.norm()).item(),
                   twice_is_p_times=bool(torch.allclose(twice, rt.world_size * reference, rtol=1e-5, atol=1e-7)))


def first_batch_forever(n: int = 12, batch_size: int = 4) -> dict[str, list[list[int]]]:
    """The samples (their indices) each of one epoch's steps trains on, in five loops over a data
    set whose samples are their own indices. Plain code: the DistributedSampler is given its rank
    and number of replicas, so no process group is needed."""
    data = TensorDataset(torch.arange(n))
    steps = n // batch_size

    def batches(loader, fresh_iterator_each_step: bool) -> list[list[int]]:
        out, it = [], iter(loader)
        for _ in range(steps):
            (x,) = next(iter(loader)) if fresh_iterator_each_step else next(it)
            out.append(x.tolist())
        return out

    plain = DataLoader(data, batch_size=batch_size)
    shuffled = DataLoader(data, batch_size=batch_size, shuffle=True, generator=torch.Generator().manual_seed(0))
    sampler = DistributedSampler(data, num_replicas=2, rank=0, shuffle=True, seed=0)
    distributed = DataLoader(data, batch_size=batch_size // 2, sampler=sampler)
    return {
        "for_loop": [x.tolist() for (x,) in plain],                   # the reference: one epoch
        "next_iter": batches(plain, True),
        "next_iter_shuffle": batches(shuffled, True),
        "next_iter_distributed": batches(distributed, True),
        "iterator_kept": batches(plain, False),                       # the fix: iter() once
    }


def main() -> None:
    runtime.current()
    name = sys.argv[1] if len(sys.argv) > 1 else "double_reduction"
    if name != "double_reduction":
        from dtrain_lab.i18n import LabError

        raise LabError("pitfalls_bad_mode", value=name)
    double_reduction()


if __name__ == "__main__":
    runtime.entrypoint(main)
