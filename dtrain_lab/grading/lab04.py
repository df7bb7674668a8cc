"""Lab 04 — top-k sparsification with error feedback, by hand.

Two exercises, each a function the learner writes in the lab notebook
(``solutions/_source/lab_04_compression.md``):

1. ``sparse_allreduce(values, indices, numel, group=None)``: every rank holds ``k`` values and their
   ``k`` positions in a gradient of ``numel`` entries (``k`` the same on every rank, the positions
   not); return the dense average over the ranks. The positions differ from rank to rank, so this
   is two all-gathers (values, indices) and a scatter-add, never an all-reduce of the indices.
2. ``topk_ef_step(grad, residual, k, group=None) -> (update, new_residual)``: top-k with error
   feedback (Stich, Cordonnier & Jaggi, "Sparsified SGD with Memory", NeurIPS 2018): add the
   residual, keep the ``k`` entries of largest magnitude, exchange them as in exercise 1, and keep
   what was not sent: ``new_residual = (grad + residual) − sent``.

As in lab 02 the learner's file ends with a ``run()`` that hands the function to a driver here
(:func:`sparse_cases`, :func:`ef_cases`); the checks recompute every rank's inputs locally and
compare with :func:`dtrain_lab.parallel.compression.topk_sparse_allreduce` (the course's reference), run on
a stand-in process group that replays what every rank contributes: no collective in the checks.
The harness's trace of collectives is checked too: an all-reduce of an integer tensor (indices
summed) or of a dense gradient-sized tensor (no compression at all) is explained and fails.
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist

from dtrain_lab.parallel.compression import CommState, payload_bytes, topk_select, topk_sparse_allreduce
from dtrain_lab.grading.registry import Exercise, problem, register

LAB = "lab_04"


# ------------------------------------------------------------------ the reference, without a process group
class _Replay(CommState):
    """A stand-in process group for :func:`topk_sparse_allreduce`: its all-gathers return what every
    simulated rank contributes (each rank's top-k values, then its indices), in rank order."""

    def __init__(self, inputs: list[torch.Tensor], k: int):
        super().__init__(None)
        picks = [topk_select(t, k) for t in inputs]
        self._queue = [[v for _, v in picks], [i for i, _ in picks]]
        self._world = len(inputs)

    @property
    def world_size(self) -> int:
        return self._world

    def all_gather(self, t: torch.Tensor) -> list[torch.Tensor]:
        self.comm.record("all_gather", payload_bytes(t))
        return [x.to(t.dtype) for x in self._queue.pop(0)]


def reference_average(inputs: list[torch.Tensor], k: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(average, sent)`` of rank ``rank``: what :func:`topk_sparse_allreduce` returns there when
    the ranks' flat tensors are ``inputs``."""
    return topk_sparse_allreduce(inputs[rank], k, _Replay(inputs, k))


def _rank_world():
    return dist.get_rank(), dist.get_world_size()


def _device():
    from dtrain_lab.jobs import runtime

    return runtime.current().device


def _same(a, b) -> bool:
    if not isinstance(a, torch.Tensor) or a.shape != b.shape:
        return False
    return bool(torch.allclose(a.detach().cpu().double(), b.double(), rtol=1e-5, atol=1e-6))


def _shown(t) -> str:
    if isinstance(t, torch.Tensor) and t.numel() <= 8:
        return "[" + ", ".join(f"{float(x):.4g}" for x in t.detach().cpu().reshape(-1)) + "]"
    if isinstance(t, torch.Tensor):
        return f"tensor{tuple(t.shape)}"
    return repr(t)[:80]


def _difference(got, want) -> dict:
    """Where ``got`` differs from ``want`` (same shape), in both languages: the whole tensors when
    they are short, else how many positions differ and the worst one."""
    if want.numel() <= 8:
        return problem(f"应为 {_shown(want)}，你的结果是 {_shown(got)}", f"expected {_shown(want)}, yours is {_shown(got)}")
    g, w = got.detach().cpu().double().reshape(-1), want.double().reshape(-1)
    d = (g - w).abs()
    bad, i = int((d > 1e-6 + 1e-5 * w.abs()).sum()), int(d.argmax())
    return problem(f"{w.numel()} 个位置中有 {bad} 个不对，比如位置 {i}：应为 {float(w[i]):.4g}，你的结果是 {float(g[i]):.4g}",
                   f"{bad} of {w.numel()} positions are wrong, e.g. position {i}: expected {float(w[i]):.4g}, "
                   f"yours is {float(g[i]):.4g}")


def _first_and_count(found: list) -> list:
    """The first problem found, and how many more cases are wrong (one line per rank is enough)."""
    if len(found) <= 1:
        return found
    return [found[0], problem(f"另有 {len(found) - 1} 个用例也不对。", f"{len(found) - 1} more case(s) are wrong too.")]


# ------------------------------------------------------------------ 1. sparse all-reduce
HAND_VALUES = [[1.5, -2.0], [0.5, 4.0], [-1.0, 2.5]]
HAND_INDICES = [[1, 6], [6, 3], [0, 1]]          # rank 0 and rank 1 both chose 6; 1 + 6 = 7: nobody chose 7
SHARED_INDICES = [2, 5, 11, 14]

# (name, numel, k); every rank's values and indices come from sparse_input()
SPARSE_CASES = [("hand-made", 8, 2), ("same positions on every rank", 16, 4), ("random", 1000, 10)]


def sparse_input(name: str, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(values, indices)`` of rank ``rank`` in case ``name`` (float32 and int64, ``k`` each)."""
    if name == "hand-made":
        return torch.tensor(HAND_VALUES[rank % 3]), torch.tensor(HAND_INDICES[rank % 3])
    if name == "same positions on every rank":
        return torch.tensor([1.0, -2.0, 3.0, 0.5]) * (rank + 1), torch.tensor(SHARED_INDICES)
    g = torch.Generator().manual_seed(100 + rank)
    return torch.randn(10, generator=g), torch.randperm(1000, generator=g)[:10]


def sparse_cases(sparse_allreduce) -> dict:
    """Driver of exercise 1: ``{case name: sparse_allreduce(values, indices, numel)}``."""
    out = {}
    for name, numel, _ in SPARSE_CASES:
        values, indices = sparse_input(name, dist.get_rank())
        out[name] = sparse_allreduce(values.to(_device()), indices.to(_device()), numel)
    return out


def _dense(values, indices, numel) -> torch.Tensor:
    t = torch.zeros(numel)
    t[indices] = values
    return t


def _check_sparse(rt, result, module):
    if not isinstance(result, dict):
        return [problem("run() 应返回 sparse_cases(sparse_allreduce) 的结果（一个 dict）。",
                        "run() should return sparse_cases(sparse_allreduce) (a dict).")]
    found = []
    for name, numel, k in SPARSE_CASES:
        inputs = [_dense(*sparse_input(name, r), numel) for r in range(rt.world_size)]
        want = reference_average(inputs, k, rt.rank)[0]
        got = result.get(name)
        if _same(got, want):
            continue
        if _same(got, want * rt.world_size):
            found.append(problem(
                f"用例“{name}”：结果是各 rank 的和（平均值的 {rt.world_size} 倍），还要除以 world size。",
                f"case '{name}': you return the sum over the ranks ({rt.world_size} times the average); "
                f"divide by the world size."))
        elif isinstance(got, torch.Tensor) and got.shape == want.shape:
            d = _difference(got, want)
            found.append(problem(f"用例“{name}”（numel={numel}，每个 rank k={k}）：{d['zh']}。",
                                 f"case '{name}' (numel={numel}, k={k} per rank): {d['en']}."))
        else:
            found.append(problem(
                f"用例“{name}”：应返回形状为 ({numel},) 的稠密张量，你返回的是 {_shown(got)}。",
                f"case '{name}': return a dense tensor of shape ({numel},); yours is {_shown(got)}."))
    return _first_and_count(found)


def _no_summed_indices_or_dense(dense_sizes):
    def check(traces):
        out = []
        for rank, calls in sorted(traces.items()):
            for c in calls:
                if c["op"] != "all_reduce":
                    continue
                dtype = c.get("dtype", "")
                if dtype.startswith(("int", "uint", "long")):
                    out.append(problem(
                        f"rank {rank} 对一个整数张量（{dtype}，形状 {c.get('shape')}）做了 All-Reduce，这多半是下标。"
                        f"下标求和毫无意义：rank 0 的位置 1 加上 rank 1 的位置 6 得到位置 7，谁也没选过它，"
                        f"而两个不相干位置上的值被加到了一起。各 rank 选中的位置不同，稀疏梯度不能 All-Reduce："
                        f"用 All-Gather 收集每个 rank 的值和下标，再按下标 scatter-add 到稠密张量里。",
                        f"rank {rank} all-reduced an integer tensor ({dtype}, shape {c.get('shape')}), most likely "
                        f"indices. Summing indices is meaningless: rank 0's position 1 plus rank 1's position 6 "
                        f"is position 7, which nobody chose, and values of unrelated positions get added together. "
                        f"The ranks choose different positions, so a sparse gradient cannot be all-reduced: "
                        f"all-gather every rank's values and indices, then scatter-add them into a dense tensor."))
                    return out
                if math.prod(c.get("shape") or [0]) in dense_sizes:
                    out.append(problem(
                        f"rank {rank} 对一个和整个梯度一样大的稠密张量（形状 {c.get('shape')}）做了 All-Reduce："
                        f"结果也许是对的，但发送的字节数和不压缩完全一样。只发送 k 个值和 k 个下标（All-Gather）。",
                        f"rank {rank} all-reduced a dense tensor as large as the whole gradient (shape "
                        f"{c.get('shape')}): the result may be right, but it sends as many bytes as no compression "
                        f"at all. Send only the k values and k indices (all-gather)."))
                    return out
        return out
    return check


def _explain_gather(outcome: str, feedback: str, source: str) -> list:
    """A crash or hang in all-gather (gloo: "Received data size doesn't match expected size"): most
    often ranks that pass tensors of different sizes."""
    signs = ("all_gather", "allgather", "received data size", "size doesn't match")
    if not any(sign in feedback.lower() for sign in signs):
        return []
    return [problem(
        "All-Gather 要求每个 rank 传入形状相同的张量。如果各 rank 选出的元素个数不同（比如按阈值选，而不是固定选 k 个），"
        "All-Gather 就会出错或挂起。每个 rank 都要选正好 k 个元素，k 在所有 rank 上相同。",
        "all-gather needs a tensor of the same shape on every rank. If the ranks select different numbers of "
        "entries (a threshold instead of exactly k, say), the all-gather fails or hangs. Select exactly k "
        "entries on every rank, with the same k everywhere.")]


register(Exercise(
    id="lab04.sparse_allreduce", lab=LAB, entry="run", filename="lab04_sparse_allreduce.py", timeout=20,
    title={"en": "1 · A sparse all-reduce from all-gathers", "zh": "1 · 用 All-Gather 实现稀疏 All-Reduce"},
    checks=[_check_sparse], trace_checks=[_no_summed_indices_or_dense({n for _, n, _ in SPARSE_CASES})],
    explain=_explain_gather, world_sizes=(2, 3)))


# ------------------------------------------------------------------ 2. top-k with error feedback
HAND_GRADS = [[3.1, 1.3, 0.7, -0.45, 0.21, 2.05],
              [-0.4, 2.6, 1.15, 0.33, -3.3, 0.9],
              [0.63, -0.87, 2.41, 1.73, 0.05, -1.19]]

# (name, numel, k, steps); the gradients come from ef_grad()
EF_CASES = [("hand-made", 6, 2, 4), ("random", 200, 10, 4)]


def ef_grad(name: str, rank: int, step: int) -> torch.Tensor:
    """Rank ``rank``'s gradient at ``step``: constant over the steps in the hand-made case (error
    feedback then sends every entry sooner or later), fresh random numbers in the random case."""
    if name == "hand-made":
        return torch.tensor(HAND_GRADS[rank % 3])
    return torch.randn(200, generator=torch.Generator().manual_seed(1000 * rank + step))


def ef_cases(topk_ef_step) -> dict:
    """Driver of exercise 2: for each case, ``steps`` calls of ``topk_ef_step`` starting from a zero
    residual, each fed the residual the previous call returned. ``{case: [(update, residual), ...]}``."""
    rank = dist.get_rank()
    out = {}
    for name, numel, k, steps in EF_CASES:
        residual = torch.zeros(numel, device=_device())
        record = []
        for step in range(steps):
            update, residual = topk_ef_step(ef_grad(name, rank, step).to(_device()), residual, k)
            record.append((update.detach().cpu().clone(), residual.detach().cpu().clone()))
        out[name] = record
    return out


def reference_ef(name: str, numel: int, k: int, steps: int, world: int, rank: int, *,
                 error_feedback: bool = True) -> list[dict]:
    """Every step of rank ``rank``: ``input`` (gradient + residual), ``update``, ``sent``, ``residual``."""
    residuals = [torch.zeros(numel) for _ in range(world)]
    out = []
    for step in range(steps):
        grads = [ef_grad(name, r, step) for r in range(world)]
        inputs = [g + res for g, res in zip(grads, residuals)] if error_feedback else grads
        results = [reference_average(inputs, k, r) for r in range(world)]
        residuals = [x - sent for x, (_, sent) in zip(inputs, results)] if error_feedback else residuals
        out.append({"grad": grads[rank], "input": inputs[rank], "update": results[rank][0],
                    "sent": results[rank][1], "residual": residuals[rank]})
    return out


def _residual_hint(residual, want: dict, numel: int) -> dict:
    if _same(residual, want["input"] - want["update"]):
        return problem("减掉的是平均后的更新量；应该减掉本 rank 自己发送的那 k 个值。",
                       "you subtracted the averaged update; subtract what this rank itself sent (its k values).")
    if _same(residual, want["grad"] - want["sent"]):
        return problem("上一步的残差被丢掉了：新残差 = (梯度 + 旧残差) − 本 rank 发送的值。",
                       "the old residual was dropped: new residual = (grad + old residual) − what this rank sent.")
    if _same(residual, torch.zeros(numel)):
        return problem("残差一直是 0：没发送的部分要留在残差里，下一步再加回梯度。",
                       "the residual stays zero: keep what was not sent in it, to add to the next gradient.")
    return problem("新残差 = (梯度 + 旧残差) − 本 rank 发送的值（被选中的位置为 0，其余位置保持不变）。",
                   "new residual = (grad + old residual) − what this rank sent (zero where selected, unchanged "
                   "elsewhere).")


def _check_ef_case(name, numel, k, steps, got, rt) -> dict | None:
    world = rt.world_size
    if not isinstance(got, list) or len(got) != steps:
        return problem(f"用例“{name}”：驱动函数没有跑完，请不要修改 run()。",
                       f"case '{name}': the driver did not finish; do not change run().")
    ref = reference_ef(name, numel, k, steps, world, rt.rank)
    no_ef = reference_ef(name, numel, k, steps, world, rt.rank, error_feedback=False)
    if all(_same(u, s["update"]) for (u, _), s in zip(got, no_ef)) \
            and not all(_same(u, s["update"]) for (u, _), s in zip(got, ref)):
        return problem(
            f"用例“{name}”：每一步的更新量都和不带误差反馈的 top-k 一样：选 top-k 之前要先把残差加到梯度上，"
            f"否则始终挤不进前 k 名的小分量永远发不出去。",
            f"case '{name}': every update equals top-k without error feedback: add the residual to the gradient "
            f"before selecting the top k, or the small entries are never sent.")
    for step, ((update, residual), want) in enumerate(zip(got, ref)):
        where_zh, where_en = f"用例“{name}”第 {step + 1} 步", f"case '{name}', step {step + 1}"
        if not _same(update, want["update"]):
            if _same(update, want["update"] * world):
                return problem(f"{where_zh}：更新量是各 rank 的和（平均值的 {world} 倍），还要除以 world size。",
                               f"{where_en}: the update is the sum over the ranks ({world} times the average); "
                               f"divide by the world size.")
            if not isinstance(update, torch.Tensor) or update.shape != want["update"].shape:
                return problem(f"{where_zh}：更新量应是形状为 ({numel},) 的稠密张量，你的是 {_shown(update)}。",
                               f"{where_en}: the update should be a dense tensor of shape ({numel},); yours is "
                               f"{_shown(update)}.")
            d = _difference(update, want["update"])
            return problem(f"{where_zh}：更新量（各 rank 所发送 top-k 的平均值）{d['zh']}。",
                           f"{where_en}: the update (the average of what the ranks sent): {d['en']}.")
        if not _same(residual, want["residual"]):
            hint = _residual_hint(residual, want, numel)
            if isinstance(residual, torch.Tensor) and residual.shape == want["residual"].shape:
                d = _difference(residual, want["residual"])
            else:
                d = problem(f"你返回的是 {_shown(residual)}", f"yours is {_shown(residual)}")
            return problem(f"{where_zh}：新残差{d['zh']}。{hint['zh']}",
                           f"{where_en}: the new residual: {d['en']}. {hint['en']}")
    return None


def _check_ef(rt, result, module):
    if not isinstance(result, dict):
        return [problem("run() 应返回 ef_cases(topk_ef_step) 的结果（一个 dict）。",
                        "run() should return ef_cases(topk_ef_step) (a dict).")]
    found = [_check_ef_case(name, numel, k, steps, result.get(name), rt) for name, numel, k, steps in EF_CASES]
    return _first_and_count([p for p in found if p is not None])


register(Exercise(
    id="lab04.topk_ef", lab=LAB, entry="run", filename="lab04_topk_ef.py", timeout=20,
    title={"en": "2 · Top-k with error feedback", "zh": "2 · 带误差反馈的 Top-k"},
    checks=[_check_ef], trace_checks=[_no_summed_indices_or_dense({n for _, n, _, _ in EF_CASES})],
    explain=_explain_gather, world_sizes=(2, 3)))
