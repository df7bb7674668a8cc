"""Lesson 10's broken programs, one function per failure mode, chosen by the first argument.

    torchrun --standalone --nproc-per-node 2 -m dtrain_lab.demos.failures mismatched_ops
    torchrun ... -m dtrain_lab.demos.failures unused_parameters [--fix]

Each function runs inside every rank after ``runtime.init()``. They are short on purpose: the bug
is the point. ``lessons/*/10_hangs_and_deadlocks.ipynb`` launches each one and reads what happens.
"""
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn as nn

from dtrain_lab.i18n import tr
from dtrain_lab.jobs import runtime

# DDP's constructor imports torch._dynamo (2 s on an idle CPU core, far more on a busy one). The
# launcher's timeout clock starts when the process group is up, so a hang demo with a short limit
# would spend it importing, and be killed before it reaches the hang it shows. Importing here,
# before runtime.init(), moves that cost into start-up, which has its own limit.
if sys.argv[1:2] and sys.argv[1] in ("unused_parameters", "uneven_inputs", "ddp_under_detail"):
    import torch._dynamo  # noqa: F401


def mismatched_ops(fix: bool = False):
    """Rank 0 all-reduces, the other ranks broadcast: two different collectives, same tensor size."""
    rank = dist.get_rank()
    t = torch.full((4,), float(rank + 1))
    if rank == 0 or fix:
        dist.all_reduce(t)
    else:
        dist.broadcast(t, src=0)
    runtime.report(result=t.tolist())


def mismatched_shapes(fix: bool = False):
    """Every rank all-reduces, but rank r's tensor has 4 + r elements (e.g. a last, smaller batch)."""
    rank = dist.get_rank()
    t = torch.ones(4 if fix else 4 + rank)
    dist.all_reduce(t)
    runtime.report(result=t.tolist())


def slow_rank(fix: bool = False):
    """Rank 1 is stuck (a data loader that never returns); the others wait in a monitored barrier."""
    rank = dist.get_rank()
    if rank == 1 and not fix:
        time.sleep(3600)          # stands for a stuck data loader, a dead NFS mount, ...
    dist.monitored_barrier(timeout=timedelta(seconds=2), wait_all_ranks=True)
    runtime.report(passed=True)


def slow_evaluation(fix: bool = False):
    """Rank 0 alone evaluates for 8 s, then the ranks average the metric. The group's timeout is 3 s,
    standing in for the default 10 min (NCCL) / 30 min (gloo) against a 40-minute evaluation.
    With ``fix`` every rank evaluates its share of the validation set (8 s / world size each)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    group = dist.new_group(timeout=timedelta(seconds=3))
    dist.barrier()                        # start together (on a loaded machine start-up skews the ranks)
    if fix:
        time.sleep(8.0 / world)           # each rank evaluates 1/world of the validation set
    elif rank == 0:
        time.sleep(8.0)                   # rank 0 evaluates the whole set; the others wait
    metric = torch.tensor([float(rank)])
    dist.all_reduce(metric, group=group)
    runtime.report(metric=metric.item())


class TwoHeads(nn.Module):
    """A model whose second head is used only by some batches (here: never, on every rank)."""

    def __init__(self):
        super().__init__()
        self.body = nn.Linear(8, 8)
        self.head_a = nn.Linear(8, 1)
        self.head_b = nn.Linear(8, 1)     # e.g. an auxiliary loss that is switched off

    def forward(self, x, use_b: bool = False):
        h = torch.relu(self.body(x))
        return self.head_b(h) if use_b else self.head_a(h)


def unused_parameters(fix: bool = False):
    """PyTorch DDP on a model with a head that gets no gradient: the error comes at the *second* step."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    model = DDP(TwoHeads(), find_unused_parameters=fix)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = runtime.data_generator(seed=1)
    for step in range(3):
        x = torch.randn(16, 8, generator=gen)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(tr("demo_step_loss", step=step, loss=loss.item()))
        runtime.report(**{f"body_weight_after_step_{step}": model.module.body.weight[0, :3].tolist()})
        dist.barrier()    # every rank has reported this step before the next one fails and ends the job
    runtime.report(steps=3)


def uneven_inputs(fix: bool = False):
    """Rank r has 3 + r batches (an unevenly split dataset). With ``fix``, DDP's ``join()`` shadows
    the missing steps of the ranks that ran out."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = runtime.data_generator(seed=2)
    batches = [torch.randn(16, 8, generator=gen) for _ in range(3 + rank)]

    def train():
        for x in batches:
            loss = model(x).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()

    if fix:
        with model.join():
            train()
    else:
        train()
    print(tr("demo_trained_batches", rank=rank, n=len(batches)))
    dist.barrier()            # e.g. "everyone done? then rank 0 saves the checkpoint"
    runtime.report(batches=len(batches), weight=model.module.weight.detach().flatten().tolist())


def ddp_under_detail(fix: bool = False):
    """Wrap a one-layer model in PyTorch's DDP and take one step (run it with debug="DETAIL")."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = DDP(nn.Linear(4, 4))
    model(torch.ones(2, 4)).sum().backward()
    runtime.report(stepped=True)


def debug_overhead(level: str = "DETAIL", n: int = 300, chunk: int = 10):
    """Time ``n`` small all-reduces on each of two groups of the same ranks: one plain, one created
    with the debug level set to ``level`` (what ``TORCH_DISTRIBUTED_DEBUG=<level>`` does to the
    default group: under DETAIL, ``new_group`` wraps the backend in the checking ``ProcessGroupWrapper``).

    Chunks of ``chunk`` all-reduces alternate between the two groups, so a load on the machine slows
    both alike; each reports its fastest chunk (per all-reduce): noise only ever adds time, so the
    minimum estimates the cost itself, not the neighbours'.
    """
    previous = dist.get_debug_level()
    dist.set_debug_level(dist.DebugLevel.OFF)
    plain = dist.new_group()
    dist.set_debug_level(getattr(dist.DebugLevel, level))
    checked = dist.new_group()
    dist.set_debug_level(previous)
    groups = {"OFF": plain, level: checked}
    t = torch.ones(256)
    for group in groups.values():
        for _ in range(20):
            dist.all_reduce(t, group=group)
    dist.barrier()
    chunks: dict = {level: [] for level in groups}
    for _ in range(max(1, n // chunk)):
        for level, group in groups.items():
            t0 = time.perf_counter()
            for _ in range(chunk):
                dist.all_reduce(t, group=group)
            chunks[level].append((time.perf_counter() - t0) / chunk)
    runtime.report(seconds_per_all_reduce={level: min(c) for level, c in chunks.items()},
                   median_seconds_per_all_reduce={level: sorted(c)[len(c) // 2] for level, c in chunks.items()})

SCENARIOS = {f.__name__: f for f in (mismatched_ops, mismatched_shapes, slow_rank, slow_evaluation, unused_parameters,
                                      uneven_inputs, ddp_under_detail, debug_overhead)}


def main() -> None:
    runtime.current()
    name = sys.argv[1] if len(sys.argv) > 1 else ""
    if name not in SCENARIOS:
        raise SystemExit(f"usage: failures.py {{{'|'.join(SCENARIOS)}}} [--fix]")
    if name == "debug_overhead":
        args = sys.argv[2:]
        SCENARIOS[name](level=args[args.index("--level") + 1] if "--level" in args else "DETAIL")
    else:
        SCENARIOS[name](fix="--fix" in sys.argv[2:])


if __name__ == "__main__":
    runtime.entrypoint(main)
