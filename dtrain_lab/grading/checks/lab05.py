"""Lab 05 — ZeRO-1 by hand: the references and checks, run in the grader's process.

The references use neither a collective nor the course's own ZeRO code: the shard bounds from the
rule, the parameters from single-process training on the global batch (every rank's private shard
put together) with ``torch.optim.Adam`` (and ``torch.nn.utils.clip_grad_norm_`` for exercise 3), in
float64 so that a tight tolerance separates a right answer from the plausible slips. ``torch.optim``
skips a parameter whose ``.grad`` is ``None`` (the frozen ``scale``; ``extra`` in odd steps): so must
the learner's optimizer, which the parameters after each step show.

What a rank keeps in ``self.state`` is measured inside the rank (self-reported, like the traces):
full-size moments fail with what was found. A rank that hides a full copy of the state elsewhere
and shows shard-sized decoys is not detected: the instructor guide says so. The traces are checked
too: the updated shards must travel by all-gather (or broadcast), not by an all-reduce of the
parameters.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from dtrain_lab.i18n import rendered
from dtrain_lab.grading import lab05 as contract
from dtrain_lab.grading.channel import short
from dtrain_lab.grading.exercise import Exercise, combine, problem

LAB = contract.LAB
NUMEL = contract.NUMEL
RTOL, ATOL = 1e-9, 1e-11   # float64: a right answer is ~1e-15 away; summed gradients ~1e-7
CLIP_RTOL, CLIP_ATOL = 1e-5, 1e-7   # clipping with or without clip_grad_norm_'s +1e-6 is accepted
HIDE = ("dtrain_lab.parallel.zero", "dtrain_lab.parallel.fsdp", "dtrain_lab.parallel.deepspeed_lab")
shard_size = contract.shard_size


def reference_bounds(numel: int, rank: int, world_size: int) -> tuple[int, int]:
    """The real elements ``[start, end)`` of rank ``rank``'s shard of a flat vector of ``numel``
    elements padded to ``world_size × ceil(numel / world_size)``: ``start = rank × size`` and
    ``end = start + size``, both clamped to ``numel`` (the padding belongs to no parameter)."""
    size = shard_size(numel, world_size)
    start = min(rank * size, numel)
    return start, min(start + size, numel)


def _flat(tensors) -> torch.Tensor:
    return torch.cat([t.detach().reshape(-1).cpu().double() for t in tensors])


def _padded(flat: torch.Tensor, world: int) -> torch.Tensor:
    return F.pad(flat, (0, shard_size(flat.numel(), world) * world - flat.numel()))


def _where(i: int) -> tuple[str, int]:
    """Element ``i`` of the flat vector: (parameter name, index inside it)."""
    for name, n in zip(contract.PARAM_NAMES, contract.PARAM_NUMELS):
        if i < n:
            return name, i
        i -= n
    return "padding", i


def _skipped(step: int) -> set[str]:
    """The parameters whose .grad is None in ``step`` (0-based)."""
    return {"scale"} | (set() if contract.uses_extra(step) else {"extra.weight", "extra.bias"})


def _close(a, b, rtol=RTOL, atol=ATOL) -> bool:
    if not isinstance(a, torch.Tensor) or a.shape != b.shape:
        return False
    return bool(torch.allclose(a.detach().cpu().double(), b.double(), rtol=rtol, atol=atol))


def _max_diff(a, b) -> float:
    return float((a.double() - b.double()).abs().max()) if a.numel() else 0.0


def _first_and_count(found: list) -> list:
    if len(found) <= 1:
        return found
    return [found[0], problem("grade_more_cases", n=len(found) - 1)]


# ------------------------------------------------------------------ 1. shard bounds
def _floor_bounds(numel, rank, world):
    """Shards of ``numel // world``, the last rank taking the rest: no padding, unequal shards."""
    size = numel // world
    return rank * size, numel if rank == world - 1 else (rank + 1) * size


def _split_bounds(numel, rank, world):
    """``torch.tensor_split``'s sizes: the first ``numel % world`` ranks get one element more."""
    size, extra = divmod(numel, world)
    start = rank * size + min(rank, extra)
    return start, start + size + (1 if rank < extra else 0)


def _unclamped_bounds(numel, rank, world):
    size = shard_size(numel, world)
    return rank * size, (rank + 1) * size


def _end_clamped_only(numel, rank, world):
    size = shard_size(numel, world)
    return rank * size, min((rank + 1) * size, numel)


_BOUND_HINTS = [(_floor_bounds, "lab05_hint_floor"), (_split_bounds, "lab05_hint_split"),
                (_unclamped_bounds, "lab05_hint_unclamped"), (_end_clamped_only, "lab05_hint_end_only")]


