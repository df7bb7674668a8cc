"""Lesson 02 §2: four ways to run data parallelism on the same model and the same global batches.

    torchrun --standalone --nproc-per-node 2 -m dtrain_lab.demos.dp_equivalence [steps]

Every rank builds ``MLP(16, 32, 4, depth=2, seed=0)`` and trains it with SGD on its shard of global
batches of 16 samples of ``regression_dataset(seed=0)``, once per variant:

* ``naive`` — no wrapper; after ``loss.backward()``, one blocking all-reduce per parameter
  (:func:`dtrain_lab.parallel.ddp.naive_allreduce_grads`);
* ``one_bucket`` — :class:`dtrain_lab.parallel.ddp.DDP` with the default 25 MiB cap: the whole model in one bucket;
* ``buckets`` — our DDP with a 0.0005 MiB (524-byte) cap: three buckets, launched from the gradient hooks
  while backward still runs; ``buckets_no_overlap`` — the same buckets, reduced after backward;
* ``torch`` — ``torch.nn.parallel.DistributedDataParallel`` with the same 0.0005 MiB cap; a communication
  hook that wraps PyTorch's ``allreduce_hook`` counts the buckets it reduces (no patching of ``dist``).

Each rank reports, per variant, its final parameters (flattened) and what was communicated per step;
for ``buckets`` and ``buckets_no_overlap`` also the events of the last step's backward
(:attr:`DDP.on_event <dtrain_lab.parallel.ddp.DDP>`: gradients ready, buckets launched, waited for and
done), each with its time in seconds since ``backward()`` was called;
the notebook compares them with single-process training on the whole global batches. Then the
unused-parameter case: a step in which ``BranchMLP``'s branch is skipped, first with our default DDP
(a :class:`~dtrain_lab.parallel.ddp.DDPError` at the end of backward, reported, not raised), then with
``find_unused_parameters=True``.
"""
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel

from dtrain_lab import caps
from dtrain_lab.jobs import runtime
from dtrain_lab.data import global_batch, regression_dataset, shard
from dtrain_lab.parallel.ddp import DDP, DDPError, naive_allreduce_grads
from dtrain_lab.models import MLP, BranchMLP

GLOBAL_BATCH, LR, SMALL_CAP_MB = 16, 0.1, 0.0005


def make_model() -> MLP:
    return MLP(16, 32, 4, depth=2, seed=0)   # same seed: the same initial weights on every rank


def flat(model: torch.nn.Module) -> list:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).tolist()


def counting_allreduce(calls: dict, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """A DDP communication hook: PyTorch's own all-reduce hook, counted once per bucket."""
    calls["n"] += 1
    return default_hooks.allreduce_hook(None, bucket)   # None: the default process group


def train(variant: str, steps: int) -> dict:
    rt = runtime.current()
    calls = {"n": 0}
    model = make_model().to(rt.device)
    if variant == "naive":
        net = model
    elif variant == "torch":
        net = DistributedDataParallel(model, bucket_cap_mb=SMALL_CAP_MB)
        net.register_comm_hook(calls, counting_allreduce)   # counts the buckets PyTorch reduces
    else:
        cap = 25.0 if variant == "one_bucket" else SMALL_CAP_MB
        net = DDP(model, bucket_cap_mb=cap, overlap=variant != "buckets_no_overlap")
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    data = regression_dataset(n=256, d_in=16, d_out=4, seed=0)
    per_step, events, start = [], [], [0.0]
    if variant in ("buckets", "buckets_no_overlap"):    # the timing is the demo's, not DDP's
        net.on_event = lambda e: events.append({**e, "t": time.perf_counter() - start[0]})
    for step in range(steps):
        x, y = (t.to(rt.device) for t in shard(global_batch(data, step, GLOBAL_BATCH), rt.rank, rt.world_size))
        opt.zero_grad(set_to_none=True)
        loss = F.mse_loss(net(x), y)            # mean over this rank's shard
        events.clear()
        start[0] = time.perf_counter()
        loss.backward()
        if variant == "naive":
            per_step.append(naive_allreduce_grads(model)["collectives"])
        elif variant == "torch":
            per_step.append(calls["n"])
            calls["n"] = 0
        else:
            per_step.append(net.stats()["step_collectives"])
        opt.step()
    out = {"params": flat(model), "collectives_per_step": per_step}
    if variant in ("buckets", "buckets_no_overlap"):
        dist.barrier()          # every bucket's completion callback has run (the last step's events)
        out["events"] = list(events)
    if isinstance(net, DDP):
        s = net.stats()
        out.update(buckets=s["bucket_params"], bucket_bytes=[4 * n for n in s["bucket_numels"]],
                   launched_in_backward=s["launched_in_backward"],
                   init_collectives=s["init_collectives"], step_bytes=s["step_bytes"])
    elif variant == "torch":
        logged = net._get_ddp_logging_data()
        out.update(first_bucket_bytes=logged.get("bucket_sizes"),       # iteration 0: one bucket
                   rebuilt_bucket_bytes=logged.get("rebuilt_bucket_sizes"))
    return out


def unused_parameters() -> dict:
    """A step that skips BranchMLP's branch: without, then with find_unused_parameters."""
    rt = runtime.current()
    x = torch.randn(8, 16, generator=runtime.data_generator(seed=1)).to(rt.device)
    found = {}
    ddp = DDP(BranchMLP(seed=0).to(rt.device))
    try:
        ddp(x, use_branch=False).pow(2).mean().backward()
        found["error"] = None
    except DDPError as e:               # raised at the end of backward, on every rank
        found["error"] = str(e).splitlines()[0]   # the learner's language (DTRAIN_LANG) comes first
    fixed = DDP(BranchMLP(seed=0).to(rt.device), find_unused_parameters=True)
    fixed(x, use_branch=False).pow(2).mean().backward()
    s = fixed.stats()
    found.update(fixed_unused=s["globally_unused"], fixed_collectives=s["step_collectives"],
                 fixed_buckets=s["num_buckets"], branch_grad_is_none=fixed.module.branch.weight.grad is None)
    return found


def main() -> None:
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    if not caps.have("cuda"):
        torch.set_num_threads(1)  # two CPU ranks share the machine's cores
    results = {v: train(v, steps) for v in ("naive", "one_bucket", "buckets", "buckets_no_overlap", "torch")}
    runtime.report(steps=steps, global_batch=GLOBAL_BATCH, lr=LR, variants=results, unused=unused_parameters())


if __name__ == "__main__":
    runtime.entrypoint(main)
