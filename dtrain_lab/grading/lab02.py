"""Lab 02 — gradient buckets by hand: what DDP does between ``loss.backward()`` and ``opt.step()``.

Three exercises, each a function the learner writes in the lab notebook
(``solutions/_source/lab_02_ddp.md``), following :mod:`dtrain_lab.parallel.ddp` and the PyTorch DDP paper
(Li et al., PVLDB 13(12), 2020, §3.2):

1. ``build_buckets(params, cap_bytes) -> list[list[int]]``: DDP's bucket assignment (a pure
   function, graded on one rank);
2. ``sync_gradients(params, buckets, group=None)``: after backward, one all-reduce of one flat
   buffer per bucket, averaged and written back into ``param.grad`` (2 and 3 ranks);
3. ``attach_overlap(params, buckets, group=None) -> finish``: the same, but each bucket's all-reduce
   is launched asynchronously from ``register_post_accumulate_grad_hook`` while backward still runs;
   ``finish()`` waits and writes back (2 and 3 ranks).

The learner's file ends with a ``run()`` the grader calls in every rank. It hands the learner's
function to a driver here (:func:`bucket_cases`, :func:`train`, :func:`train_overlap`) that returns
what happened; the checks compare that with references computed here without any collective:
DDP's bucket rule (:func:`reference_buckets`, the rule of ``dtrain_lab.parallel.ddp.DDP._build_buckets``, a
test checks they agree; PyTorch's reducer closes buckets by the same rule when it rebuilds them in
gradient-ready order after the first iteration) and single-process training on the global batch
(which PyTorch's DDP equals: ``tests/test_ddp.py``). The harness's trace of every rank's collectives
is checked too: one all-reduce per bucket and step, of the bucket's size, in bucket order.

Overlap is observed deterministically: the training input requires a gradient, and a hook on it
reads how many all-reduces the rank had issued when autograd reached the input. On CPU the engine
runs in one thread and runs every ``AccumulateGrad`` node as soon as it is ready (it has the highest
priority), so by then the gradients of the last layers, buckets 0 and 1, are complete and a correct
implementation has launched them; one that waits for the end of backward has launched none.
"""
from __future__ import annotations

import math
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F

from dtrain_lab.grading.registry import Exercise, problem, register

LAB = "lab_02"

# ------------------------------------------------------------------ the lab's model, data and buckets
CAP_BYTES = 300        # bucket cap of exercises 2 and 3: three buckets for the lab's model
GLOBAL_BATCH = 12      # divisible by 2 and 3: equal shards, so the average gradient is exact
STEPS = 3
LR = 0.1


def lab_model():
    """``MLP(8, 16, 4, depth=2)``: six parameters of 512, 64, 1024, 64, 256 and 16 bytes."""
    from dtrain_lab.models import MLP

    return MLP(d_in=8, d_hidden=16, d_out=4, depth=2, seed=0)


PARAM_NAMES = [n for n, _ in lab_model().named_parameters()]


def _dataset():
    from dtrain_lab.data import regression_dataset

    return regression_dataset(n=48, d_in=8, d_out=4, seed=2)


def _nbytes(p: torch.Tensor) -> int:
    return p.numel() * p.element_size()


# ------------------------------------------------------------------ 1. the bucket rule
def reference_buckets(params, cap_bytes: int) -> list[list[int]]:
    """DDP's rule (``dtrain_lab.parallel.ddp.DDP._build_buckets``): walk the parameters in **reverse**
    registration order (backward produces the gradients of the last layers first), append each to
    the open bucket, and close the bucket as soon as it holds at least ``cap_bytes`` bytes; what is
    left at the end is the last bucket. A parameter larger than the cap therefore closes the bucket
    it joins (it does not get a bucket of its own). Each bucket lists its indices in the order they
    were added."""
    buckets, current, size = [], [], 0
    for i in reversed(range(len(params))):
        current.append(i)
        size += _nbytes(params[i])
        if size >= cap_bytes:
            buckets.append(current)
            current, size = [], 0
    if current:
        buckets.append(current)
    return buckets


BUCKETS = reference_buckets(list(lab_model().parameters()), CAP_BYTES)   # [[5, 4, 3], [2], [1, 0]]
BUCKET_NUMELS = [sum(p.numel() for i, p in enumerate(lab_model().parameters()) if i in b) for b in BUCKETS]


def _forward_order(params, cap):
    """The same rule in registration order (a plausible slip)."""
    buckets, current, size = [], [], 0
    for i in range(len(params)):
        current.append(i)
        size += _nbytes(params[i])
        if size >= cap:
            buckets.append(current)
            current, size = [], 0
    return buckets + ([current] if current else [])