def _as_pairs(value):
    try:
        return [(int(a), int(b)) for a, b in value]
    except (TypeError, ValueError):
        return None


def _check_bounds(run, rank, result):
    if not isinstance(result, dict):
        return [problem("lab05_want_cases", got=short(result))]
    wrong, hint = [], None
    for numel, world in run.inputs[0]["bound_cases"]:
        name = contract.case_name(numel, world)
        want = [reference_bounds(numel, r, world) for r in range(world)]
        value = result.get(name)
        if isinstance(value, dict) and "error" in value:
            wrong.append(problem("lab05_bounds_raised", name=name, error=short(value["error"], 200)))
            continue
        got = _as_pairs(value)
        if got == want:
            continue
        wrong.append(problem("lab05_bounds_wrong", name=name, want=want, got=short(value, 120)))
        if hint is None:
            hint = next((problem(key) for rule, key in _BOUND_HINTS
                         if got == [rule(numel, r, world) for r in range(world)]), None)
    out = wrong[:2]
    if len(wrong) > 2:
        out.append(problem("grade_more_cases", n=len(wrong) - 2))
    return out + ([hint] if hint else [])


# ------------------------------------------------------------------ 2. ZeRO-1 Adam
def reference_training(inputs: list, steps: int = contract.STEPS, *, max_norm: float | None = None,
                       grad_scale: float = 1.0, only: int | None = None, zero_fill: bool = False,
                       clip_eps: float = 1e-6) -> list[torch.Tensor]:
    """The flat parameters after every step of single-process training on the global batch with
    ``torch.optim.Adam`` (and ``clip_grad_norm_`` when ``max_norm`` is given). Variants for the hints:
    ``grad_scale`` multiplies the gradient before the step (the world size: summed instead of averaged
    gradients); ``only=r`` trains on rank r's shard alone (gradients never averaged); ``zero_fill``
    gives every parameter without a gradient a zero one (so Adam moves it: weight decay, momentum,
    its step count); ``clip_eps=0`` clips by ``max_norm / norm``."""
    model = contract.lab_model()
    params = list(model.parameters())
    opt = torch.optim.Adam(params, lr=contract.LR, betas=contract.BETAS, eps=contract.EPS,
                           weight_decay=contract.WEIGHT_DECAY)
    parts = [inputs[only]] if only is not None else inputs
    out = []
    for step in range(steps):
        x = torch.cat([i["x"][step] for i in parts])
        y = torch.cat([i["y"][step] for i in parts])
        model.zero_grad()
        F.mse_loss(model(x, use_extra=contract.uses_extra(step)), y).backward()
        with torch.no_grad():
            for p in params:
                if p.grad is not None:
                    p.grad.mul_(grad_scale)
                elif zero_fill:
                    p.grad = torch.zeros_like(p)
        if max_norm is not None:
            with_grad = [p for p in params if p.grad is not None]
            if clip_eps == 1e-6:
                torch.nn.utils.clip_grad_norm_(with_grad, max_norm)
            else:   # the same rule by hand, only to measure how much the 1e-6 matters
                norm = _flat([p.grad for p in with_grad]).norm()
                coef = min(1.0, max_norm / (float(norm) + clip_eps))
                for p in with_grad:
                    p.grad.mul_(coef)
        opt.step()
        out.append(_flat(params))
    return out


def _state_problems(sizes: list, rank: int, world: int) -> list:
    size = shard_size(NUMEL, world)
    start, end = reference_bounds(NUMEL, rank, world)
    allowed = {size, end - start}
    if not sizes:
        return [problem("lab05_no_state")]
    bad = [(where, n) for where, n in sizes if n not in allowed]
    if not bad:
        return []
    found = ", ".join(f"{short(w, 40)} ({n})" for w, n in bad[:4]) + ("…" if len(bad) > 4 else "")
    total = sum(int(n) for _, n in bad)
    if total >= NUMEL:
        return [problem("lab05_full_state", found=found, total=total, numel=NUMEL, world=world, size=size,
                        start=start, end=end)]
    return [problem("lab05_state_size", found=found, numel=NUMEL, world=world, size=size, start=start, end=end)]


