"""Lab 10 — deadlocks: eight broken distributed programs drawn from real failure modes.

Each exercise's contract is a function ``run()`` that the grader calls in every rank after the
process group is up (``torch.distributed`` is initialised; ``dtrain_lab.jobs.runtime.current()`` tells
the rank). The checks below compute the right answer independently and compare; the grader also
compares every rank's sequence of collectives, so a "fix" that deadlocks only sometimes, or that
silently combines the wrong tensors, fails every time.

The broken programs themselves are in :data:`BROKEN` (the lab shows them; ``tests/`` checks each
one fails).
"""
from __future__ import annotations

import torch

from dtrain_lab.grading.registry import Exercise, problem, register

LAB = "lab_10"


def _close(a, b, tol=1e-6) -> bool:
    try:
        return abs(float(a) - float(b)) <= tol * max(1.0, abs(float(b)))
    except (TypeError, ValueError):
        return False


def _expect(result, want, what_en, what_zh):
    if _close(result, want):
        return []
    return [problem(f"{what_zh}应为 {want:g}，你的结果是 {result!r}", f"{what_en} should be {want:g}, yours is {result!r}")]


# ------------------------------------------------------------------ 1. collective under a rank branch
def local_loss(rank: int) -> float:
    """Each rank's loss in exercises 1 and 2 (a stand-in for a real forward pass)."""
    return float(rank + 1) ** 2


def _check_mean_loss(rt, result, module):
    want = sum(local_loss(r) for r in range(rt.world_size)) / rt.world_size
    return _expect(result, want, "the mean loss over all ranks", "所有 rank 的平均 loss ")


register(Exercise(
    id="lab10.rank_branch", lab=LAB, entry="run", filename="lab10_rank_branch.py", timeout=10,
    title={"en": "1 · A collective under a rank-only branch", "zh": "1 · 只在某个 rank 分支里调用的集合通信"},
    checks=[_check_mean_loss], world_sizes=(2, 3)))


# ------------------------------------------------------------------ 2. rank-0-only validation + broadcast
VAL_SIZE = 10


def val_sample(i: int) -> float:
    return float(i % 7) + 0.5


def _check_val(rt, result, module):
    want = sum(val_sample(i) for i in range(VAL_SIZE)) / VAL_SIZE
    return _expect(result, want, "the validation mean (over the whole validation set)", "验证集平均值（整个验证集）")


register(Exercise(
    id="lab10.rank0_eval", lab=LAB, entry="run", filename="lab10_rank0_eval.py", timeout=10,
    title={"en": "2 · Rank-0-only validation, then a broadcast", "zh": "2 · 只在 rank 0 上验证，再广播结果"},
    checks=[_check_val], world_sizes=(2, 3)))


# ------------------------------------------------------------------ 3. uneven numbers of batches
def local_batches(rank: int) -> list[float]:
    """Rank r has r+2 batches (so ranks disagree on the count); batch values are distinct."""
    return [float(10 * rank + j + 1) for j in range(rank + 2)]


def _check_uneven(rt, result, module):
    want = sum(sum(local_batches(r)) for r in range(rt.world_size))
    return _expect(result, want, "the sum over every batch of every rank (no batch may be dropped)",
                   "所有 rank 全部 batch 的总和（不能丢掉任何 batch）")


register(Exercise(
    id="lab10.uneven_batches", lab=LAB, entry="run", filename="lab10_uneven_batches.py", timeout=10,
    title={"en": "3 · Uneven numbers of batches per rank", "zh": "3 · 各 rank 的 batch 数不一样"},
    checks=[_check_uneven], world_sizes=(2, 3)))


# ------------------------------------------------------------------ 4. exception swallowed with continue
STEPS = 6


def load_batch(rank: int, step: int) -> float:
    """Fails on rank 1 at step 2 (a corrupt sample, say); every other batch is fine."""
    if rank == 1 and step == 2:
        raise ValueError(f"corrupt batch at step {step} on rank {rank}")
    return float(step + 1)


def _check_swallowed(rt, result, module):
    # a step is skipped by *every* rank when any rank's batch failed; other steps sum over ranks
    want = 0.0
    for step in range(STEPS):
        values = []
        for r in range(rt.world_size):
            try:
                values.append(load_batch(r, step))
            except ValueError:
                values = None
                break
        if values is not None:
            want += sum(values)
    return _expect(result, want, "the total over the steps every rank could use",
                   "所有 rank 都能使用的那些 step 的总和")


register(Exercise(
    id="lab10.swallowed_exception", lab=LAB, entry="run", filename="lab10_swallowed_exception.py", timeout=10,
    title={"en": "4 · An exception swallowed with `continue` on one rank",
           "zh": "4 · 某个 rank 用 `continue` 吞掉了异常"},
    checks=[_check_swallowed], world_sizes=(2, 3)))


# ------------------------------------------------------------------ 5. collectives in different orders
def local_stats(rank: int) -> dict:
    return {"loss": float(rank + 1), "correct": float(10 * (rank + 1))}


