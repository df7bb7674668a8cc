"""The ZeRO checks torch.optim's own rules decide: parameters without a gradient, LR schedules, resume.

Run by :mod:`dtrain_lab.demos.zero_run` (one launch per world size in tests/test_zero.py):

* :func:`skips` — a model with a frozen layer, a branch used on even steps only, a gate used on steps
  ``% 3 != 1`` and (stages 1/2) an embedding tied to the output layer, trained with Adam and AdamW
  under a StepLR schedule by every stage, by PyTorch's ``ZeroRedundancyOptimizer`` and by one process
  with ``torch.optim`` on the whole batch. ``torch.optim`` leaves a parameter without a gradient alone
  (no update, no weight decay, no step count): the sharded runs must end on the same parameters.
* :func:`resume` — stop after half the steps, save the model, the optimizer's ``state_dict()`` (through
  ``torch.save``) and the scheduler's, rebuild everything from another initialisation, load, finish:
  the parameters must equal an uninterrupted run bit for bit.
"""
from __future__ import annotations

import copy
import io

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from dtrain_lab.parallel.zero import ShardedOptimizer, ZeroStage3

VOCAB, D, SEQ = 7, 5, 4
STAGES = ("1", "1rs", "2", "2b", "3")


class Mixed(nn.Module):
    """Embedding → frozen Linear → Linear → (+ branch on even steps) → (× gate unless step % 3 == 1)
    → head. ``tied``: the head's weight is the embedding's (133 parameters then, 168 untied)."""

    def __init__(self, tied: bool, seed: int = 0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.embed = nn.Embedding(VOCAB, D)
        self.frozen = nn.Linear(D, D)
        self.l1 = nn.Linear(D, D)
        self.branch = nn.Linear(D, D)
        self.gate = nn.Parameter(torch.ones(1))
        self.head = nn.Linear(D, VOCAB)
        if tied:
            self.head.weight = self.embed.weight
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
        self.frozen.requires_grad_(False)

    def forward(self, tokens: torch.Tensor, step: int) -> torch.Tensor:
        h = torch.tanh(self.l1(self.frozen(self.embed(tokens))))
        if step % 2 == 0:
            h = h + self.branch(h)
        if step % 3 != 1:
            h = h * self.gate
        return self.head(h)


def batches(n: int, steps: int, per_rank: int, device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(42)
    return [(torch.randint(0, VOCAB, (n * per_rank, SEQ), generator=g).to(device),
             torch.randint(0, VOCAB, (n * per_rank, SEQ), generator=g).to(device)) for _ in range(steps)]


def loss_fn(model: nn.Module, step: int, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(model(x, step).reshape(-1, VOCAB), y.reshape(-1))


def mine(t: torch.Tensor, rank: int, per_rank: int) -> torch.Tensor:
    return t[rank * per_rank:(rank + 1) * per_rank]


def build(stage: str, model: nn.Module, cls, kw: dict, tied: bool):
    """(optimizer-like object, the module to call) for one of :data:`STAGES`."""
    if stage == "3":   # a tied weight is shared by two units: leave them to the root unit
        z = ZeroStage3(model, cls, units=[model.l1, model.branch] if tied else None, **kw)
        return z, z.optimizer
    opt = ShardedOptimizer(model.parameters(), cls, stage=int(stage[0]), **kw, bucket_numel=40,
                           grad_reduce="reduce_scatter" if stage == "1rs" else None,
                           reduce_in_backward=stage == "2b")
    return opt, opt


def full_params(opt, model: nn.Module) -> dict[str, torch.Tensor]:
    sd = opt.gather_full_state_dict() if isinstance(opt, ZeroStage3) else model.state_dict()
    return {k: v.detach().clone() for k, v in sd.items()}


def max_diff(a: dict, b: dict) -> float:
    return max((a[k].float() - b[k].float()).abs().max().item() for k in b)


def step_counts(opt, model: nn.Module) -> dict[str, list[int]]:
    """Adam's ``step`` of every piece this rank updates, by parameter name (missing: never updated)."""
    names = {id(p): n for n, p in model.named_parameters(remove_duplicate=False)}
    flats = opt.flats if isinstance(opt, ZeroStage3) else [opt.flat]
    out: dict[str, set] = {}
    for flat in flats:
        for (i, _, _), pp in zip(flat.pieces, flat.piece_params):
            st = opt.optimizer.state.get(pp, {})
            if "step" in st:
                out.setdefault(names[id(flat.params[i])], set()).add(int(st["step"]))
    return {k: sorted(v) for k, v in out.items()}


def train(opt, sched, model, data, rank, per_rank, steps) -> None:
    for step in steps:
        opt.zero_grad()
        x, y = data[step]
        loss_fn(model, step, mine(x, rank, per_rank), mine(y, rank, per_rank)).backward()
        opt.step()
        sched.step()


OPTS = {"Adam": (torch.optim.Adam, {"lr": 0.05}), "AdamW": (torch.optim.AdamW, {"lr": 0.05, "weight_decay": 0.1})}


def skips(rank: int, n: int, device, steps: int = 4, per_rank: int = 3) -> dict:
    from torch.distributed.optim import ZeroRedundancyOptimizer

    data = batches(n, steps, per_rank, device)
    out = {}
    for name, (cls, kw) in OPTS.items():
        for tied in (True, False):
            base = Mixed(tied).to(device)
            frozen0 = {k: v.clone() for k, v in base.frozen.state_dict().items()}
            ref = copy.deepcopy(base)
            ropt = cls(ref.parameters(), **kw)
            rsched = torch.optim.lr_scheduler.StepLR(ropt, step_size=2, gamma=0.5)
            train(ropt, rsched, ref, data, 0, n * per_rank, range(steps))
            want = {k: v.detach().clone() for k, v in ref.state_dict().items()}
            tag = "tied" if tied else "untied"
            for stage in STAGES:
                if not tied and stage != "3":
                    continue     # every stage on the tied model, stage 3 on the untied one too
                model = copy.deepcopy(base)
                opt, sched_opt = build(stage, model, cls, kw, tied)
                sched = torch.optim.lr_scheduler.StepLR(sched_opt, step_size=2, gamma=0.5)
                train(opt, sched, model, data, rank, per_rank, range(steps))
                got = full_params(opt, model)
                out[f"{name}/{stage}/{tag}"] = {
                    "max_diff": max_diff(got, want),
                    "frozen_unchanged": all(torch.equal(got[f"frozen.{k}"], v) for k, v in frozen0.items()),
                    "steps": step_counts(opt, model), "lr": sched_opt.param_groups[0]["lr"]}
            if tied:   # PyTorch's ZeroRedundancyOptimizer, with the gradients averaged as DDP would
                theirs = copy.deepcopy(base)
                zro = ZeroRedundancyOptimizer(theirs.parameters(), optimizer_class=cls, **kw)
                zsched = torch.optim.lr_scheduler.StepLR(zro, step_size=2, gamma=0.5)
                for step in range(steps):
                    zro.zero_grad()
                    x, y = data[step]
                    loss_fn(theirs, step, mine(x, rank, per_rank), mine(y, rank, per_rank)).backward()
                    for p in theirs.parameters():
                        if p.grad is not None:
                            p.grad.div_(n)
                            dist.all_reduce(p.grad)
                    zro.step()
                    zsched.step()
                got = {k: v.detach().clone() for k, v in theirs.state_dict().items()}
                out[f"{name}/zero_redundancy/{tag}"] = {
                    "max_diff": max_diff(got, want),
                    "frozen_unchanged": all(torch.equal(got[f"frozen.{k}"], v) for k, v in frozen0.items())}
    return out


def _roundtrip(obj):
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=False)


def resume(rank: int, n: int, device, steps: int = 4, per_rank: int = 3) -> dict:
    """Per stage (and bf16 stage 2): max |uninterrupted - resumed| over the parameters (0 expected)."""
    data = batches(n, steps, per_rank, device)
    cls, kw = OPTS["AdamW"]
    out = {}
    for stage in ("1", "2", "2b", "3", "2-bf16"):
        kind, dtype = ("2", torch.bfloat16) if stage == "2-bf16" else (stage, torch.float32)
        runs = []
        for stop in (None, steps // 2):
            model = Mixed(tied=False).to(device, dtype)
            opt, sched_opt = build(kind, model, cls, kw, tied=False)
            sched = torch.optim.lr_scheduler.StepLR(sched_opt, step_size=1, gamma=0.7)
            train(opt, sched, model, data, rank, per_rank, range(steps if stop is None else stop))
            if stop is not None:         # save, rebuild from another initialisation, load, finish
                saved = _roundtrip({"model": model.state_dict() if kind != "3" else None, "opt": opt.state_dict(),
                                    "sched": sched.state_dict()})
                model = Mixed(tied=False, seed=1).to(device, dtype)
                opt, sched_opt = build(kind, model, cls, kw, tied=False)
                if kind != "3":          # stage 3: the optimizer's state dict holds the shards
                    model.load_state_dict(saved["model"])
                opt.load_state_dict(saved["opt"])
                sched = torch.optim.lr_scheduler.StepLR(sched_opt, step_size=1, gamma=0.7)
                sched.load_state_dict(saved["sched"])
                train(opt, sched, model, data, rank, per_rank, range(stop, steps))
            runs.append(full_params(opt, model))
        out[stage] = max_diff(runs[1], runs[0])
    return out