def _strictly_over(params, cap):
    """Closes a bucket only once it holds *more* than the cap."""
    buckets, current, size = [], [], 0
    for i in reversed(range(len(params))):
        current.append(i)
        size += _nbytes(params[i])
        if size > cap:
            buckets.append(current)
            current, size = [], 0
    return buckets + ([current] if current else [])


def _close_before(params, cap):
    """Starts a new bucket when adding a parameter would exceed the cap (buckets never exceed it)."""
    buckets, current, size = [], [], 0
    for i in reversed(range(len(params))):
        n = _nbytes(params[i])
        if current and size + n > cap:
            buckets.append(current)
            current, size = [], 0
        current.append(i)
        size += n
    return buckets + ([current] if current else [])


def _as_if_float32(params, cap):
    """Counts 4 bytes per element whatever the dtype."""
    return reference_buckets([torch.empty(p.numel(), dtype=torch.float32) for p in params], cap)


# (name, parameter sizes as (numel, dtype) in registration order, or None for the lab's model, cap)
BUCKET_CASES = [
    ("lab model", None, CAP_BYTES),
    ("everything in one bucket", None, 1 << 30),
    ("a bucket per parameter", None, 1),
    ("exactly the cap", [(25, torch.float32), (25, torch.float32), (50, torch.float32), (50, torch.float32)], 200),
    ("a parameter larger than the cap", [(10, torch.float32), (1000, torch.float32), (10, torch.float32),
                                         (10, torch.float32)], 100),
    ("float64 parameters", [(10, torch.float64), (10, torch.float64), (10, torch.float64)], 150),
    ("no parameters", [], 100),
]


def case_params(case) -> list[torch.Tensor]:
    _, sizes, _ = case
    if sizes is None:
        return [p.detach() for p in lab_model().parameters()]
    return [torch.zeros(n, dtype=dt) for n, dt in sizes]


def bucket_cases(build_buckets) -> dict:
    """Driver of exercise 1: ``{case name: build_buckets(params, cap)}`` for every case."""
    return {case[0]: build_buckets(case_params(case), case[2]) for case in BUCKET_CASES}


def _as_buckets(value):
    try:
        out = [[int(i) for i in b] for b in value]
    except (TypeError, ValueError):
        return None
    return out


_BUCKET_HINTS = [
    (_forward_order, problem(
        "你是按注册顺序遍历参数的。DDP 按注册顺序的逆序分桶：反向传播最先算出最后几层的梯度，"
        "这样第一个桶最先凑齐，可以最早开始 All-Reduce。",
        "you walked the parameters in registration order. DDP walks them in reverse: backward "
        "produces the gradients of the last layers first, so the first bucket is complete first and its "
        "all-reduce can start earliest.")),
    (_strictly_over, problem(
        "桶里的字节数一旦达到上限（>=）就该关闭，而不是超过（>）之后才关。",
        "a bucket is closed as soon as it holds at least the cap (>=), not only once it exceeds it (>).")),
    (_close_before, problem(
        "DDP（和 PyTorch）的规则是先把参数放进当前桶，再检查是否达到上限；不会为了不超过上限而提前关桶，"
        "所以比上限还大的参数会和它前面的参数共用一个桶，并把这个桶关闭。",
        "DDP's rule (PyTorch's too) adds the parameter to the open bucket first and then checks the cap; it "
        "never closes a bucket early to stay under the cap, so a parameter larger than the cap shares the "
        "bucket with the parameters before it, and closes it.")),
    (_as_if_float32, problem(
        "上限按字节计算：每个参数占 numel() * element_size() 字节（float64 每个元素 8 字节），不是 numel() * 4。",
        "the cap counts bytes: a parameter takes numel() * element_size() bytes (8 per element in float64), "
        "not numel() * 4.")),
]


