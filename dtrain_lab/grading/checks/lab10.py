"""Lab 10 — deadlocks: the checks of its nine exercises, run in the grader's process.

Every expected value is computed here from **all** ranks' private inputs
(:func:`dtrain_lab.grading.lab10.make_inputs` with the run's seed), which no single rank had: a rank
that skips the communication cannot know its peers' data, so its answer is wrong whatever it
recomputes. Besides the results, the ranks' traces of collectives are compared (every rank the
same collectives in the same order); a rank can forge its own trace, so a trace check only explains
a failure or catches an honest mistake that happened not to hang this time.

Races are decided by timing the grader controls: in exercise 7 the writer pauses in the middle of
writing for a time only it knows (1.5 to 3 s, drawn per run), so a reader that does not wait for
the writer reads nothing or half a checkpoint.
"""
from __future__ import annotations

import math

from dtrain_lab.i18n import rendered
from dtrain_lab.grading import lab10 as contract
from dtrain_lab.grading import patterns
from dtrain_lab.grading import trace
from dtrain_lab.grading.channel import short
from dtrain_lab.grading.exercise import Exercise, problem

LAB = "lab_10"


def _close(a, b, tol=1e-6) -> bool:
    try:
        return math.isclose(float(a), float(b), rel_tol=tol, abs_tol=tol)
    except (TypeError, ValueError):
        return False


def _expect(result, want: float, key: str) -> list:
    """The message ``key`` (what the value is, what it should be, what it is) unless ``result`` is ``want``."""
    if _close(result, want):
        return []
    return [problem(key, want=f"{want:.6g}", got=short(result))]


# ------------------------------------------------------------------ 1. collective under a rank branch
def _check_mean_loss(run, rank, result):
    want = sum(i["loss"] for i in run.inputs) / run.world_size
    return _expect(result, want, "lab10_mean_loss")


# ------------------------------------------------------------------ 2. rank-0-only validation + broadcast
def _check_val(run, rank, result):
    values = [v for i in run.inputs for _, v in i["val"]]
    return _expect(result, sum(values) / contract.VAL_SIZE, "lab10_val_mean")


# ------------------------------------------------------------------ 3. uneven numbers of batches
def _check_uneven(run, rank, result):
    want = sum(sum(i["batches"]) for i in run.inputs)
    return _expect(result, want, "lab10_all_batches")


# ------------------------------------------------------------------ 4. exception swallowed
def _check_swallowed(run, rank, result):
    bad = {i["fail_step"] for i in run.inputs if i["fail_step"] is not None}
    want = sum(i["steps"][s] for i in run.inputs for s in range(contract.STEPS) if s not in bad)
    return _expect(result, want, "lab10_usable_steps")


# ------------------------------------------------------------------ 5. collectives in different orders
def _check_order(run, rank, result):
    if not isinstance(result, dict):
        return [problem("lab10_want_dict", got=short(result))]
    out = []
    for key in ("loss", "correct"):
        want = sum(i["stats"][key] for i in run.inputs)
        if not _close(result.get(key), want):
            out.append(problem("lab10_expected_key", key=key, want=f"{want:.6g}", got=short(result.get(key))))
    return out


# ------------------------------------------------------------------ 6. blocking send/send
def _message(inputs: dict):
    import torch

    m = inputs["message"]
    t = torch.full((contract.MESSAGE_NUMEL,), float(m["fill"]))
    for i, v in m["spots"]:
        t[int(i)] = float(v)
    return t


def _check_exchange(run, rank, result):
    import torch

    if not isinstance(result, torch.Tensor) or result.numel() != contract.MESSAGE_NUMEL:
        return [problem("lab10_want_message", numel=contract.MESSAGE_NUMEL, got=short(result))]
    if not torch.equal(result.reshape(-1).float(), _message(run.inputs[1 - rank])):
        return [problem("lab10_not_peer_data")]
    return []


def _no_send_send(run):
    """Both ranks' first point-to-point call is a blocking send: a deadlock as soon as the message
    exceeds the transport's buffers, whether or not this run happened to get through."""
    firsts = {}
    for rank, calls in run.traces.items():
        p2p = [c for c in calls if c.get("op") in ("send", "recv", "isend", "irecv", "batch_isend_irecv")]
        firsts[rank] = p2p[0]["op"] if p2p else None
    if len(firsts) == 2 and all(op == "send" for op in firsts.values()):
        return [problem("lab10_send_send")]
    # the exercise is a point-to-point exchange: a rank that received nothing got its peer's tensor
    # some other way (the store, a socket); self-reported, so an honest detour is caught, a forged
    # trace is not (instructor guide, "what the grader proves")
    if any(not any(c.get("op") in ("recv", "irecv", "batch_isend_irecv") for c in calls)
           for calls in run.traces.values()) or len(run.traces) < run.world_size:
        return [problem("lab10_no_p2p")]
    return []


# ------------------------------------------------------------------ 7. barrier inside if rank == 0
def _check_shared_file(run, rank, result):
    want = run.inputs[0]["checkpoint"]["text"]
    if result != want:
        return [problem("lab10_wrong_checkpoint", got=short(result))]
    return []