def _param_problem(step: int, got: torch.Tensor, want: torch.Tensor, before: torch.Tensor, rank: int,
                   world: int, variants: dict, rtol: float, atol: float) -> dict:
    """What is wrong with the flat parameters ``got`` after ``step`` (0-based), the first wrong step:
    ``before`` is what they were (right) before it."""
    start, end = reference_bounds(NUMEL, rank, world)
    n = step + 1
    mine = slice(start, end)
    rest = torch.ones(NUMEL, dtype=torch.bool)
    rest[mine] = False
    if world > 1 and _close(got[mine], want[mine], rtol, atol) and _close(got[rest], before[rest], rtol, atol) \
            and not _close(want[rest], before[rest], rtol, atol):
        return problem("lab05_only_own_shard", step=n, start=start, end=end)
    if _close(got, before, rtol, atol):
        return problem("lab05_unchanged", step=n)
    filled = variants.get("zero_fill")
    d = (got - want).abs()
    i = int(d.argmax())
    name, j = _where(i)
    if (filled is not None and _close(got, filled[step], rtol, atol)) or name in _skipped(step) \
            or (name.startswith("extra.") and step >= 1):   # extra's own step count lags from step 2 on
        return problem("lab05_skip_none", step=n, name=name, skipped=", ".join(sorted(_skipped(step))))
    summed = variants.get("summed")
    if summed is not None and _close(got, summed[step], rtol, atol):
        return problem("lab05_summed", world=world, diff=f"{_max_diff(got, want):.1e}")
    local = variants.get("local")
    if step == 0 and local is not None and _close(got[mine], local[mine], rtol, atol):
        return problem("lab05_not_averaged", start=start, end=end)
    bad = d > atol + rtol * want.abs()
    head = problem("lab05_param_wrong", step=n, bad=int(bad.sum()), numel=NUMEL, i=i, j=j, name=name,
                   want=f"{float(want[i]):.10g}", got=f"{float(got[i]):.10g}")
    if _close(got[mine], want[mine], rtol, atol):
        return combine(head, problem("lab05_own_right", start=start, end=end), sep="")
    if _close(got[rest], want[rest], rtol, atol):
        return combine(head, problem("lab05_own_wrong", start=start, end=end), sep="")
    return head


def _check_training(run, rank, result, max_norm=None, rtol=RTOL, atol=ATOL) -> list:
    steps = result.get("steps") if isinstance(result, dict) else None
    if not isinstance(steps, list) or not all(isinstance(s, dict) for s in steps):
        return [problem("lab05_want_driver", got=short(result))]
    world = run.world_size
    out = _state_problems(steps[-1].get("state") or [] if steps else [], rank, world)
    ref = reference_training(run.inputs, max_norm=max_norm)
    before = _flat(contract.lab_model().parameters())
    variants = {"zero_fill": reference_training(run.inputs, max_norm=max_norm, zero_fill=True)}
    if max_norm is None:
        variants["summed"] = reference_training(run.inputs, grad_scale=float(world))
        variants["local"] = reference_training(run.inputs, steps=1, only=rank)[0]
    shapes = [tuple(p.shape) for p in contract.lab_model().parameters()]
    for step, (rec, want) in enumerate(zip(steps, ref)):
        ps = rec.get("params")
        if not isinstance(ps, list) or [tuple(getattr(p, "shape", ())) for p in ps] != shapes:
            return out + [problem("lab05_shape_changed", step=step + 1)]
        got = _flat(ps)
        if not _close(got, want, rtol, atol):
            return out + [_param_problem(step, got, want, before, rank, world, variants, rtol, atol)]
        before = want
    if len(steps) != len(ref):
        out.append(problem("grade_driver_steps"))
    return out


def _check_zero1(run, rank, result):
    return _check_training(run, rank, result)


GATHERS = ("all_gather", "all_gather_single", "all_gather_into_tensor", "broadcast")
SCATTERS = ("reduce_scatter", "reduce_scatter_single", "reduce_scatter_tensor")


def _numel(call) -> int:
    return math.prod(call.get("shape") or [0])


def _shards_all_gathered(run):
    """Every rank all-gathers (or broadcasts) the updated shards, and all-reduces nothing as large
    as a shard beyond one gradient average per step (reduce-scatter counts as that average)."""
    size = shard_size(NUMEL, run.world_size)
    for rank, calls in sorted(run.traces.items()):
        scatters = sum(c.get("op") in SCATTERS for c in calls)
        big = [c for c in calls if c.get("op") == "all_reduce" and _numel(c) >= size]
        if len(big) > max(0, contract.STEPS - scatters):
            return [problem("lab05_allreduce_params", rank=rank, n=len(big), steps=contract.STEPS, scatters=scatters)]
        if not any(c.get("op") in GATHERS for c in calls):
            return [problem("lab05_no_gather", rank=rank)]
    return []


def _explain_sizes(outcome: str, feedback: str, source: str) -> list:
    """A crash or hang inside all-gather / reduce-scatter is most often tensors of different sizes."""
    signs = ("all_gather", "allgather", "reduce_scatter", "reducescatter", "size doesn't match",
             "received data size", "outputshape", "inputshape", "output tensor", "input tensor")
    if outcome not in ("crash", "hang") or not any(sign in feedback.lower() for sign in signs):
        return []
    return [problem("lab05_sizes")]