def _check_buckets(rt, result, module):
    """Every case against :func:`reference_buckets`; the first two wrong cases are shown, with the
    explanation of the first slip recognised (forward order, ``>``, closing early, 4 bytes per element)."""
    if not isinstance(result, dict):
        return [problem("run() 应返回 bucket_cases(build_buckets) 的结果（一个 dict）。",
                        "run() should return bucket_cases(build_buckets) (a dict).")]
    wrong, hint = [], None
    for case in BUCKET_CASES:
        name, _, cap = case
        params = case_params(case)
        want = reference_buckets(params, cap)
        got = _as_buckets(result.get(name))
        if got == want:
            continue
        sizes = [_nbytes(p) for p in params]
        wrong.append(problem(
            f"用例“{name}”：参数大小（字节，按注册顺序）{sizes}，上限 {cap} 字节，应得到 {want}，你的结果是 "
            f"{result.get(name)!r}。",
            f"case '{name}': parameter sizes (bytes, in registration order) {sizes}, cap {cap} B: expected "
            f"{want}, yours is {result.get(name)!r}."))
        if hint is None:
            hint = next((h for rule, h in _BUCKET_HINTS if got == rule(params, cap)), None)
        if hint is None and got is not None and [sorted(b) for b in got] == [sorted(b) for b in want]:
            hint = problem("分组是对的，但每个桶里的下标要按加入的先后顺序排列（也就是从大到小）。",
                           "the grouping is right, but each bucket lists its indices in the order they were added "
                           "(that is, descending).")
    out = wrong[:2]
    if len(wrong) > 2:
        out.append(problem(f"另有 {len(wrong) - 2} 个用例也不对。", f"{len(wrong) - 2} more case(s) are wrong too."))
    return out + ([hint] if hint else [])


register(Exercise(
    id="lab02.buckets", lab=LAB, entry="run", filename="lab02_buckets.py", timeout=20,
    title={"en": "1 · Assign parameters to gradient buckets", "zh": "1 · 把参数分进梯度桶"},
    checks=[_check_buckets], world_sizes=(1,)))


# ------------------------------------------------------------------ 2. one all-reduce per bucket
def _rank_world():
    return dist.get_rank(), dist.get_world_size()


def _device():
    from dtrain_lab.jobs import runtime

    return runtime.current().device


def _batch(step: int, rank: int | None, world: int):
    """The global batch of ``step`` (``rank=None``) or ``rank``'s shard of it."""
    from dtrain_lab.data import global_batch, shard

    batch = global_batch(_dataset(), step, GLOBAL_BATCH)
    return batch if rank is None else shard(batch, rank, world)


def _record(params) -> list:
    return [None if p.grad is None else p.grad.detach().cpu().clone() for p in params]


def _sgd(params) -> None:
    with torch.no_grad():
        for p in params:
            if p.grad is not None:
                p -= LR * p.grad


def train(sync_gradients, steps: int = STEPS) -> dict:
    """Driver of exercise 2: train the lab's model on this rank's shard for ``steps`` SGD steps,
    calling ``sync_gradients(params, buckets)`` between backward and the step. Returns the gradients
    after each synchronisation and the final parameters."""
    rank, world = _rank_world()
    model = lab_model().to(_device())
    params = list(model.parameters())
    grads = []
    for step in range(steps):
        x, y = _batch(step, rank, world)
        model.zero_grad()
        F.mse_loss(model(x.to(_device())), y.to(_device())).backward()
        sync_gradients(params, [list(b) for b in BUCKETS])   # a copy: ours stays intact
        grads.append(_record(params))
        _sgd(params)
    return {"grads": grads, "params": [p.detach().cpu().clone() for p in params]}


def reference_training(steps: int = STEPS, shard_of: tuple[int, int] | None = None) -> dict:
    """Single-process training on the global batch (or, with ``shard_of=(rank, world)``, on one
    shard without any synchronisation): the gradients of each step and the final parameters."""
    model = lab_model()
    params = list(model.parameters())
    grads = []
    for step in range(steps):
        x, y = _batch(step, *(shard_of or (None, 1)))
        model.zero_grad()
        F.mse_loss(model(x), y).backward()
        grads.append(_record(params))
        _sgd(params)
    return {"grads": grads, "params": [p.detach().clone() for p in params]}


def _close(a, b) -> bool:
    if not isinstance(a, torch.Tensor) or a.shape != b.shape:
        return False
    return bool(torch.allclose(a.double(), b.double(), rtol=1e-5, atol=1e-6))


def _max_diff(a, b) -> float:
    try:
        return float((a.double() - b.double()).abs().max())
    except Exception:  # noqa: BLE001 - only used in a message
        return math.nan


