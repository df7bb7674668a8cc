"""FSDP2 facts in one job: equivalence with single-process training, bytes per rank, checkpoints,
bf16 mixed precision, and model-state bytes against the ZeRO formula (lesson on ZeRO/FSDP, tests, bench).

    torchrun --standalone --nproc-per-node 2 -m dtrain_lab.demos.fsdp_run [sections] [steps]

``sections`` is a comma-separated list (default ``train``):

* ``train`` — a :class:`~dtrain_lab.models.TinyTransformer` sharded with
  :func:`dtrain_lab.parallel.fsdp.shard_model` trains ``steps`` Adam steps, each rank on its slice of a
  global batch; every rank also trains an unsharded copy on the whole batch (the single-process
  reference). Reports the parameter and loss differences, the bytes each rank holds, a DCP
  checkpoint round trip (into a model initialised differently), and a bf16 mixed-precision run.
* ``memory`` — an MLP of ~3.2 M parameters (padding negligible) sharded with FSDP2, one Adam step;
  reports this rank's counted model-state bytes and :func:`dtrain_lab.perfmodel.zero_memory`'s
  prediction for stage 3, fp32.
* ``zero`` — the same for ``dtrain_lab.parallel.zero`` (stages 1, 2: ``ShardedOptimizer``; 3: ``ZeroStage3``)
  against ``zero_memory(stage, precision="fp32")``.

These count the model states a rank keeps between steps. What a rank holds at its *peak* (full
gradients before a reduce, gathered units, communication buffers) is the bench's ``zero_memory`` row
(:mod:`dtrain_lab.bench.memory`).

The equivalence check has one stated exception: the key projection's bias gets a gradient that is
zero in exact arithmetic (softmax ignores a constant added to a row of scores), i.e. rounding noise,
which Adam scales up to lr-sized steps; ``ref_grad_max`` is reported so that a test can single those
parameters out by their gradient, not by name.
"""
import os
import shutil
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.nn.functional as F

from dtrain_lab import caps
from dtrain_lab.jobs import runtime
from dtrain_lab.parallel.fsdp import (PARTIAL_SUFFIX, checkpoint_complete, full_state_dict, load_checkpoint,
                             save_checkpoint, shard_model, sharded_state_bytes)
from dtrain_lab.i18n import LabError
from dtrain_lab.models import MLP, TinyTransformer, count_params
from dtrain_lab.parallel.zero import ShardedOptimizer, ZeroStage3
from dtrain_lab.perfmodel import zero_memory

CFG = dict(vocab=32, d=32, n_heads=2, n_layers=2, max_len=8)
PER_RANK_BATCH = 4
LR = 1e-2
MEMORY_MLP = dict(d_in=1024, d_hidden=1024, d_out=1024, depth=2)   # 3 148 800 parameters


def global_batch(step: int, world: int) -> torch.Tensor:
    """The same (world × PER_RANK_BATCH, T) token batch on every rank; rank r trains on rows r·B … ."""
    g = torch.Generator().manual_seed(1000 + step)
    return torch.randint(0, CFG["vocab"], (world * PER_RANK_BATCH, CFG["max_len"]), generator=g)


def lm_loss(model, tokens: torch.Tensor) -> torch.Tensor:
    logits = model(tokens[:, :-1])
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), tokens[:, 1:].reshape(-1))


def local_rows(tokens: torch.Tensor, rank: int) -> torch.Tensor:
    return tokens[rank * PER_RANK_BATCH:(rank + 1) * PER_RANK_BATCH]


def mean_over_ranks(x: torch.Tensor) -> float:
    x = x.detach().clone()
    dist.all_reduce(x)
    return x.item() / dist.get_world_size()


def fsdp_step(model, opt, tokens, rank) -> float:
    loss = lm_loss(model, local_rows(tokens, rank))
    loss.backward()
    opt.step()
    return mean_over_ranks(loss)


def max_diff(a: dict, b: dict) -> float:
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)


def all_equal(a: dict, b: dict) -> bool:
    return sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in a)


def moments_bytes(opt) -> int:
    """Bytes of Adam's exp_avg and exp_avg_sq local shards (the ``step`` counters left out)."""
    from torch.distributed.tensor import DTensor

    total = 0
    for state in opt.state.values():
        for key in ("exp_avg", "exp_avg_sq"):
            t = state[key]
            t = t.to_local() if isinstance(t, DTensor) else t
            total += t.numel() * t.element_size()
    return total


