"""Gradient accumulation under data parallelism equals one large-batch step; ``no_sync`` saves all-reduces.

    torchrun --standalone --nproc-per-node 2 -m dtrain_lab.demos.accum_equivalence [micro] [k] [steps]

Every rank trains the same MLP for ``steps`` optimizer steps; each step takes a global batch of
``B = micro × k × W`` samples, this rank's shard of it, split into ``k`` micro-batches of ``micro``.
The variants, all from the same initial weights on the same data:

* ``single``: the reference, one process, one backward over the whole global batch of B per step;
* ``ours`` / ``torch``: :class:`dtrain_lab.parallel.ddp.DDP` / PyTorch's ``DistributedDataParallel`` with
  ``no_sync()`` around the first k-1 micro-batches;
* ``ours_every`` / ``torch_every``: the same without ``no_sync`` (an all-reduce at every backward);
* ``no_divide``: ours with ``no_sync``, forgetting to divide the loss by k (the bug);
* ``torch_bf16``: PyTorch DDP with ``no_sync`` under bf16 autocast, to see which dtype DDP all-reduces;
* ``scaler``: PyTorch DDP with a ``GradScaler`` where only rank 1's loss becomes inf at step 1.

PyTorch DDP's all-reduces are counted by a communication hook (:mod:`dtrain_lab.parallel.accum`), ours by
``DDP.stats()``. Each rank checks the equalities with ``torch.testing.assert_close`` (a failure fails
the job) and reports the numbers.
"""
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from dtrain_lab import caps
from dtrain_lab.jobs import runtime
from dtrain_lab.parallel.accum import AllReduceCounter, accumulation_step, counting_allreduce_hook, micro_batches
from dtrain_lab.data import global_batch, regression_dataset, shard
from dtrain_lab.parallel.ddp import DDP
from dtrain_lab.models import MLP

LR, MOMENTUM = 0.05, 0.9


def build():
    model = MLP(16, 32, 4, depth=2, seed=0).to(runtime.current().device)
    return model, torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)


def flat(model) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).cpu()


def run_variant(name: str, micro: int, k: int, steps: int) -> dict:
    rt = runtime.current()
    world, dev = rt.world_size, rt.device
    data = regression_dataset(n=512, seed=0)
    model, opt = build()
    if name == "single":
        for step in range(steps):
            x, y = (t.to(dev) for t in global_batch(data, step, micro * k * world))
            opt.zero_grad(set_to_none=True)
            F.mse_loss(model(x), y).backward()  # one mean over all B samples
            opt.step()
        return {"model": model}

    ids = [dev] if torch.device(dev).type == "cuda" else None
    counter = AllReduceCounter()
    if name.startswith("torch") or name == "scaler":
        net = DistributedDataParallel(model, device_ids=ids)
        net.register_comm_hook(counter, counting_allreduce_hook)
    else:
        net = DDP(model)
    bf16 = torch.bfloat16 if name == "torch_bf16" else None
    scaler = torch.amp.GradScaler(torch.device(dev).type, init_scale=1024.0) if name == "scaler" else None
    out: dict = {}
    if scaler is not None:
        out["skipped"], out["scales"] = [], []  # per optimizer step: was it skipped; the scale it used
    for step in range(steps):
        batch = shard(tuple(t.to(dev) for t in global_batch(data, step, micro * k * world)), rt.rank, world)
        loss_fn = F.mse_loss
        if name == "scaler" and step == 1 and rt.rank == 1:
            def loss_fn(out_, y_):  # only rank 1, only this step: its loss (and gradients) overflow
                return F.mse_loss(out_, y_) * float("inf")
        if scaler is not None:
            before = flat(model)
            out["scales"].append(scaler.get_scale())
        accumulation_step(net, opt, micro_batches(batch, k), loss_fn,
                          divide=name != "no_divide", use_no_sync=not name.endswith("_every"),
                          autocast_dtype=bf16, scaler=scaler)
        if scaler is not None:
            out["skipped"].append(bool(torch.equal(before, flat(model))))
    if isinstance(net, DDP):
        s = net.stats()
        out.update(allreduces=s["total_collectives"], allreduce_bytes=s["total_bytes"], sync_steps=s["sync_steps"])
        net.remove_hooks()
    else:
        out.update(allreduces=counter.calls, allreduce_bytes=counter.nbytes, dtypes=counter.as_dict()["dtypes"])
    if scaler is not None:
        out["scales"].append(scaler.get_scale())
    out["param_dtypes"] = sorted({str(p.dtype) for p in model.parameters()})
    out["grad_dtypes"] = sorted({str(p.grad.dtype) for p in model.parameters() if p.grad is not None})
    return {"model": model, **out}


def main() -> None:
    rt = runtime.current()
    argv = [int(a) for a in sys.argv[1:]]
    micro, k, steps = (argv + [8, 4, 3][len(argv):])[:3]
    if not caps.have("cuda"):
        torch.set_num_threads(1)  # CPU ranks share the machine's cores
    world = rt.world_size
    runtime.print0(f"effective batch B = micro-batch {micro} × accumulation steps {k} × world size {world} "
                   f"= {micro * k * world}; {steps} optimizer steps")
    names = ["single", "ours", "torch", "ours_every", "torch_every", "no_divide", "torch_bf16", "scaler"]
    results = {name: run_variant(name, micro, k, steps) for name in names}
    params = {name: flat(results[name].pop("model")) for name in names}
    ref = params["single"]
    report: dict = {"micro": micro, "k": k, "world_size": world, "steps": steps, "global_batch": micro * k * world,
                    "numel": ref.numel(), "backend": rt.backend}
    for name in names[1:]:
        r = results[name]
        r["max_abs_diff"] = (params[name] - ref).abs().max().item()
        theirs = params[name].to(rt.device).clone()
        dist.broadcast(theirs, src=0)  # are the replicas identical?
        r["replicas_identical"] = bool(torch.equal(theirs.cpu(), params[name]))
        report[name] = r
    # The claims, checked on every rank: a failed check fails the job.
    for name in ("ours", "torch", "ours_every", "torch_every"):
        torch.testing.assert_close(params[name], ref, msg=lambda m, n=name: f"{n} differs from single: {m}")
    assert not torch.allclose(params["no_divide"], ref, atol=1e-3), "forgetting to divide by k changed nothing?"
    assert results["torch_bf16"]["dtypes"] == {"torch.float32": steps}, results["torch_bf16"]["dtypes"]
    assert results["scaler"]["skipped"] == [False, True] + [False] * (steps - 2), results["scaler"]["skipped"]
    runtime.report(**report)


if __name__ == "__main__":
    runtime.entrypoint(main)