def _readers_wait_for_writer(run):
    """Reading a file another rank writes needs a synchronisation after the write, before the read.
    A reader whose read the audit hook did not see is judged on its whole trace: it must have waited
    for the write at some point (``os.open(name, dir_fd=...)`` used to skip the check).

    From the ranks' traces (self-reported: they catch honest mistakes, whatever the timing of this
    run): rank 0's trace marks where ``write_checkpoint`` returned, a reader's where it last opened
    the checkpoint. A reader waited for the write if, before that read, it had called more
    collectives on some group of both (the world, or a group made with ``new_group``) than rank 0
    had on that group before the write ended (the next one cannot finish before rank 0 joins it,
    after the write), or received from rank 0 more often than rank 0 had sent to it by then.
    """
    if any(not calls for calls in run.traces.values()):
        return [problem("lab10_no_sync")]
    writer = run.timeline.get(0, [])
    written = next((i for i, e in enumerate(writer) if e.get("mark") and e["op"] == contract.WRITTEN), None)
    if written is None:     # no write finished: the result check says what went wrong
        return []
    before_write = writer[:written]
    for rank, entries in sorted(run.timeline.items()):
        if rank == 0:
            continue
        reads = [i for i, e in enumerate(entries) if e.get("mark") and e["op"] == contract.READ]
        # a reader whose read left no mark (opened some other way than the hook saw) must still have
        # waited for the write somewhere before it returned: its whole trace is what it did before
        before_read = entries[:reads[-1]] if reads else entries
        written_by = trace.collectives_by_group(before_write, (0, rank))
        if any(n > written_by.get(group, 0) for group, n in trace.collectives_by_group(before_read, (0, rank)).items()):
            continue
        if trace.p2p_count(before_read, "recv", 0) > trace.p2p_count(before_write, "send", rank):
            continue
        return [problem("lab10_read_before_sync", rank=rank)]
    return []


# ------------------------------------------------------------------ 8. accumulation steps differ per rank
def _check_accum(run, rank, result):
    # every rank takes the same number of optimizer steps, as many as the rank with the fewest
    # micro-batches allows (its surplus micro-batches are dropped); each step averages ACCUM
    # micro-batches per rank, then over ranks
    acc = contract.ACCUM
    steps = min(len(i["micro"]) for i in run.inputs) // acc
    want = [sum(sum(i["micro"][s * acc:(s + 1) * acc]) / acc for i in run.inputs) / run.world_size
            for s in range(steps)]
    if not isinstance(result, (list, tuple)) or len(result) != len(want) \
            or not all(_close(a, b) for a, b in zip(result, want)):
        return [problem("lab10_wrong_accum", want=short([round(w, 4) for w in want], 120), got=short(result))]
    return []


# ------------------------------------------------------------------ 9. hierarchical all-reduce
def _check_hierarchical(run, rank, result):
    want = [sum(i["grad"][k] for i in run.inputs) for k in range(contract.GRAD_NUMEL)]
    got = result.reshape(-1).tolist() if hasattr(result, "reshape") else result
    if not isinstance(got, (list, tuple)) or len(got) != len(want) or not all(_close(a, b) for a, b in zip(got, want)):
        return [problem("lab10_hier_sum", want=short([round(w, 4) for w in want], 120), got=short(result))]
    return []


def _two_levels(run):
    """What a right sum does not show: an all-reduce over the whole world (flat, no hierarchy), or the
    leaders' all-reduce on a group that is not exactly the leaders (from the ranks' traces: an honest
    mistake is caught, a forged trace is not; the sum is what proves the communication)."""
    leaders = sorted(node[0] for node in contract.node_ranks(run.world_size))
    for rank, calls in sorted(run.traces.items()):
        for c in calls:
            if c.get("op") != "all_reduce":
                continue
            if "group" not in c:
                return [problem("lab10_hier_flat", rank=rank)]
            if c["group"] != leaders:
                return [problem("lab10_hier_leaders", rank=rank, group=short(c["group"]), leaders=leaders)]
    return []


def _exercise(name: str, title: dict, checks, **kw) -> Exercise:
    return Exercise(id=f"lab10.{name}", lab=LAB, filename=f"lab10_{name}.py", timeout=kw.pop("timeout", 10),
                    title=title, checks=checks, make_inputs=contract.make_inputs,
                    world_sizes=kw.pop("world_sizes", (2, 3)), **kw)


EXERCISES = [
    _exercise("rank_branch", rendered("lab10_title_rank_branch"),
              [_check_mean_loss]),
    _exercise("rank0_eval", rendered("lab10_title_rank0_eval"),
              [_check_val]),
    _exercise("uneven_batches", rendered("lab10_title_uneven_batches"),
              [_check_uneven]),
    _exercise("swallowed_exception", rendered("lab10_title_swallowed_exception"), [_check_swallowed]),
    _exercise("collective_order", rendered("lab10_title_collective_order"),
              [_check_order]),
    _exercise("send_send", rendered("lab10_title_send_send"),
              [_check_exchange], job_checks=[_no_send_send], world_sizes=(2,)),
    _exercise("barrier_rank0", rendered("lab10_title_barrier_rank0"),
              [_check_shared_file], job_checks=[_readers_wait_for_writer], timeout=15, shared=True,
              setup="dtrain_lab.grading.lab10:watch_reads"),
    _exercise("accum_steps", rendered("lab10_title_accum_steps"),
              [_check_accum]),
    _exercise("hierarchical", rendered("lab10_title_hierarchical"),
              [_check_hierarchical], job_checks=[_two_levels], world_sizes=(3, 4), timeout=20,
              pattern_checks=[patterns.two_levels(contract.node_ranks)],
              hide=("dtrain_lab.comm.hierarchical",)),
]