# ------------------------------------------------------------------ 3. global-norm clipping over shards
def _full_vector(run, name: str) -> torch.Tensor:
    return torch.cat([i["clip"][name]["shard"] for i in run.inputs])[:NUMEL]


def reference_clip(run, name: str, rank: int) -> tuple[float, torch.Tensor]:
    """``(total norm, this rank's padded shard after clipping)`` by ``torch.nn.utils.clip_grad_norm_``
    on the full vector (every rank's shard)."""
    p = torch.nn.Parameter(torch.zeros(NUMEL, dtype=torch.float64))
    p.grad = _full_vector(run, name).clone()
    norm = float(torch.nn.utils.clip_grad_norm_([p], run.inputs[0]["clip"][name]["max_norm"]))
    size = shard_size(NUMEL, run.world_size)
    return norm, _padded(p.grad.detach(), run.world_size)[rank * size:(rank + 1) * size]


def _clip_problem(run, name: str, got: dict, rank: int) -> dict | None:
    want_norm, want = reference_clip(run, name, rank)
    world = run.world_size
    size = shard_size(NUMEL, world)
    grad = run.inputs[rank]["clip"][name]["shard"]
    max_norm = run.inputs[0]["clip"][name]["max_norm"]
    norm, shard = got.get("norm"), got.get("shard")
    case = problem("lab05_clip_case", name=name, max_norm=f"{max_norm:.4g}")
    if not isinstance(norm, float) or not math.isfinite(norm) or not isinstance(shard, torch.Tensor) \
            or shard.shape != want.shape or not bool(torch.isfinite(shard).all()):
        if name == "zero gradient":
            return combine(case, problem("lab05_clip_zero"), sep="")
        return combine(case, problem("lab05_clip_want_norm", size=size, got=short(norm)), sep="")
    if abs(norm - want_norm) > CLIP_ATOL + CLIP_RTOL * want_norm:
        local = float(grad.norm())
        if world > 1 and abs(norm - local) <= CLIP_ATOL + CLIP_RTOL * local:
            return combine(case, problem("lab05_clip_local", norm=f"{norm:.6g}", want=f"{want_norm:.6g}"), sep="")
        sum_norms = sum(float(i["clip"][name]["shard"].norm()) for i in run.inputs)
        if world > 1 and abs(norm - sum_norms) <= CLIP_ATOL + CLIP_RTOL * norm:
            return combine(case, problem("lab05_clip_sum_norms", norm=f"{norm:.6g}", want=f"{want_norm:.6g}"), sep="")
        return combine(case, problem("lab05_clip_norm_wrong", norm=f"{norm:.6g}", want=f"{want_norm:.6g}"), sep="")
    if _close(shard, want, CLIP_RTOL, CLIP_ATOL):
        return None
    if name == "not clipped" and _close(shard, grad * (max_norm / want_norm), CLIP_RTOL, CLIP_ATOL):
        return combine(case, problem("lab05_clip_scaled_up"), sep="")
    if _close(shard, grad, CLIP_RTOL, CLIP_ATOL):
        return combine(case, problem("lab05_clip_not_applied"), sep="")
    return combine(case, problem("lab05_clip_differs", diff=f"{_max_diff(shard, want):.3g}"), sep="")


def _check_clip(run, rank, result):
    if not isinstance(result, dict) or not isinstance(result.get("clip"), dict):
        return [problem("lab05_want_driver", got=short(result))]
    found = [_clip_problem(run, name, result["clip"].get(name) if isinstance(result["clip"].get(name), dict) else {},
                           rank) for name in contract.CLIP_CASES]
    found = _first_and_count([p for p in found if p is not None])
    if found:
        return found
    return _check_training(run, rank, result, max_norm=contract.MAX_NORM, rtol=CLIP_RTOL, atol=CLIP_ATOL)


def _exercise(name, title, checks, **kw) -> Exercise:
    return Exercise(id=f"lab05.{name}", lab=LAB, filename=f"lab05_{name}.py", timeout=20,
                    title=title, checks=checks, make_inputs=contract.make_inputs, hide=HIDE, **kw)


EXERCISES = [
    _exercise("shard_bounds", rendered("lab05_title_shard_bounds"),
              [_check_bounds], world_sizes=(1,)),
    _exercise("zero1", rendered("lab05_title_zero1"), [_check_zero1],
              job_checks=[_shards_all_gathered], explain=_explain_sizes, world_sizes=(2, 3)),
    _exercise("clip", rendered("lab05_title_clip"), [_check_clip],
              job_checks=[_shards_all_gathered], explain=_explain_sizes, world_sizes=(2, 3)),
]