def _check_training(rt, result, module):
    if not isinstance(result, dict) or not isinstance(result.get("grads"), list) or "params" not in result:
        return [problem("run() 应返回驱动函数的结果（一个含 grads 和 params 的 dict），请不要修改 run()。",
                        "run() should return the driver's result (a dict with grads and params); do not change run().")]
    ref = reference_training()
    local = reference_training(steps=1, shard_of=(rt.rank, rt.world_size))["grads"][0]
    world = rt.world_size
    for step, (got, want) in enumerate(zip(result["grads"], ref["grads"])):
        for name, g, w, mine in zip(PARAM_NAMES, got, want, local):
            if g is None:
                return [problem(f"第 {step + 1} 步同步之后，{name} 的 .grad 是 None：梯度要写回 param.grad。",
                                f"after the synchronisation of step {step + 1}, {name}.grad is None: the averaged "
                                f"gradient must be written back into param.grad.")]
            if _close(g, w):
                continue
            if _close(g, w * world):
                return [problem(
                    f"{name} 的梯度是各 rank 梯度之和（平均值的 {world} 倍）：All-Reduce 求的是和，还要除以 world size。",
                    f"the gradient of {name} is the sum of the ranks' gradients ({world} times the average): "
                    f"all-reduce sums; divide by the world size.")]
            if step == 0 and _close(g, mine):
                return [problem(
                    f"同步之后 {name}.grad 仍是本 rank 自己的梯度：平均后的扁平缓冲区没有拷回 param.grad"
                    f"（torch.cat 得到的是新张量，对它做 All-Reduce 不会改动原来的梯度）。",
                    f"after the synchronisation {name}.grad still holds this rank's own gradient: the averaged flat "
                    f"buffer was not copied back into param.grad (torch.cat makes a new tensor; all-reducing it "
                    f"leaves the gradients untouched).")]
            return [problem(
                f"第 {step + 1} 步同步之后，{name} 的梯度不等于全局 batch 上的梯度（各 rank 梯度的平均值），"
                f"最大差 {_max_diff(g, w):.3g}。",
                f"after the synchronisation of step {step + 1}, the gradient of {name} is not the gradient of the "
                f"global batch (the average of the ranks' gradients): max difference {_max_diff(g, w):.3g}.")]
    if len(result["grads"]) != len(ref["grads"]):
        return [problem("驱动函数没有跑完所有的步数，请不要修改 run()。",
                        "the driver did not run every step; do not change run().")]
    for name, p, w in zip(PARAM_NAMES, result["params"], ref["params"]):
        if not _close(p, w):
            return [problem(f"训练 {STEPS} 步之后，{name} 和单进程在全局 batch 上训练的结果不同（最大差 {_max_diff(p, w):.3g}）。",
                            f"after {STEPS} steps, {name} differs from single-process training on the global batch "
                            f"(max difference {_max_diff(p, w):.3g}).")]
    return []


def _allreduce_sizes(calls) -> list[int]:
    return [math.prod(c.get("shape") or [0]) for c in calls if c["op"] == "all_reduce"]


def _one_allreduce_per_bucket(traces):
    """Every rank issued exactly one all-reduce per bucket and step, of the bucket's size, in
    bucket order: what bucketing is for. (A correct average from one all-reduce per parameter is
    still wrong here: it pays the per-message latency once per tensor.)"""
    want = BUCKET_NUMELS * STEPS
    per_param = [p.numel() for p in lab_model().parameters()]
    for rank, calls in sorted(traces.items()):
        sizes = _allreduce_sizes(calls)
        if sizes == want:
            continue
        per_step = len(sizes) / STEPS
        if len(sizes) == len(per_param) * STEPS and sorted(sizes) == sorted(per_param * STEPS):
            return [problem(
                f"每一步每个参数各做了一次 All-Reduce（共 {len(sizes)} 次）。分桶的意义就在于每个桶只发一条消息："
                f"把一个桶里所有梯度拼成一块扁平缓冲区，每步只做 {len(BUCKETS)} 次 All-Reduce。",
                f"one all-reduce per parameter and step ({len(sizes)} in all). Buckets exist to send one message "
                f"per bucket: flatten every gradient of a bucket into one buffer, {len(BUCKETS)} all-reduces "
                f"per step.")]
        if sorted(sizes) == sorted(want):
            return [problem(
                f"rank {rank} 的 All-Reduce 大小依次是 {sizes[:len(BUCKETS)]}…，顺序不对：要按桶列表的顺序"
                f"（先 bucket 0，大小依次为 {BUCKET_NUMELS}）规约，这也是反向传播中各桶凑齐的顺序。",
                f"rank {rank}'s all-reduces have sizes {sizes[:len(BUCKETS)]}… in the wrong order: reduce the buckets "
                f"in list order (bucket 0 first, sizes {BUCKET_NUMELS}), the order in which backward completes them.")]
        return [problem(
            f"每一步应该正好有 {len(BUCKETS)} 次 All-Reduce，每个桶一次，元素个数依次为 {BUCKET_NUMELS}；"
            f"rank {rank} 一共做了 {len(sizes)} 次（平均每步 {per_step:g} 次），大小为 {sizes[:12]}"
            f"{'…' if len(sizes) > 12 else ''}。",
            f"each step should issue exactly {len(BUCKETS)} all-reduces, one per bucket, of {BUCKET_NUMELS} "
            f"elements in that order; rank {rank} issued {len(sizes)} ({per_step:g} per step), of sizes "
            f"{sizes[:12]}{'…' if len(sizes) > 12 else ''}.")]
    return []