def train_section(rt, steps: int) -> None:
    rank, world = rt.rank, rt.world_size
    # single-process reference: the whole global batch, no sharding
    dev = rt.device
    ref = TinyTransformer(**CFG, seed=0).to(dev)
    ref_opt = torch.optim.Adam(ref.parameters(), lr=LR)
    shapes = {n: list(p.shape) for n, p in ref.named_parameters()}
    model = shard_model(TinyTransformer(**CFG, seed=0))
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    ref_losses, losses, ref_grad_max = [], [], {}
    for step in range(steps):
        tokens = global_batch(step, world).to(dev)
        loss = lm_loss(ref, tokens)
        loss.backward()
        for name, p in ref.named_parameters():
            ref_grad_max[name] = max(ref_grad_max.get(name, 0.0), p.grad.abs().max().item())
        ref_opt.step()
        ref_opt.zero_grad(set_to_none=True)
        ref_losses.append(loss.item())
        if step:
            opt.zero_grad(set_to_none=True)
        losses.append(fsdp_step(model, opt, tokens, rank))
    # bytes held after the last step (gradients still there)
    held = sharded_state_bytes(model, opt)
    moments = moments_bytes(opt)
    full = full_state_dict(model)
    ref_sd = {k: v.detach().cpu().clone() for k, v in ref.state_dict().items()}
    equiv = {}
    if rank == 0:
        equiv = {"max_param_diff": max_diff(full, ref_sd), "same_keys": sorted(full) == sorted(ref_sd),
                 "per_key": {k: (full[k] - ref_sd[k]).abs().max().item() for k in full}}
    local_shapes = {n: list(p.to_local().shape) for n, p in model.named_parameters()}
    runtime.report(steps=steps, losses=losses, ref_losses=ref_losses, ref_grad_max=ref_grad_max, equiv=equiv, held=held,
                   moments_bytes=moments, shapes=shapes, local_shapes=local_shapes,
                   num_params=count_params(ref), param_type=type(next(model.parameters())).__name__,
                   placements=str(next(model.parameters()).placements))

    # ---- checkpoint round trip (into a model initialised with another seed)
    tmp = [tempfile.mkdtemp(prefix="dtrain_fsdp_") if rank == 0 else None]
    dist.broadcast_object_list(tmp, src=0)
    path = f"{tmp[0]}/ckpt"
    ck: dict = {}
    try:
        opt.zero_grad(set_to_none=True)
        save_checkpoint(model, opt, path)
        ck["no_partial_left"] = not os.path.exists(path + PARTIAL_SUFFIX)
        ck["complete"] = checkpoint_complete(path)
        fresh = shard_model(TinyTransformer(**CFG, seed=123))
        fresh_opt = torch.optim.Adam(fresh.parameters(), lr=LR)
        before = full_state_dict(fresh)
        load_checkpoint(fresh, fresh_opt, path)
        after = full_state_dict(fresh)
        if rank == 0:
            ck["differed_before_load"] = not all_equal(before, full)
            ck["params_equal_after_load"] = all_equal(after, full)
        # the next step from both: same loss, same parameters after it (Adam's m, v, step restored)
        tokens = global_batch(steps, world).to(dev)
        ck["next_loss"] = fsdp_step(model, opt, tokens, rank)
        ck["next_loss_loaded"] = fsdp_step(fresh, fresh_opt, tokens, rank)
        a, b = full_state_dict(model), full_state_dict(fresh)
        if rank == 0:
            ck["params_equal_after_next_step"] = all_equal(a, b)
        # without the optimizer state the next step differs (the check above can fail)
        bare = shard_model(TinyTransformer(**CFG, seed=123))
        bare_opt = torch.optim.Adam(bare.parameters(), lr=LR)
        load_checkpoint(bare, None, path)   # parameters only: fresh Adam state
        bare_opt.zero_grad(set_to_none=True)
        _ = fsdp_step(bare, bare_opt, tokens, rank)
        c = full_state_dict(bare)
        if rank == 0:
            ck["fresh_adam_differs"] = not all_equal(a, c)
        # overwrite in place, then an interrupted save next to it
        opt.zero_grad(set_to_none=True)
        save_checkpoint(model, opt, path)
        again = shard_model(TinyTransformer(**CFG, seed=7))
        again_opt = torch.optim.Adam(again.parameters(), lr=LR)
        load_checkpoint(again, again_opt, path)
        d = full_state_dict(again)
        if rank == 0:
            ck["overwrite_loads_newest"] = all_equal(d, a)
            shutil.copytree(path, f"{tmp[0]}/half{PARTIAL_SUFFIX}")   # what a crash mid-save leaves
        dist.barrier()
        ck["partial_is_complete"] = checkpoint_complete(f"{tmp[0]}/half{PARTIAL_SUFFIX}")
        try:
            load_checkpoint(again, again_opt, f"{tmp[0]}/half")
            ck["partial_refused"] = False
        except LabError as exc:
            ck["partial_refused"] = exc.key == "fsdp_no_checkpoint"
    finally:
        dist.barrier()
        if rank == 0:
            shutil.rmtree(tmp[0], ignore_errors=True)
    runtime.report(checkpoint=ck)

    # ---- bf16 mixed precision: compute in bf16, shards (and the optimizer's update) stay fp32
    mp = shard_model(TinyTransformer(**CFG, seed=0), mixed_precision="bf16")
    mp_opt = torch.optim.Adam(mp.parameters(), lr=LR)
    seen = {}

    def record(module, args):
        seen.setdefault("compute_dtype", str(module.weight.dtype))

    hook = mp.blocks[0].fc1.register_forward_pre_hook(record)
    mp_losses = []
    for step in range(steps):
        if step:
            mp_opt.zero_grad(set_to_none=True)
        mp_losses.append(fsdp_step(mp, mp_opt, global_batch(step, world).to(dev), rank))
    hook.remove()
    mp_full = full_state_dict(mp)
    mpr = {"losses": mp_losses, "compute_dtype": seen.get("compute_dtype"),
           "param_dtypes": sorted({str(p.dtype) for p in mp.parameters()}),
           "local_dtypes": sorted({str(p.to_local().dtype) for p in mp.parameters()}),
           "grad_dtypes": sorted({str(p.grad.dtype) for p in mp.parameters() if p.grad is not None}),
           "loss_gap": max(abs(a - b) for a, b in zip(mp_losses, losses))}
    if rank == 0:
        mpr["max_param_diff_vs_fp32"] = max_diff(mp_full, full)
    runtime.report(bf16=mpr)


