"""Lab 05 — a ZeRO-1 optimizer by hand: the contract of its three exercises (what a submission may import).

Three exercises, each a function or class the learner writes in the lab notebook
(``solutions/_source/lab_05_zero.md``), following ZeRO stage 1 (Rajbhandari, Rasley, Ruwase & He,
"ZeRO: Memory Optimizations Toward Training Trillion Parameter Models", SC 2020, §5.1, P_os):

1. ``shard_bounds(numel, rank, world_size) -> (start, end)``: the flat parameter vector is padded to
   ``world_size × ceil(numel / world_size)`` elements and cut into equal shards; rank ``r`` owns the
   real elements ``[start, end)`` of its shard (a pure function, graded on one rank, on cases drawn
   for every grade);
2. ``Zero1Adam(params, lr, betas, eps, weight_decay, group=None).step()``: average the gradients
   (reduce-scatter: each rank receives the sum of its shard only), run Adam on the rank's shard with
   the rank's shard of the state (``self.state``), all-gather the updated shards into every parameter
   (2 and 3 ranks). Like ``torch.optim.Adam``, a parameter whose ``.grad`` is ``None`` (frozen, or
   unused in this step) is left alone: its values, moments and step count do not change;
3. ``clip_grad_norm_sharded(grad_shard, max_norm, group=None)``: global-norm clipping when every
   rank holds one shard of the averaged gradient, used by ``Zero1Adam(..., max_norm=...)``.

The learner's file ends with a ``run()`` that hands the learner's code to a driver here
(:func:`bounds_cases`, :func:`train`, :func:`run_clipped`). Every rank trains on its own shard of
the batch and clips its own shard of a gradient, private to it and drawn for every grade
(:func:`make_inputs`). The checks (``dtrain_lab.grading.checks.lab05``) run outside the sandbox.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from dtrain_lab.grading import contract

LAB = "lab_05"
LR, BETAS, EPS, WEIGHT_DECAY = 0.01, (0.9, 0.999), 1e-8, 0.1
STEPS = 4
GLOBAL_BATCH = 12          # divisible by 2 and 3: equal batch shards, so the averaged gradient is exact
MAX_NORM = 1.0             # exercise 3: the gradient's norm is above it in about half the steps
D_IN, D_OUT = 4, 3


class LabModel(nn.Module):
    """A small float64 model with the two kinds of parameter ``torch.optim`` leaves alone:

    * ``scale`` is frozen (``requires_grad=False``): its ``.grad`` is always ``None``;
    * ``extra`` is used only in even steps (``forward(x, use_extra=False)`` skips it): in odd steps
      its ``.grad`` is ``None`` after ``zero_grad()``.
    """

    def __init__(self):
        super().__init__()
        from dtrain_lab.models import MLP

        self.scale = nn.Parameter(torch.tensor([1.5, 0.5, 1.0], dtype=torch.float64), requires_grad=False)
        self.body = MLP(d_in=D_IN, d_hidden=8, d_out=D_OUT, depth=2, seed=0).double()
        with torch.random.fork_rng():
            torch.manual_seed(1)
            self.extra = nn.Linear(D_IN, D_OUT).double()

    def forward(self, x: torch.Tensor, use_extra: bool = True) -> torch.Tensor:
        out = self.body(x) * self.scale
        return out + self.extra(x) if use_extra else out


def lab_model() -> LabModel:
    """The lab's model: 157 parameters (a prime: no world size divides it), frozen ``scale`` first."""
    return LabModel()


def uses_extra(step: int) -> bool:
    """Whether the model's ``extra`` layer takes part in ``step`` (0-based): in even steps only."""
    return step % 2 == 0


PARAM_NAMES = [n for n, _ in lab_model().named_parameters()]
PARAM_NUMELS = [p.numel() for p in lab_model().parameters()]
NUMEL = sum(PARAM_NUMELS)   # 157


