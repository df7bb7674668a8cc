"""``zero_memory``: what a rank really holds at its peak, against the ZeRO paper's formula.

    torchrun --standalone --nproc-per-node 2 -m dtrain_lab.bench.memory      # the ranks' program

Each variant trains an MLP of 3.1 M parameters (fp32, Adam) for one step to create the optimizer state,
then one more step inside :class:`~dtrain_lab.bench.memtrack.PeakTensorMemory`: forward, backward,
``step()``, ``zero_grad()``. Reported per variant and rank: the peak of live tensor bytes, what was
alive at that moment (parameters, gradients, optimizer state, other = activations, temporaries and
communication buffers), where it happened (the operator), the model states the optimizer keeps
between steps (``state_bytes()``) and :func:`dtrain_lab.perfmodel.zero_memory`'s prediction. Variants:
``zero1``, ``zero2`` (gradients reduced in ``step()``), ``zero2b`` (reduced in backward, bucket by
bucket), ``zero3`` (:mod:`dtrain_lab.parallel.zero`) and ``fsdp2`` (``fully_shard`` on every Linear, then
the root). Why the peak exceeds the formula is stated per variant in the row's note (bench table).
"""
from __future__ import annotations

import gc

import torch

from dtrain_lab.bench.memtrack import PeakTensorMemory
from dtrain_lab.jobs import runtime
from dtrain_lab.jobs.launch import launch
from dtrain_lab.models import MLP, count_params
from dtrain_lab.parallel.fsdp import shard_model, sharded_state_bytes
from dtrain_lab.parallel.zero import ShardedOptimizer, ZeroStage3
from dtrain_lab.perfmodel import zero_memory

MLP_SHAPE = dict(d_in=1024, d_hidden=1024, d_out=1024, depth=2)   # 3 148 800 parameters
VARIANTS = {"zero1": 1, "zero2": 2, "zero2b": 2, "zero3": 3, "fsdp2": 3}
BATCH = 8


def _build(kind: str):
    """(module to call, object with step/zero_grad, wrapped torch optimizer, classify callback)."""
    model = MLP(**MLP_SHAPE, seed=0)
    if kind == "fsdp2":
        shard_model(model)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        return model, opt, opt, lambda: {"params": [model], "grads": [p.grad for p in model.parameters()
                                                                       if p.grad is not None],
                                          "optimizer": [opt]}
    if kind == "zero3":
        z = ZeroStage3(model, torch.optim.Adam, lr=1e-3)
        return z.module, z, z.optimizer, lambda: {
            "params": [t for f in z.flats for t in (f.shard, f.full)],
            "grads": [f.grad for f in z.flats if f.grad is not None] + [model],
            "optimizer": [z.optimizer]}
    opt = ShardedOptimizer(model.parameters(), torch.optim.Adam, stage=VARIANTS[kind], lr=1e-3,
                           reduce_in_backward=kind == "zero2b", bucket_numel=2 ** 18)
    return model, opt, opt.optimizer, lambda: {
        "params": [opt.flat.full],
        "grads": [t for t in (opt.flat.grad, opt._full_grad) if t is not None]
                 + [p.grad for p in model.parameters() if p.grad is not None],
        "optimizer": [opt.optimizer]}


def measure(kind: str, rank: int, world: int) -> dict:
    module, opt, inner, classify = _build(kind)
    n = count_params(module)
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(BATCH, MLP_SHAPE["d_in"], generator=g)
    module(x).square().mean().backward()      # step 1 outside: Adam's state exists from now on
    opt.step()
    opt.zero_grad()
    gc.collect()
    mem = PeakTensorMemory(classify)
    with mem:
        mem.track(module, inner, x, *classify()["params"])
        module(x).square().mean().backward()
        opt.step()
        held = opt.state_bytes() if hasattr(opt, "state_bytes") else sharded_state_bytes(module, inner)
        opt.zero_grad()
    pred = zero_memory(n, VARIANTS[kind], world, precision="fp32")
    return {"num_params": n, "peak": mem.peak, "peak_parts": mem.peak_parts, "peak_op": mem.peak_op,
            "peak_other": mem.peak_other,
            "state_bytes": {k: int(v) for k, v in held.items()}, "predicted": pred,
            "ratio": mem.peak / pred["total"]}


def main() -> None:
    rt = runtime.current()
    torch.set_num_threads(1)                 # CPU ranks share the machine's cores
    out = {}
    for kind in VARIANTS:
        out[kind] = measure(kind, rt.rank, rt.world_size)
        gc.collect()
    runtime.report(memory=out, backend=rt.backend, world_size=rt.world_size, last=True)


def zero_memory_row(nproc: int = 2) -> dict:
    """Launch :func:`main` on ``nproc`` CPU ranks; per variant the worst rank's peak / formula."""
    r = launch("dtrain_lab.bench.memory", nproc=nproc, timeout=300, quiet=True)
    if not r.ok:
        raise RuntimeError(r.summary())
    ms = [r.metrics[k]["memory"] for k in sorted(r.metrics)]
    variants = {}
    for kind in VARIANTS:
        worst = max((m[kind] for m in ms), key=lambda v: v["peak"])
        variants[kind] = {**worst, "peaks": [m[kind]["peak"] for m in ms]}
    return {"name": "zero_memory", "nproc": nproc, "backend": r.metrics[0]["backend"],
            "num_params": ms[0]["zero1"]["num_params"], "variants": variants}


if __name__ == "__main__":
    runtime.entrypoint(main)
