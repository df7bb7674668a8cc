"""Every ZeRO check in one job: stages 1, 2 and 3 against single-process training, stage 1 against
PyTorch's ``ZeroRedundancyOptimizer``, gradient clipping right and wrong, bf16 with an fp32 master
shard, bytes held and bytes sent (lesson on ZeRO, tests/test_zero.py).

    torchrun --standalone --nproc-per-node 3 -m dtrain_lab.demos.zero_run [steps]

Each rank reports a dict per check; ``max_diff`` is the largest absolute difference between the
parameters after ``steps`` optimizer steps and those of the single-process reference, which trains
an unsharded copy on the concatenation of every rank's batch with a mean loss (the same gradient as
the average of the per-rank mean losses). ``traced`` is what a ``CommDebugMode``
(:class:`dtrain_lab.comm.counted.CommTrace`) saw go through ``torch.distributed``, so that the
``comm_bytes`` a class claims can be checked against what it really called. The cases that
``torch.optim``'s rules decide (frozen and unused parameters, LR schedules, resume) are in
:mod:`dtrain_lab.demos.zero_cases`.
"""
from __future__ import annotations

import copy
import math
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from dtrain_lab import caps
from dtrain_lab.comm.counted import CommTrace
from dtrain_lab.demos import zero_cases
from dtrain_lab.jobs import runtime
from dtrain_lab.models import TinyTransformer
from dtrain_lab.parallel.zero import ShardedOptimizer, ZeroStage3, clip_grad_norm_per_shard_WRONG

PER_RANK_BATCH = 4
LR = 1e-2


class Net127(nn.Module):
    """127 parameters (prime: not divisible by 2 or 3): Linear(6, 11) 77, Linear(11, 4) 48, and a
    root-level parameter of 2 (which ZeroStage3 turns into its own unit)."""

    def __init__(self, seed: int = 0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.l1 = nn.Linear(6, 11)
        self.l2 = nn.Linear(11, 4)
        self.scale = nn.Parameter(torch.ones(2))
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.l2(torch.tanh(self.l1(x))) * self.scale.repeat(2)


def traced(trace) -> dict[str, dict[str, int]]:
    """What went through torch.distributed while ``trace`` (a CommDebugMode) was on: per collective,
    the number of calls and the bytes this rank passed in (all-gather: its shard; reduce-scatter: the
    whole input; reduce: the buffer, on the destination too). The 4-byte all-reduce of a clipping norm
    is left out: ``comm_bytes`` counts the model states only."""
    calls = [c for c in trace.calls if not (c.op == "all_reduce" and c.nbytes == 4)]
    out = {"calls": {}, "bytes": {}}
    for c in calls:
        out["calls"][c.op] = out["calls"].get(c.op, 0) + 1
        out["bytes"][c.op] = out["bytes"].get(c.op, 0) + c.nbytes
    return out


def _merged(ranges: list[tuple[int, int]]) -> list[list[int]]:
    out: list[list[int]] = []
    for a, b in sorted(ranges):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out


def held(flats, optimizer) -> dict[str, list[list[int]]]:
    """What this rank holds when its optimizer steps, read from the objects themselves: element ranges
    ``[a, b)`` of the model's parameters end to end (unpadded) for parameters, gradients and optimizer
    state. ``flats``: the FlatShard of a ShardedOptimizer, or the units' of a ZeroStage3 (one per unit,
    in parameter order). Lesson 05 draws its figure of the stages from these."""
    kinds: dict[str, list] = {"params": [], "grads": [], "optimizer": []}
    base = 0
    for f in flats:
        lo = f.rank * f.shard_numel
        shard = (base + lo, base + min(lo + f.shard_numel, f.numel))
        kinds["params"].append((base, base + f.numel) if f.full.untyped_storage().size() else shard)
        kinds["grads"] += [(base + off, base + off + p.numel()) for p, off in zip(f.params, f.offsets)
                           if p.grad is not None]                        # full gradients still alive
        if f.grad is not None:
            kinds["grads"].append((base + lo, base + min(lo + f.grad.numel(), f.numel)))
        kinds["optimizer"] += [(base + lo + a, base + lo + b) for (_, a, b), pp in zip(f.pieces, f.piece_params)
                               if optimizer.state.get(pp)]
        base += f.numel
    return {k: _merged([r for r in v if r[0] < r[1]]) for k, v in kinds.items()}


def net_batch(n: int, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 6, generator=g), torch.randn(n, 4, generator=g)


def lm_batch(n: int, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 11, (n, 8), generator=g)


def my_slice(t: torch.Tensor, rank: int) -> torch.Tensor:
    return t[rank * PER_RANK_BATCH:(rank + 1) * PER_RANK_BATCH]


def net_loss(model, x, y):
    return F.mse_loss(model(x), y)


def lm_loss(model, toks):
    logits = model(toks[:, :-1])
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), toks[:, 1:].reshape(-1))


def flat_params(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().float().reshape(-1) for p in model.parameters()])