def _check_order(rt, result, module):
    if not isinstance(result, dict):
        return [problem("run() 应返回一个 dict", "run() should return a dict")]
    out = []
    for key in ("loss", "correct"):
        want = sum(local_stats(r)[key] for r in range(rt.world_size))
        out += _expect(result.get(key), want, f"the summed {key!r}", f"求和后的 {key!r} ")
    return out


register(Exercise(
    id="lab10.collective_order", lab=LAB, entry="run", filename="lab10_collective_order.py", timeout=10,
    title={"en": "5 · Collectives issued in different orders", "zh": "5 · 各 rank 发起集合通信的顺序不同"},
    checks=[_check_order], world_sizes=(2, 3)))


# ------------------------------------------------------------------ 6. blocking send/send
MESSAGE_NUMEL = 4 << 20  # 16 MiB of float32: far beyond any socket buffer


def _check_exchange(rt, result, module):
    want = float(1 - rt.rank)  # the peer's rank, the value it filled its message with
    if not isinstance(result, torch.Tensor) or result.numel() != MESSAGE_NUMEL:
        return [problem(f"run() 应返回从对方收到的、含 {MESSAGE_NUMEL} 个元素的张量",
                        f"run() should return the tensor of {MESSAGE_NUMEL} elements received from the peer")]
    if not bool((result == want).all()):
        return [problem("收到的数据不是对方发来的", "the received data is not what the peer sent")]
    return []


def _no_send_send(traces):
    """Both ranks' first point-to-point call is a blocking send: a deadlock as soon as the message
    exceeds the transport's buffers, whether or not this run happened to get through."""
    firsts = {}
    for rank, calls in traces.items():
        p2p = [c for c in calls if c["op"] in ("send", "recv", "isend", "irecv", "batch_isend_irecv")]
        firsts[rank] = p2p[0]["op"] if p2p else None
    if len(firsts) == 2 and all(op == "send" for op in firsts.values()):
        return [problem("两个 rank 都先调用阻塞的 send：双方都在等对方接收，消息一大就会死锁（这次没卡住只是运气）。",
                        "both ranks start with a blocking send: each waits for the other to receive, a deadlock "
                        "once the message is large (if this run got through, it was luck).")]
    return []


register(Exercise(
    id="lab10.send_send", lab=LAB, entry="run", filename="lab10_send_send.py", timeout=10,
    title={"en": "6 · Blocking send/send between two ranks", "zh": "6 · 两个 rank 互相阻塞 send"},
    checks=[_check_exchange], trace_checks=[_no_send_send], world_sizes=(2,)))


# ------------------------------------------------------------------ 7. barrier inside if rank == 0
def _check_shared_file(rt, result, module):
    want = "step 100 checkpoint"
    if result != want:
        return [problem(f"每个 rank 都应读到 rank 0 写好的 {want!r}，你的结果是 {result!r}",
                        f"every rank should read {want!r} written by rank 0, yours is {result!r}")]
    return []


def _readers_wait_for_writer(traces):
    """Reading a file another rank writes needs a synchronisation every rank takes part in; a
    sleep that is usually long enough is a race, whatever this run's result."""
    if any(not calls for calls in traces.values()):
        return [problem("有的 rank 没有参与任何集合通信就去读 rank 0 写的文件：没有同步，只是在赌时间。",
                        "some rank read the file rank 0 writes without taking part in any collective: "
                        "no synchronisation, just a bet on timing.")]
    return []


register(Exercise(
    id="lab10.barrier_rank0", lab=LAB, entry="run", filename="lab10_barrier_rank0.py", timeout=10,
    title={"en": "7 · A barrier inside `if rank == 0`", "zh": "7 · 写在 `if rank == 0` 里的 barrier"},
    checks=[_check_shared_file], trace_checks=[_readers_wait_for_writer], world_sizes=(2, 3)))


# ------------------------------------------------------------------ 8. accumulation steps differ per rank
def micro_batches(rank: int) -> list[float]:
    """Rank r has 4 + r micro-batches (4 + r: the sampler gave it more data)."""
    return [float(j + 1) * (rank + 1) for j in range(4 + rank)]


ACCUM = 2


def _check_accum(rt, result, module):
    # every rank takes the same number of optimizer steps: as many as the rank with the fewest
    # micro-batches allows; each step averages ACCUM micro-batches per rank, then over ranks
    steps = min(len(micro_batches(r)) for r in range(rt.world_size)) // ACCUM
    want = []
    for s in range(steps):
        per_rank = [sum(micro_batches(r)[s * ACCUM:(s + 1) * ACCUM]) / ACCUM for r in range(rt.world_size)]
        want.append(sum(per_rank) / rt.world_size)
    if not isinstance(result, (list, tuple)) or len(result) != len(want) \
            or not all(_close(a, b) for a, b in zip(result, want)):
        return [problem(f"每一步同步后的梯度应为 {want}，你的结果是 {result!r}",
                        f"the synchronised gradient of each step should be {want}, yours is {result!r}")]
    return []


register(Exercise(
    id="lab10.accum_steps", lab=LAB, entry="run", filename="lab10_accum_steps.py", timeout=10,
    title={"en": "8 · Accumulation steps that differ per rank", "zh": "8 · 各 rank 的梯度累积步数不同"},
    checks=[_check_accum], world_sizes=(2, 3)))