register(Exercise(
    id="lab02.sync", lab=LAB, entry="run", filename="lab02_sync.py", timeout=20,
    title={"en": "2 · One all-reduce per bucket", "zh": "2 · 每个桶一次 All-Reduce"},
    checks=[_check_training], trace_checks=[_one_allreduce_per_bucket], world_sizes=(2, 3)))


# ------------------------------------------------------------------ 3. overlap with backward
def _allreduces_so_far() -> int | None:
    """All-reduces this rank has issued so far, read from the grader's trace of this rank (one line
    per collective, written when the call starts: :mod:`dtrain_lab.grading.trace`, at the path the
    harness gives it). ``None`` outside the grader."""
    from dtrain_lab.grading import trace

    if not getattr(dist.all_reduce, "__dtrain_traced__", False):
        return None
    path = os.path.join(os.environ.get("DTRAIN_JOB_DIR", "/tmp"), f"trace.{dist.get_rank()}.jsonl")
    return sum(1 for c in trace.read(path) if c["op"] == "all_reduce")


def train_overlap(attach_overlap, steps: int = STEPS) -> dict:
    """Driver of exercise 3: ``finish = attach_overlap(params, buckets)`` once, then each step
    forward, backward, ``finish()``, SGD. Also records, per step, how many all-reduces had been
    issued when backward reached the input (see the module docstring)."""
    rank, world = _rank_world()
    model = lab_model().to(_device())
    params = list(model.parameters())
    finish = attach_overlap(params, [list(b) for b in BUCKETS])
    grads, in_backward = [], []
    for step in range(steps):
        x, y = _batch(step, rank, world)
        x = x.to(_device()).requires_grad_(True)   # only to observe when backward reaches the input
        seen = []
        x.register_hook(lambda g: seen.append(_allreduces_so_far()))
        before = _allreduces_so_far()
        model.zero_grad()
        F.mse_loss(model(x), y.to(_device())).backward()
        in_backward.append(None if before is None or not seen or seen[0] is None else seen[0] - before)
        finish()
        grads.append(_record(params))
        _sgd(params)
    return {"grads": grads, "params": [p.detach().cpu().clone() for p in params], "in_backward": in_backward}


def _check_overlap(rt, result, module):
    out = _check_training(rt, result, module)
    seen = result.get("in_backward") if isinstance(result, dict) else None
    if not isinstance(seen, list) or len(seen) != STEPS or any(s is None for s in seen):
        return out + [problem("驱动函数没有记录反向传播期间的 All-Reduce，请不要修改 run()。",
                              "the driver recorded no all-reduce during backward; do not change run().")]
    late = [i + 1 for i, s in enumerate(seen) if s < 1]
    if late:
        out.append(problem(
            f"第 {', '.join(map(str, late))} 步里，反向传播算到输入层时还一次 All-Reduce 都没有发起，"
            f"而那时最后几层所在的 bucket 0 和 bucket 1 早已凑齐。请在 post-accumulate-grad hook 里，"
            f"一个桶凑齐就立刻（按桶的顺序）用 async_op=True 发起它的 All-Reduce，finish() 里只做等待和写回。",
            f"in step(s) {', '.join(map(str, late))} no all-reduce had been issued when backward reached the input "
            f"layer, although buckets 0 and 1 (the last layers) were complete long before. Launch each bucket's "
            f"all-reduce with async_op=True from the post-accumulate-grad hooks as soon as the bucket is complete "
            f"(in bucket order), and only wait and write back in finish()."))
        if 1 not in late:
            out.append(problem("第 1 步是重叠的，之后却不是：finish() 要把每一步的状态（各桶还差几个梯度、下一个要发起的桶）复位，"
                               "hook 在下一步还会继续触发。",
                               "step 1 overlapped and later steps did not: finish() must reset the per-step state "
                               "(gradients still missing per bucket, the next bucket to launch), since the hooks fire "
                               "again in the next step."))
    return out


register(Exercise(
    id="lab02.overlap", lab=LAB, entry="run", filename="lab02_overlap.py", timeout=20,
    title={"en": "3 · Overlap the all-reduces with backward", "zh": "3 · 让 All-Reduce 与反向传播重叠"},
    checks=[_check_overlap], trace_checks=[_one_allreduce_per_bucket], world_sizes=(2, 3)))