def memory_section(rt) -> None:
    """Counted per-rank model-state bytes of FSDP2 (fp32 + Adam) against zero_memory(stage=3, "fp32")."""
    model = MLP(**MEMORY_MLP, seed=0)
    n = count_params(model)
    shard_model(model)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(rt.rank)
    x = torch.randn(8, MEMORY_MLP["d_in"], generator=g).to(rt.device)
    model(x).square().mean().backward()
    opt.step()                       # Adam's state exists only after the first step
    held = sharded_state_bytes(model, opt)
    pred = zero_memory(n, 3, rt.world_size, precision="fp32")
    measured = held["params"] + held["grads"] + held["optimizer"]
    runtime.report(memory={"num_params": n, "measured": held, "measured_total": measured, "predicted": pred,
                           "ratio": measured / pred["total"],
                           "ratios": {k: held[k] / pred[k] for k in ("params", "grads", "optimizer")}})


def zero_section(rt) -> None:
    """The same measurement for dtrain_lab.parallel.zero (ZeRO 1 and 2: ShardedOptimizer, 3: ZeroStage3)."""
    g = torch.Generator().manual_seed(rt.rank)
    x = torch.randn(8, MEMORY_MLP["d_in"], generator=g).to(rt.device)
    rows = {}
    for stage in (1, 2, 3):
        model = MLP(**MEMORY_MLP, seed=0).to(rt.device)
        n = count_params(model)
        if stage < 3:
            opt = ShardedOptimizer(model.parameters(), torch.optim.Adam, stage=stage, lr=1e-3)
            fwd = model
        else:
            opt = ZeroStage3(model, torch.optim.Adam, lr=1e-3)
            fwd = opt.module
        fwd(x).square().mean().backward()
        opt.step()
        held = {k: int(v) for k, v in opt.state_bytes().items()}
        pred = zero_memory(n, stage, rt.world_size, precision="fp32")
        measured = sum(held.values())
        rows[str(stage)] = {"num_params": n, "measured": held, "measured_total": measured, "predicted": pred,
                            "ratio": measured / pred["total"]}
        del model, opt, fwd
    runtime.report(zero=rows)


def main() -> None:
    rt = runtime.current()
    if not caps.have("cuda"):
        torch.set_num_threads(1)  # CPU ranks share the machine's cores
    sections = (sys.argv[1] if len(sys.argv) > 1 else "train").split(",")
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    if "train" in sections:
        train_section(rt, steps)
    if "memory" in sections:
        memory_section(rt)
    if "zero" in sections:
        zero_section(rt)
    runtime.report(rank=rt.rank, world_size=rt.world_size, backend=rt.backend, sections=sections, last=True)


if __name__ == "__main__":
    runtime.entrypoint(main)