def raw(a: nn.Module | dict) -> dict:
    """The parameters themselves (for tests/test_zero.py, which computes its own reference)."""
    return {k: v.float().tolist() for k, v in (a if isinstance(a, dict) else a.state_dict()).items()}


def max_diff(a: nn.Module | dict, b: nn.Module) -> float:
    sa = a if isinstance(a, dict) else a.state_dict()
    return max((sa[k].float() - v.float()).abs().max().item() for k, v in b.state_dict().items())


def reference(model, batches, loss_fn, steps, opt_class, clip=None, **kw):
    """Single process, unsharded, whole batch: returns (model, per-step grad norms before clipping)."""
    ref = copy.deepcopy(model)
    opt = opt_class(ref.parameters(), **kw)
    norms = []
    for step in range(steps):
        opt.zero_grad()
        loss_fn(ref, *batches[step]).backward()
        if clip is not None:
            norms.append(torch.nn.utils.clip_grad_norm_(ref.parameters(), clip).item())
        opt.step()
    return ref, norms


OPTIMIZERS = {"Adam": (torch.optim.Adam, {"lr": LR}),
              "AdamW": (torch.optim.AdamW, {"lr": LR, "weight_decay": 0.1}),
              "SGD": (torch.optim.SGD, {"lr": LR * 10, "momentum": 0.9})}


