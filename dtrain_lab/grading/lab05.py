"""Lab 05 — a ZeRO-1 optimizer by hand: Adam whose state is sharded over the ranks.

Three exercises, each a function or class the learner writes in the lab notebook
(``solutions/_source/lab_05_zero.md``), following ZeRO stage 1 (Rajbhandari, Rasley, Ruwase & He,
"ZeRO: Memory Optimizations Toward Training Trillion Parameter Models", SC 2020, §5.1, P_os):

1. ``shard_bounds(numel, rank, world_size) -> (start, end)``: the flat parameter vector is padded to
   ``world_size × ceil(numel / world_size)`` elements and cut into equal shards; rank ``r`` owns the
   real elements ``[start, end)`` of its shard (a pure function, graded on one rank);
2. ``Zero1Adam(params, lr, betas, eps, group=None).step()``: average the gradients (reduce-scatter:
   each rank receives the sum of its shard only), run Adam on the rank's shard with the rank's
   shard of the state (``self.state``: ``exp_avg`` and ``exp_avg_sq``, ``ceil(P/N)`` elements
   each), all-gather the updated shards into every parameter (2 and 3 ranks);
3. ``clip_grad_norm_sharded(grad_shard, max_norm, group=None)``: global-norm clipping when every
   rank holds one shard of the averaged gradient, used by ``Zero1Adam(..., max_norm=...)``
   (2 and 3 ranks).

As in labs 02 and 04 the learner's file ends with a ``run()`` that hands the learner's code to a
driver here (:func:`bounds_cases`, :func:`train`, :func:`run_clipped`). The checks compute their
references without any collective and without the course's own ZeRO code: the bounds from the
rule above, the parameters from single-process training on the global batch with PyTorch's
``torch.optim.Adam`` (and ``torch.nn.utils.clip_grad_norm_`` for exercise 3), in float64 so that a
tight tolerance separates a right answer from the plausible slips. The optimizer state a rank
holds is measured (every tensor in ``self.state`` and in any ``torch.optim.Optimizer`` the object
keeps): full-size moments fail with what was found. The harness's trace of collectives is checked
too: the updated shards must travel by all-gather (or broadcast), never by an all-reduce of the
parameters.
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn.functional as F

from dtrain_lab.grading.registry import Exercise, problem, register

LAB = "lab_05"

# ------------------------------------------------------------------ the lab's model, data and optimizer
LR, BETAS, EPS = 0.01, (0.9, 0.999), 1e-8
STEPS = 4
GLOBAL_BATCH = 12          # divisible by 2 and 3: equal batch shards, so the averaged gradient is exact
MAX_NORM = 0.3             # exercise 3: the global gradient norm is above it at steps 1 and 4 only
RTOL, ATOL = 1e-9, 1e-11   # float64: a right answer is ~1e-15 away; summed gradients ~1e-7
CLIP_RTOL, CLIP_ATOL = 1e-5, 1e-7   # clipping with or without clip_grad_norm_'s +1e-6 is accepted


def lab_model():
    """``MLP(4, 8, 3, depth=2)`` in float64: 139 parameters (a prime: no world size divides it)."""
    from dtrain_lab.models import MLP

    return MLP(d_in=4, d_hidden=8, d_out=3, depth=2, seed=0).double()


PARAM_NAMES = [n for n, _ in lab_model().named_parameters()]
PARAM_NUMELS = [p.numel() for p in lab_model().parameters()]
NUMEL = sum(PARAM_NUMELS)   # 139


def _dataset():
    from dtrain_lab.data import regression_dataset

    return regression_dataset(n=48, d_in=4, d_out=3, seed=5)


def _device():
    from dtrain_lab.jobs import runtime

    return runtime.current().device


def shard_size(numel: int, world_size: int) -> int:
    """Elements per rank, padding included: ``ceil(numel / world_size)``."""
    return -(-numel // world_size)


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
    for name, n in zip(PARAM_NAMES, PARAM_NUMELS):
        if i < n:
            return name, i
        i -= n
    return "padding", i


def _close(a, b, rtol=RTOL, atol=ATOL) -> bool:
    if not isinstance(a, torch.Tensor) or a.shape != b.shape:
        return False
    return bool(torch.allclose(a.detach().cpu().double(), b.double(), rtol=rtol, atol=atol))


def _max_diff(a, b) -> float:
    return float((a.double() - b.double()).abs().max()) if a.numel() else 0.0


def _first_and_count(found: list) -> list:
    if len(found) <= 1:
        return found
    return [found[0], problem(f"另有 {len(found) - 1} 个用例也不对。", f"{len(found) - 1} more case(s) are wrong too.")]


# ------------------------------------------------------------------ 1. shard bounds
BOUND_CASES = [(NUMEL, 2), (NUMEL, 3), (12, 3), (10, 4), (2, 4), (7, 1), (0, 2)]


def _case_name(numel: int, world: int) -> str:
    return f"numel={numel}, world_size={world}"


def bounds_cases(shard_bounds) -> dict:
    """Driver of exercise 1: ``{case: [shard_bounds(numel, r, world) for every rank r]}``; a case
    whose call raised holds ``{"error": message}`` instead, so that the other cases still count."""
    out = {}
    for numel, world in BOUND_CASES:
        try:
            out[_case_name(numel, world)] = [shard_bounds(numel, r, world) for r in range(world)]
        except Exception as exc:  # noqa: BLE001 - reported as this case's problem
            out[_case_name(numel, world)] = {"error": f"{type(exc).__name__}: {exc}"}
    return out


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


_BOUND_HINTS = [
    (_floor_bounds, problem(
        "你用的是 numel // world_size，让最后一个 rank 拿走余下的元素：各分片大小不一。Reduce-Scatter 和 All-Gather "
        "要求每个 rank 的张量一样大，所以 ZeRO 把扁平向量补零到 world_size × ceil(numel / world_size)，"
        "每个分片都有 ceil(numel / world_size) 个位置，只有最后的分片里可能有补零。",
        "you used numel // world_size and gave the rest to the last rank: the shards differ in size. Reduce-scatter "
        "and all-gather need the same size on every rank, so ZeRO pads the flat vector to world_size × "
        "ceil(numel / world_size): every shard has ceil(numel / world_size) slots, and only the last shards can "
        "hold padding.")),
    (_split_bounds, problem(
        "你像 torch.tensor_split 那样把余数分给前几个 rank：各分片大小不一。集合通信要求每个 rank 的张量一样大，"
        "所以每个分片都占 ceil(numel / world_size) 个位置，补零只出现在末尾。",
        "you spread the remainder over the first ranks, as torch.tensor_split does: the shards differ in size. The "
        "collectives need the same size on every rank, so every shard takes ceil(numel / world_size) slots and the "
        "padding sits at the end.")),
    (_unclamped_bounds, problem(
        "end 没有截断到 numel：补零不属于任何参数。返回的是真实元素的范围，start 和 end 都不能超过 numel。",
        "end is not clamped to numel: the padding belongs to no parameter. Return the range of real elements: "
        "neither start nor end may exceed numel.")),
    (_end_clamped_only, problem(
        "rank 比元素还多时，后面 rank 的分片全是补零：start 也要截断到 numel，这样得到空范围 (numel, numel)，"
        "而不是 start > end。",
        "with more ranks than elements the last ranks' shards are all padding: clamp start to numel too, giving the "
        "empty range (numel, numel) rather than start > end.")),
]


def _as_pairs(value):
    try:
        out = [(int(a), int(b)) for a, b in value]
    except (TypeError, ValueError):
        return None
    return out


def _check_bounds(rt, result, module):
    """Every case against :func:`reference_bounds`; the first two wrong cases are shown, with the
    explanation of the first slip recognised."""
    if not isinstance(result, dict):
        return [problem("run() 应返回 bounds_cases(shard_bounds) 的结果（一个 dict）。",
                        "run() should return bounds_cases(shard_bounds) (a dict).")]
    wrong, hint = [], None
    for numel, world in BOUND_CASES:
        name = _case_name(numel, world)
        want = [reference_bounds(numel, r, world) for r in range(world)]
        value = result.get(name)
        if isinstance(value, dict) and "error" in value:
            wrong.append(problem(f"用例 {name}：shard_bounds 抛出了异常 {value['error']}。",
                                 f"case {name}: shard_bounds raised {value['error']}."))
            continue
        got = _as_pairs(value)
        if got == want:
            continue
        wrong.append(problem(f"用例 {name}：每个 rank 的 (start, end) 应为 {want}，你的结果是 {value!r}。",
                             f"case {name}: (start, end) of every rank should be {want}; yours is {value!r}."))
        if hint is None:
            hint = next((h for rule, h in _BOUND_HINTS
                         if got == [rule(numel, r, world) for r in range(world)]), None)
    out = wrong[:2]
    if len(wrong) > 2:
        out.append(problem(f"另有 {len(wrong) - 2} 个用例也不对。", f"{len(wrong) - 2} more case(s) are wrong too."))
    return out + ([hint] if hint else [])


register(Exercise(
    id="lab05.shard_bounds", lab=LAB, entry="run", filename="lab05_shard_bounds.py", timeout=20,
    title={"en": "1 · Cut the flat parameters into equal shards", "zh": "1 · 把扁平参数切成等长分片"},
    checks=[_check_bounds], world_sizes=(1,)))


# ------------------------------------------------------------------ 2. ZeRO-1 Adam
def _batch(step: int, rank: int | None, world: int):
    from dtrain_lab.data import global_batch, shard

    x, y = global_batch(_dataset(), step, GLOBAL_BATCH)
    batch = (x.double(), y.double())
    return batch if rank is None else shard(batch, rank, world)


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
    return found


def train(Zero1Adam, max_norm: float | None = None, steps: int = STEPS) -> dict:
    """Driver of exercises 2 and 3: ``opt = Zero1Adam(params, lr, betas, eps[, max_norm])``, then
    ``steps`` times forward and backward on this rank's shard of the global batch and ``opt.step()``.
    Returns, after every step, the parameters and the optimizer-state tensors the rank holds."""
    rank, world = dist.get_rank(), dist.get_world_size()
    model = lab_model().to(_device())
    params = list(model.parameters())
    kw = {"lr": LR, "betas": BETAS, "eps": EPS}
    if max_norm is not None:
        kw["max_norm"] = max_norm
    opt = Zero1Adam(params, **kw)
    record = []
    for step in range(steps):
        x, y = _batch(step, rank, world)
        model.zero_grad()
        F.mse_loss(model(x.to(_device())), y.to(_device())).backward()
        opt.step()
        record.append({"params": [p.detach().cpu().clone() for p in params], "state": state_tensors(opt)})
    return {"steps": record}


def reference_training(steps: int = STEPS, *, max_norm: float | None = None, grad_scale: float = 1.0,
                       shard_of: tuple[int, int] | None = None, clip_eps: float = 1e-6) -> list[torch.Tensor]:
    """The flat parameters after every step of single-process training on the global batch with
    ``torch.optim.Adam`` (and ``torch.nn.utils.clip_grad_norm_`` when ``max_norm`` is given).
    Variants for the hints: ``grad_scale`` multiplies the gradient before the step (the world size:
    summed instead of averaged gradients); ``shard_of=(rank, world)`` trains on that rank's batch
    shard alone (gradients never averaged); ``clip_eps=0`` clips by ``max_norm / norm``."""
    model = lab_model()
    params = list(model.parameters())
    opt = torch.optim.Adam(params, lr=LR, betas=BETAS, eps=EPS)
    out = []
    for step in range(steps):
        x, y = _batch(step, *(shard_of or (None, 1)))
        model.zero_grad()
        F.mse_loss(model(x), y).backward()
        with torch.no_grad():
            for p in params:
                p.grad.mul_(grad_scale)
        if max_norm is not None:
            if clip_eps == 1e-6:
                torch.nn.utils.clip_grad_norm_(params, max_norm)
            else:   # the same rule by hand, only to measure how much the 1e-6 matters
                norm = _flat([p.grad for p in params]).norm()
                coef = min(1.0, max_norm / (float(norm) + clip_eps))
                for p in params:
                    p.grad.mul_(coef)
        opt.step()
        out.append(_flat(params))
    return out


def _state_problems(sizes: list, rank: int, world: int) -> list:
    size = shard_size(NUMEL, world)
    start, end = reference_bounds(NUMEL, rank, world)
    allowed = {size, end - start}
    if not sizes:
        return [problem(
            "self.state 里没有找到优化器状态张量：请把本 rank 分片的 Adam 矩估计放进 self.state"
            "（self.state['exp_avg'] 和 self.state['exp_avg_sq']）。",
            "found no optimizer-state tensor in self.state: keep Adam's moments of this rank's shard there "
            "(self.state['exp_avg'] and self.state['exp_avg_sq']).")]
    bad = [(where, n) for where, n in sizes if n not in allowed]
    if not bad:
        return []
    found = "、".join(f"{w}：{n} 个元素" for w, n in bad[:4])
    found_en = ", ".join(f"{w}: {n} elements" for w, n in bad[:4])
    more = len(bad) > 4
    total = sum(n for _, n in bad)
    if total >= NUMEL:
        return [problem(
            f"本 rank 的优化器状态是整个模型的：{found}{'……' if more else ''}（共 {total} 个元素）。"
            f"ZeRO-1 的意义就在于每个 rank 只保存自己那一片的状态：每个状态张量 ceil({NUMEL}/{world}) = {size} 个元素"
            f"（本 rank 负责扁平参数的 [{start}, {end})），这样优化器状态占的内存只有 1/{world}。",
            f"this rank holds the optimizer state of the whole model: {found_en}{'…' if more else ''} ({total} "
            f"elements). The point of ZeRO-1 is that each rank keeps the state of its own shard only: "
            f"ceil({NUMEL}/{world}) = {size} elements per state tensor (this rank updates [{start}, {end}) of the flat "
            f"parameters), so the optimizer state takes 1/{world} of the memory.")]
    return [problem(
        f"优化器状态张量的大小不对：{found}{'……' if more else ''}。每个状态张量应有 ceil({NUMEL}/{world}) = {size} "
        f"个元素（本 rank 分片的大小，含补零），与本 rank 负责的 [{start}, {end}) 对应。",
        f"optimizer-state tensors of the wrong size: {found_en}{'…' if more else ''}. Each state tensor should hold "
        f"ceil({NUMEL}/{world}) = {size} elements (this rank's shard, padding included), matching the range "
        f"[{start}, {end}) this rank updates.")]


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
        return problem(
            f"第 {n} 步之后只有本 rank 自己的分片 [{start}, {end}) 更新了，其余参数还是上一步的值：Adam 更新完分片之后，"
            f"要用 All-Gather（dist.all_gather_single）把所有 rank 的新分片收集起来，再拷回每一个参数。",
            f"after step {n} only this rank's own shard [{start}, {end}) was updated; the other parameters still hold "
            f"their previous values: after the Adam update of the shard, all-gather every rank's new shard "
            f"(dist.all_gather_single) and copy the result back into every parameter.")
    if _close(got, before, rtol, atol):
        return problem(
            f"第 {n} 步之后参数一点也没变：更新后的扁平向量要原地写回参数（p.copy_(...)）。torch.cat 得到的是新张量，"
            f"改它不会改动参数本身。",
            f"the parameters did not change at step {n}: write the updated flat vector back into the parameters in "
            f"place (p.copy_(...)). torch.cat makes a new tensor; changing it leaves the parameters untouched.")
    summed = variants.get("summed")
    if summed is not None and _close(got, summed[step], rtol, atol):
        return problem(
            f"你的参数是用各 rank 梯度之和（平均值的 {world} 倍）做 Adam 的结果，还要除以 world size。Adam 几乎掩盖了这个错误："
            f"m / sqrt(v) 会消掉一个常数倍，只在 eps 上露出马脚（最大差 {_max_diff(got, want):.1e}）；"
            f"但换成 SGD、权重衰减或梯度裁剪，{world} 倍就一点也藏不住了。",
            f"your parameters are Adam's on the sum of the ranks' gradients ({world} times the average): divide by the "
            f"world size. Adam almost hides this, since m / sqrt(v) cancels a constant factor except in eps (largest "
            f"difference {_max_diff(got, want):.1e}); with SGD, weight decay or gradient clipping the factor {world} "
            f"shows in full.")
    local = variants.get("local")
    if step == 0 and local is not None and _close(got[mine], local[mine], rtol, atol):
        return problem(
            f"本 rank 的分片 [{start}, {end}) 是用本 rank 自己的梯度更新的：梯度还没有在各 rank 间平均。先做 Reduce-Scatter"
            f"（dist.reduce_scatter_single：每个 rank 只收到自己那一片的和），再除以 world size。",
            f"this rank's shard [{start}, {end}) was updated with this rank's own gradient: the gradients were never "
            f"averaged over the ranks. Reduce-scatter first (dist.reduce_scatter_single: each rank receives the sum of "
            f"its own shard only), then divide by the world size.")
    d = (got - want).abs()
    bad = d > atol + rtol * want.abs()
    i = int(d.argmax())
    name, j = _where(i)
    if _close(got[mine], want[mine], rtol, atol):
        extra_zh, extra_en = f"本 rank 自己的分片 [{start}, {end}) 是对的，错的是其余部分。", \
            f" This rank's own shard [{start}, {end}) is right; the rest is not."
    elif _close(got[rest], want[rest], rtol, atol):
        extra_zh, extra_en = f"错在本 rank 自己的分片 [{start}, {end}) 里：检查 Adam 的更新。", \
            f" The error is inside this rank's own shard [{start}, {end}): check the Adam update."
    else:
        extra_zh, extra_en = "", ""
    return problem(
        f"第 {n} 步之后，参数和在全局 batch 上用 torch.optim.Adam 训练的结果不同：{NUMEL} 个元素中有 {int(bad.sum())} 个不对，"
        f"比如扁平下标 {i}（{name} 的第 {j} 个元素）：应为 {float(want[i]):.10g}，你的结果是 {float(got[i]):.10g}。{extra_zh}",
        f"after step {n} the parameters differ from torch.optim.Adam on the global batch: {int(bad.sum())} of {NUMEL} "
        f"elements are wrong, e.g. flat index {i} (element {j} of {name}): expected {float(want[i]):.10g}, yours is "
        f"{float(got[i]):.10g}.{extra_en}")


def _check_training(rt, result, max_norm=None, rtol=RTOL, atol=ATOL) -> list:
    steps = result.get("steps") if isinstance(result, dict) else None
    if not isinstance(steps, list):
        return [problem("run() 应返回驱动函数的结果，请不要修改 run()。",
                        "run() should return the driver's result; do not change run().")]
    world, rank = rt.world_size, rt.rank
    out = _state_problems(steps[-1]["state"] if steps else [], rank, world)
    ref = reference_training(max_norm=max_norm)
    before = _flat(lab_model().parameters())
    variants = {}
    if max_norm is None:
        variants["summed"] = reference_training(grad_scale=float(world))
        variants["local"] = reference_training(steps=1, shard_of=(rank, world))[0]
    for step, (rec, want) in enumerate(zip(steps, ref)):
        ps = rec["params"]
        if not isinstance(ps, list) or [tuple(p.shape) for p in ps] != [tuple(p.shape) for p in lab_model().parameters()]:
            return out + [problem(f"第 {step + 1} 步之后，参数的形状变了：请原地更新参数。",
                                  f"after step {step + 1} the parameters changed shape: update them in place.")]
        got = _flat(ps)
        if not _close(got, want, rtol, atol):
            return out + [_param_problem(step, got, want, before, rank, world, variants, rtol, atol)]
        before = want
    if len(steps) != len(ref):
        out.append(problem("驱动函数没有跑完所有的步数，请不要修改 run()。",
                           "the driver did not run every step; do not change run()."))
    return out


def _check_zero1(rt, result, module):
    return _check_training(rt, result)


GATHERS = ("all_gather", "all_gather_single", "all_gather_into_tensor", "broadcast")
SCATTERS = ("reduce_scatter", "reduce_scatter_single", "reduce_scatter_tensor")


def _numel(call) -> int:
    return math.prod(call.get("shape") or [0])


def _shards_all_gathered(traces):
    """Every rank all-gathers (or broadcasts) the updated shards, and all-reduces nothing as large
    as a shard beyond one gradient average per step (reduce-scatter counts as that average)."""
    world = len(traces)
    size = shard_size(NUMEL, world)
    for rank, calls in sorted(traces.items()):
        scatters = sum(c["op"] in SCATTERS for c in calls)
        big = [c for c in calls if c["op"] == "all_reduce" and _numel(c) >= size]
        if len(big) > max(0, STEPS - scatters):
            return [problem(
                f"rank {rank} 在 {STEPS} 步里做了 {len(big)} 次和分片一样大或更大的 All-Reduce"
                f"（{'，' if scatters else ''}{f'外加 {scatters} 次 Reduce-Scatter' if scatters else ''}）："
                f"每步平均梯度只需要一次，多出来的只能是对参数做的 All-Reduce（把别人的分片填成 0 再求和）。结果也许是对的，"
                f"但 All-Reduce 的通信量是 All-Gather 的两倍：用 All-Gather 收集各 rank 更新后的分片。",
                f"rank {rank} issued {len(big)} all-reduces as large as a shard or larger in {STEPS} steps"
                f"{f', besides {scatters} reduce-scatters' if scatters else ''}: averaging the gradient takes one per "
                f"step, so the others can only be all-reduces of the parameters (the other shards filled with zeros, "
                f"then summed). The result may be right, but an all-reduce sends twice what an all-gather does: "
                f"all-gather the ranks' updated shards.")]
        if not any(c["op"] in GATHERS for c in calls):
            return [problem(
                f"rank {rank} 没有做任何 All-Gather（或 Broadcast）：在 ZeRO-1 里每个 rank 只更新自己的分片，"
                f"其余参数必须从别的 rank 收集（dist.all_gather_single）。如果每个 rank 都更新了全部参数，"
                f"那它也保存了全部的优化器状态，这正是 ZeRO 要省掉的。",
                f"rank {rank} issued no all-gather (nor broadcast): in ZeRO-1 each rank updates only its own shard and "
                f"must gather the rest from the other ranks (dist.all_gather_single). A rank that updates every "
                f"parameter also holds the whole optimizer state, which is what ZeRO saves.")]
    return []


def _explain_sizes(outcome: str, feedback: str, source: str) -> list:
    """A crash or hang inside all-gather / reduce-scatter is most often tensors of different sizes."""
    signs = ("all_gather", "allgather", "reduce_scatter", "reducescatter", "size doesn't match",
             "received data size", "outputshape", "inputshape", "output tensor", "input tensor")
    if outcome not in ("crash", "hang") or not any(sign in feedback.lower() for sign in signs):
        return []
    return [problem(
        "Reduce-Scatter 和 All-Gather 要求每个 rank 的分片一样大：把扁平向量补零到 world_size × ceil(numel / world_size)，"
        "每个 rank 传 ceil(numel / world_size) 个元素（最后的分片里含补零），输出是整个补零后的向量。",
        "reduce-scatter and all-gather need shards of the same size on every rank: pad the flat vector to "
        "world_size × ceil(numel / world_size), pass ceil(numel / world_size) elements on every rank (padding "
        "included in the last shards), and receive the whole padded vector.")]


register(Exercise(
    id="lab05.zero1", lab=LAB, entry="run", filename="lab05_zero1.py", timeout=20,
    title={"en": "2 · ZeRO-1: Adam with sharded state", "zh": "2 · ZeRO-1：分片保存状态的 Adam"},
    checks=[_check_zero1], trace_checks=[_shards_all_gathered], explain=_explain_sizes, world_sizes=(2, 3)))


# ------------------------------------------------------------------ 3. global-norm clipping over shards
# (name, max_norm as a fraction of the vector's norm, or None: the vector is zero and max_norm is 1)
CLIP_CASES = [("clipped", 0.5), ("not clipped", 2.0), ("zero gradient", None)]


def clip_vector(name: str) -> torch.Tensor:
    """The full averaged gradient of clip case ``name``: ``NUMEL`` float64 entries."""
    if name == "zero gradient":
        return torch.zeros(NUMEL, dtype=torch.float64)
    return torch.randn(NUMEL, generator=torch.Generator().manual_seed(7), dtype=torch.float64) * 0.1


def clip_max_norm(name: str) -> float:
    frac = dict(CLIP_CASES)[name]
    return 1.0 if frac is None else frac * float(clip_vector(name).norm())


def clip_cases(clip_grad_norm_sharded) -> dict:
    """This rank's shard (padded, ``ceil(NUMEL / world)`` elements) of every case's gradient, clipped
    in place by ``clip_grad_norm_sharded(shard, max_norm)``: ``{case: {"norm": ..., "shard": ...}}``."""
    rank, world = dist.get_rank(), dist.get_world_size()
    size = shard_size(NUMEL, world)
    out = {}
    for name, _ in CLIP_CASES:
        grad = _padded(clip_vector(name), world)[rank * size:(rank + 1) * size].clone().to(_device())
        norm = clip_grad_norm_sharded(grad, clip_max_norm(name))
        try:
            norm = float(norm)
        except (TypeError, ValueError, RuntimeError):
            norm = repr(norm)[:80]
        out[name] = {"norm": norm, "shard": grad.detach().cpu().clone()}
    return out


def reference_clip(name: str, rank: int, world: int) -> tuple[float, torch.Tensor]:
    """``(total norm, this rank's padded shard after clipping)`` by ``torch.nn.utils.clip_grad_norm_``
    on the full vector."""
    p = torch.nn.Parameter(torch.zeros(NUMEL, dtype=torch.float64))
    p.grad = clip_vector(name).clone()
    norm = float(torch.nn.utils.clip_grad_norm_([p], clip_max_norm(name)))
    size = shard_size(NUMEL, world)
    return norm, _padded(p.grad.detach(), world)[rank * size:(rank + 1) * size]


def run_clipped(Zero1Adam, clip_grad_norm_sharded) -> dict:
    """Driver of exercise 3: the clip cases, then training with ``Zero1Adam(..., max_norm=MAX_NORM)``."""
    return {"clip": clip_cases(clip_grad_norm_sharded), **train(Zero1Adam, max_norm=MAX_NORM)}


def _clip_problem(name: str, got: dict, rank: int, world: int) -> dict | None:
    want_norm, want = reference_clip(name, rank, world)
    size = shard_size(NUMEL, world)
    grad = _padded(clip_vector(name), world)[rank * size:(rank + 1) * size]
    max_norm = clip_max_norm(name)
    norm, shard = got.get("norm"), got.get("shard")
    zh, en = f"用例“{name}”（max_norm={max_norm:.4g}）", f"case '{name}' (max_norm={max_norm:.4g})"
    if not isinstance(norm, float) or not math.isfinite(norm) or not isinstance(shard, torch.Tensor) \
            or shard.shape != want.shape or not bool(torch.isfinite(shard).all()):
        if name == "zero gradient":
            return problem(f"{zh}：梯度全为 0 时范数是 0，max_norm / total_norm 除以了 0。像 clip_grad_norm_ 那样用 "
                           f"max_norm / (total_norm + 1e-6)，再截断到不超过 1。",
                           f"{en}: the norm of a zero gradient is 0, and max_norm / total_norm divides by zero. Use "
                           f"max_norm / (total_norm + 1e-6), clamped to at most 1, as clip_grad_norm_ does.")
        return problem(f"{zh}：应返回全局范数（一个数），并原地裁剪形状为 ({size},) 的分片；你返回的范数是 {norm!r}。",
                       f"{en}: return the global norm (a number) and clip the shard of shape ({size},) in place; "
                       f"the norm you returned is {norm!r}.")
    if abs(norm - want_norm) > CLIP_ATOL + CLIP_RTOL * want_norm:
        local = float(grad.norm())
        if world > 1 and abs(norm - local) <= CLIP_ATOL + CLIP_RTOL * local:
            return problem(
                f"{zh}：你返回的是本 rank 分片的范数 {norm:.6g}，而全局范数是 {want_norm:.6g}。逐分片裁剪是个经典错误："
                f"每个 rank 用不同的系数缩放自己的分片，梯度的方向就变了。先对本分片的平方和做 All-Reduce（求和），"
                f"再开方得到全局范数，所有 rank 用同一个系数。",
                f"{en}: you returned the norm of this rank's shard, {norm:.6g}, but the global norm is {want_norm:.6g}. "
                f"Clipping each shard by its own norm is a classic bug: every rank scales its shard by a different "
                f"factor, which changes the gradient's direction. All-reduce (sum) the shard's squared norm, take the "
                f"square root: one global norm, the same factor on every rank.")
        if world > 1 and abs(norm - _sum_of_norms(name, world)) <= CLIP_ATOL + CLIP_RTOL * norm:
            return problem(
                f"{zh}：你把各分片的范数加了起来（{norm:.6g}），全局范数是 {want_norm:.6g}。范数不能相加，平方和才能："
                f"All-Reduce 各分片的平方和，再开方。",
                f"{en}: you added the shards' norms ({norm:.6g}); the global norm is {want_norm:.6g}. Norms do not "
                f"add, squared norms do: all-reduce the squared norms, then take the square root.")
        return problem(f"{zh}：全局范数应为 {want_norm:.6g}，你返回的是 {norm:.6g}。",
                       f"{en}: the global norm should be {want_norm:.6g}; you returned {norm:.6g}.")
    if _close(shard, want, CLIP_RTOL, CLIP_ATOL):
        return None
    if name == "not clipped" and _close(shard, grad * (max_norm / want_norm), CLIP_RTOL, CLIP_ATOL):
        return problem(f"{zh}：范数本来就小于 max_norm，梯度不该变，你却把它放大了。缩放系数要截断到不超过 1。",
                       f"{en}: the norm is already below max_norm, so the gradient must not change, yet you scaled it "
                       f"up. Clamp the factor to at most 1.")
    if _close(shard, grad, CLIP_RTOL, CLIP_ATOL):
        return problem(f"{zh}：全局范数对了，但分片没有被裁剪：要原地乘以 max_norm / (total_norm + 1e-6)（截断到不超过 1）。",
                       f"{en}: the global norm is right but the shard was not clipped: multiply it in place by "
                       f"max_norm / (total_norm + 1e-6), clamped to at most 1.")
    d = _max_diff(shard, want)
    return problem(f"{zh}：裁剪后的分片和 clip_grad_norm_ 作用于完整梯度的结果不同（最大差 {d:.3g}）。",
                   f"{en}: the clipped shard differs from clip_grad_norm_ applied to the full gradient (max difference "
                   f"{d:.3g}).")


def _sum_of_norms(name: str, world: int) -> float:
    size = shard_size(NUMEL, world)
    padded = _padded(clip_vector(name), world)
    return sum(float(padded[r * size:(r + 1) * size].norm()) for r in range(world))


def _check_clip(rt, result, module):
    if not isinstance(result, dict) or not isinstance(result.get("clip"), dict):
        return [problem("run() 应返回驱动函数的结果，请不要修改 run()。",
                        "run() should return the driver's result; do not change run().")]
    found = [_clip_problem(name, result["clip"].get(name) or {}, rt.rank, rt.world_size) for name, _ in CLIP_CASES]
    found = _first_and_count([p for p in found if p is not None])
    if found:
        return found
    return _check_training(rt, result, max_norm=MAX_NORM, rtol=CLIP_RTOL, atol=CLIP_ATOL)


register(Exercise(
    id="lab05.clip", lab=LAB, entry="run", filename="lab05_clip.py", timeout=20,
    title={"en": "3 · Clip by the global norm of a sharded gradient", "zh": "3 · 按分片梯度的全局范数裁剪"},
    checks=[_check_clip], trace_checks=[_shards_all_gathered], explain=_explain_sizes, world_sizes=(2, 3)))