def shard_size(numel: int, world_size: int) -> int:
    """Elements per rank, padding included: ``ceil(numel / world_size)``."""
    return -(-numel // world_size)


# ------------------------------------------------------------------ private inputs
CLIP_CASES = ("clipped", "not clipped", "zero gradient")


def _bound_cases(g) -> list:
    """Exercise 1's cases, drawn for every grade: ``[numel, world_size]``. The tiny case has at most
    ``world_size - 2`` elements: some rank's shard starts past ``numel``, so a start left unclamped shows."""
    w = g.randint(2, 5)
    return [[NUMEL, 2], [NUMEL, 3], [w * g.randint(2, 6), w], [g.randint(11, 60), 4], [g.randint(1, 2), 4],
            [g.randint(5, 30), 1], [0, g.randint(2, 3)], [g.randint(100, 400), g.randint(5, 8)]]


def make_inputs(seed: int, world: int) -> list[dict]:
    """Every rank's private inputs: exercise 1's cases, its shard of every step's batch, and its
    shard of each clip case's gradient (with the case's max_norm)."""
    job = contract.rng(seed, "lab05")
    w = torch.randn(D_IN, D_OUT, generator=contract.torch_generator(seed, "w"), dtype=torch.float64) / D_IN ** 0.5
    per = GLOBAL_BATCH // world if GLOBAL_BATCH % world == 0 else GLOBAL_BATCH
    g = contract.torch_generator(seed, "clip")
    vectors = {"clipped": torch.randn(NUMEL, generator=g, dtype=torch.float64) * 0.1,
               "not clipped": torch.randn(NUMEL, generator=g, dtype=torch.float64) * 0.1,
               "zero gradient": torch.zeros(NUMEL, dtype=torch.float64)}
    max_norms = {"clipped": float(vectors["clipped"].norm()) * job.uniform(0.3, 0.8),
                 "not clipped": float(vectors["not clipped"].norm()) * job.uniform(1.5, 3.0), "zero gradient": 1.0}
    size = shard_size(NUMEL, world)
    out = []
    for r in range(world):
        gr = contract.torch_generator(seed, "batch", r)
        x = torch.randn(STEPS, per, D_IN, generator=gr, dtype=torch.float64)
        y = x @ w + 0.1 * torch.randn(STEPS, per, D_OUT, generator=gr, dtype=torch.float64)
        clip = {name: {"shard": F.pad(v, (0, size * world - NUMEL))[r * size:(r + 1) * size].clone(),
                       "max_norm": max_norms[name]} for name, v in vectors.items()}
        out.append({"x": x, "y": y, "clip": clip})
    out[0]["bound_cases"] = _bound_cases(job)
    return out


def _device():
    from dtrain_lab.jobs import runtime

    return runtime.current().device


# ------------------------------------------------------------------ 1. shard bounds
def case_name(numel: int, world: int) -> str:
    return f"numel={numel}, world_size={world}"


def bounds_cases(shard_bounds) -> dict:
    """Driver of exercise 1: ``{case: [shard_bounds(numel, r, world) for every rank r]}``; a case
    whose call raised holds ``{"error": message}`` instead, so that the other cases still count."""
    out = {}
    for numel, world in contract.mine(make_inputs)["bound_cases"]:
        try:
            out[case_name(numel, world)] = [shard_bounds(numel, r, world) for r in range(world)]
        except Exception as exc:  # noqa: BLE001 - reported as this case's problem
            out[case_name(numel, world)] = {"error": f"{type(exc).__name__}: {exc}"[:200]}
    return out


# ------------------------------------------------------------------ 2. ZeRO-1 Adam
def _key(k) -> str:
    if isinstance(k, torch.Tensor):
        return f"<tensor {tuple(k.shape)}>"
    return repr(k)


def state_tensors(opt) -> list[tuple[str, int]]:
    """``[(where, numel)]`` of every optimizer-state tensor ``opt`` holds: in ``opt.state`` (any
    nesting of dicts, lists and tuples) and in the ``.state`` of any ``torch.optim.Optimizer`` it
    keeps as an attribute. Scalars (a step count) are left out."""
    found: list[tuple[str, int]] = []

    def walk(obj, where, depth):
        if depth > 5:
            return
        if isinstance(obj, torch.Tensor):
            if obj.numel() > 1:
                found.append((where, obj.numel()))
        elif isinstance(obj, dict):
            for k, v in obj.items():
                walk(v, f"{where}[{_key(k)}]", depth + 1)
        elif isinstance(obj, (list, tuple)):
            for i, v in enumerate(obj):
                walk(v, f"{where}[{i}]", depth + 1)

    state = getattr(opt, "state", None)
    if not isinstance(state, torch.optim.Optimizer):
        walk(state, "self.state", 0)
    for attr, value in vars(opt).items():
        if isinstance(value, torch.optim.Optimizer):
            walk(value.state, f"self.{attr}.state", 0)
    return found[:50]


def train(Zero1Adam, max_norm: float | None = None, steps: int = STEPS) -> dict:
    """Driver of exercises 2 and 3: ``opt = Zero1Adam(params, lr, betas, eps, weight_decay[, max_norm])``
    over every parameter of the lab's model (the frozen one too, as one passes ``model.parameters()``
    to ``torch.optim.Adam``), then ``steps`` times ``zero_grad``, forward and backward on this rank's
    shard of the batch (``extra`` only in even steps) and ``opt.step()``. Returns, after every step,
    the parameters and the optimizer-state tensors the rank holds."""
    mine = contract.mine(make_inputs)
    model = lab_model().to(_device())
    params = list(model.parameters())
    kw = {"lr": LR, "betas": BETAS, "eps": EPS, "weight_decay": WEIGHT_DECAY}
    if max_norm is not None:
        kw["max_norm"] = max_norm
    opt = Zero1Adam(params, **kw)
    record = []
    for step in range(steps):
        x, y = mine["x"][step].to(_device()), mine["y"][step].to(_device())
        model.zero_grad()    # set_to_none: a parameter unused in this step keeps .grad None
        F.mse_loss(model(x, use_extra=uses_extra(step)), y).backward()
        opt.step()
        record.append({"params": [p.detach().cpu().clone() for p in params], "state": state_tensors(opt)})
    return {"steps": record}


# ------------------------------------------------------------------ 3. global-norm clipping over shards
def clip_cases(clip_grad_norm_sharded) -> dict:
    """This rank's shard (padded, ``ceil(NUMEL / world)`` elements) of every case's gradient, clipped
    in place by ``clip_grad_norm_sharded(shard, max_norm)``: ``{case: {"norm": ..., "shard": ...}}``."""
    out = {}
    for name in CLIP_CASES:
        case = contract.mine(make_inputs)["clip"][name]
        grad = case["shard"].clone().to(_device())
        norm = clip_grad_norm_sharded(grad, case["max_norm"])
        try:
            norm = float(norm)
        except (TypeError, ValueError, RuntimeError):
            norm = repr(norm)[:80]
        out[name] = {"norm": norm, "shard": grad.detach().cpu().clone()}
    return out


def clip_max_norm(name: str) -> float:
    """The max_norm of clip case ``name`` in this grade."""
    return contract.mine(make_inputs)["clip"][name]["max_norm"]


def run_clipped(Zero1Adam, clip_grad_norm_sharded) -> dict:
    """Driver of exercise 3: the clip cases, then training with ``Zero1Adam(..., max_norm=MAX_NORM)``."""
    return {"clip": clip_cases(clip_grad_norm_sharded), **train(Zero1Adam, max_norm=MAX_NORM)}