def main() -> None:
    rt = runtime.current()
    if not caps.have("cuda"):
        torch.set_num_threads(1)          # CPU ranks share the machine's cores
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    n, r = rt.world_size, rt.rank
    dev = rt.device                   # cuda:<local rank> under nccl, else cpu
    base = Net127(seed=0).to(dev)
    numel = sum(p.numel() for p in base.parameters())
    full = [tuple(t.to(dev) for t in net_batch(n * PER_RANK_BATCH, seed=10 + s)) for s in range(steps)]
    mine = [(my_slice(x, r), my_slice(y, r)) for x, y in full]
    shard = math.ceil(numel / n)
    runtime.report(rank=r, world_size=n, numel=numel, shard_numel=shard, steps=steps)

    # 1. stages 1 and 2 with three optimizers ------------------------------------------------------
    s12 = {}
    for name, (cls, kw) in OPTIMIZERS.items():
        ref, _ = reference(base, full, net_loss, steps, cls, **kw)
        # 1rs: the paper's stage 1 (reduce-scatter); 2b: stage 2 reduced bucket by bucket in backward
        for stage in ("1", "1rs", "2", "2b"):
            model = copy.deepcopy(base)
            with CommTrace() as tr:
                opt = ShardedOptimizer(model.parameters(), cls, stage=int(stage[0]), **kw,
                                       grad_reduce="reduce_scatter" if stage == "1rs" else None,
                                       reduce_in_backward=stage == "2b", bucket_numel=40)
                for step in range(steps):
                    opt.zero_grad()
                    net_loss(model, *mine[step]).backward()
                    opt.reduce_gradients()      # what step() does first: then record what this rank holds
                    holding = held([opt.flat], opt.optimizer)
                    opt.step()
            s12[f"{name}/{stage}"] = {"held": holding,
                "max_diff": max_diff(model, ref), "state_bytes": opt.state_bytes(),
                "state_numel": opt.optimizer_state_numel(), "comm_bytes": opt.comm_bytes,
                "traced": traced(tr), "calls": opt.comm_calls,
                "peak_grad_numel": opt.peak_grad_numel,
                "checksum": flat_params(model).sum().item(), "params": raw(model)}
    runtime.report(stage12=s12)

    # 2. stage 1 against torch.distributed.optim.ZeroRedundancyOptimizer ---------------------------
    from torch.distributed.optim import ZeroRedundancyOptimizer
    ours, theirs = copy.deepcopy(base), copy.deepcopy(base)
    opt_ours = ShardedOptimizer(ours.parameters(), torch.optim.Adam, stage=1, lr=LR)
    opt_theirs = ZeroRedundancyOptimizer(theirs.parameters(), optimizer_class=torch.optim.Adam, lr=LR)
    for step in range(steps):
        opt_ours.zero_grad()
        net_loss(ours, *mine[step]).backward()
        opt_ours.step()
        opt_theirs.zero_grad()
        net_loss(theirs, *mine[step]).backward()
        for p in theirs.parameters():            # what DDP would do: average the gradients
            p.grad.div_(n)
            dist.all_reduce(p.grad)
        opt_theirs.step()
    their_state = sum(v.numel() for st in opt_theirs.optim.state.values() for v in st.values()
                      if torch.is_tensor(v) and v.dim() > 0)
    runtime.report(zero_redundancy={"max_diff": max_diff(ours, theirs), "their_state_numel": their_state,
                                    "our_state_numel": opt_ours.optimizer_state_numel()})

    # 3. clipping: global norm (right) against per-shard norm (WRONG) -------------------------------
    clip = 0.05
    ref, ref_norms = reference(base, full, net_loss, steps, torch.optim.SGD, clip=clip, lr=0.5)
    clipping = {"ref_norms": ref_norms}
    for how in ("right", "wrong"):
        for stage in (1, 2):
            model = copy.deepcopy(base)
            opt = ShardedOptimizer(model.parameters(), torch.optim.SGD, stage=stage, lr=0.5)
            norms = []
            for step in range(steps):
                opt.zero_grad()
                net_loss(model, *mine[step]).backward()
                if how == "right":
                    norms.append(opt.clip_grad_norm_(clip).item())
                else:
                    norms.append(clip_grad_norm_per_shard_WRONG(opt, clip).item())
                opt.step()
            clipping[f"{how}/{stage}"] = {"norms": norms, "max_diff": max_diff(model, ref), "params": raw(model)}
    runtime.report(clipping=clipping)

    # 4. bf16 parameters, fp32 master shard ---------------------------------------------------------
    model = copy.deepcopy(base).to(torch.bfloat16)
    opt = ShardedOptimizer(model.parameters(), torch.optim.Adam, stage=2, lr=LR)
    losses = []
    for step in range(steps):
        opt.zero_grad()
        x, y = mine[step]
        loss = net_loss(model, x.bfloat16(), y.bfloat16())
        loss.backward()
        losses.append(loss.item())
        opt.step()
    lo = r * shard
    mine_now = opt.flat.full[lo:lo + shard]
    runtime.report(bf16={"state_bytes": opt.state_bytes(), "master_dtype": str(opt.master.dtype),
                         "param_dtype": str(next(model.parameters()).dtype),
                         "master_numel": opt.master.numel(),
                         "shard_is_cast_master": torch.equal(mine_now, opt.master.detach().bfloat16()),
                         "checksum": flat_params(model).double().sum().item(), "losses": losses})

    # 5. stage 3 on Net127 (units l1, l2, <root>) with clipping, and on TinyTransformer ---------------
    s3 = {}
    ref, ref_norms = reference(base, full, net_loss, steps, torch.optim.Adam, clip=0.5, lr=LR)
    model = copy.deepcopy(base)
    with CommTrace() as tr:
        z = ZeroStage3(model, torch.optim.Adam, lr=LR)
        norms = []
        for step in range(steps):
            z.zero_grad()
            net_loss(z.module, *mine[step]).backward()
            norms.append(z.clip_grad_norm_(0.5).item())
            holding = held(z.flats, z.optimizer)
            z.step()
    comm = z.comm_bytes                      # before gather_full_state_dict adds its own all-gathers
    gathered = z.gather_full_state_dict()
    s3["net"] = {"held": holding, "max_diff": max_diff(gathered, ref), "norms": norms, "ref_norms": ref_norms,
                 "params": raw(gathered),
                 "units": [(u.name, u.flat.numel, u.flat.shard_numel) for u in z.units],
                 "state_bytes": z.state_bytes(), "state_numel": z.optimizer_state_numel(),
                 "comm_bytes": comm, "traced": traced(tr), "calls": z.comm_calls,
                 "peak_gathered_numel": z.peak_gathered_numel, "peak_gathered_units": z.peak_gathered_units,
                 "params_storage_between_steps": sum(u.flat.full.untyped_storage().size() for u in z.units)}
    tiny = TinyTransformer(vocab=11, d=8, n_heads=2, n_layers=2, max_len=8, seed=0).to(dev)
    toks_full = [(lm_batch(n * PER_RANK_BATCH, seed=20 + s).to(dev),) for s in range(steps)]
    ref, _ = reference(tiny, toks_full, lm_loss, steps, torch.optim.Adam, lr=LR)
    model = copy.deepcopy(tiny)
    z = ZeroStage3(model, torch.optim.Adam, lr=LR)
    for step in range(steps):
        z.zero_grad()
        lm_loss(z.module, my_slice(toks_full[step][0], r)).backward()
        z.step()
    comm = z.comm_bytes
    gathered = z.gather_full_state_dict()
    s3["tiny"] = {"max_diff": max_diff(gathered, ref), "params": raw(gathered),
                  "diff_by_key": {k: (gathered[k] - v).abs().max().item() for k, v in ref.state_dict().items()},
                  "units": [(u.name, u.flat.numel, u.flat.shard_numel) for u in z.units],
                  "numel": sum(p.numel() for p in tiny.parameters()),
                  "state_bytes": z.state_bytes(), "comm_bytes": comm,
                  "peak_gathered_numel": z.peak_gathered_numel, "peak_gathered_units": z.peak_gathered_units}
    runtime.report(stage3=s3)

    # 6. parameters without a gradient, LR schedules and resume: torch.optim's rules --------------
    runtime.report(skips=zero_cases.skips(r, n, dev), resume=zero_cases.resume(r, n, dev), last=True)
    runtime.print0(f"stage 3 TinyTransformer: peak gathered {z.peak_gathered_numel} of "
                   f"{s3['tiny']['numel']} parameters; max diff {s3['tiny']['max_diff']:.2e}")


if __name__ == "__main__":
    runtime.entrypoint(main)
