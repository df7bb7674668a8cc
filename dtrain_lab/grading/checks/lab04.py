"""Lab 04 — top-k with error feedback: the references and checks, run in the grader's process.

The reference is the course's :func:`dtrain_lab.parallel.compression.topk_sparse_allreduce`, run on a
stand-in process group that replays what every rank contributes (each rank's top-k values, then its
indices): no collective here, and every rank's private inputs, which no rank had. The ranks'
traces are checked too: an all-reduce of an integer tensor (indices summed) or of a dense
gradient-sized tensor (no compression at all) is explained and fails.
"""
from __future__ import annotations

import math

import torch

from dtrain_lab.i18n import rendered
from dtrain_lab.grading import lab04 as contract
from dtrain_lab.grading import patterns
from dtrain_lab.grading.channel import short
from dtrain_lab.grading.exercise import Exercise, combine, problem
from dtrain_lab.parallel.compression import CommState, payload_bytes, topk_select, topk_sparse_allreduce

LAB = contract.LAB
HIDE = ("dtrain_lab.parallel.compression", "dtrain_lab.parallel.compress_topk")   # the course's top-k would be the answer


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


def _same(a, b) -> bool:
    if not isinstance(a, torch.Tensor) or a.shape != b.shape:
        return False
    return bool(torch.allclose(a.detach().cpu().double(), b.double(), rtol=1e-5, atol=1e-6))


def _shown(t) -> str:
    if isinstance(t, torch.Tensor) and t.numel() <= 8:
        return "[" + ", ".join(f"{float(x):.4g}" for x in t.detach().cpu().reshape(-1)) + "]"
    return short(t)


def _difference(got, want) -> dict:
    """Where ``got`` differs from ``want`` (same shape): the whole tensors when they are short, else
    how many positions differ and the worst one."""
    if want.numel() <= 8:
        return problem("lab04_diff_short", want=_shown(want), got=_shown(got))
    g, w = got.detach().cpu().double().reshape(-1), want.double().reshape(-1)
    d = (g - w).abs()
    bad, i = int((d > 1e-6 + 1e-5 * w.abs()).sum()), int(d.argmax())
    return problem("lab04_diff_many", bad=bad, n=w.numel(), i=i, want=f"{float(w[i]):.4g}", got=f"{float(g[i]):.4g}")


def _first_and_count(found: list) -> list:
    if len(found) <= 1:
        return found
    return [found[0], problem("grade_more_cases", n=len(found) - 1)]


def _dense(values, indices, numel) -> torch.Tensor:
    t = torch.zeros(numel)
    t[indices] = values
    return t


# ------------------------------------------------------------------ 1. sparse all-reduce
def _check_sparse(run, rank, result):
    if not isinstance(result, dict):
        return [problem("lab04_want_sparse_cases", got=short(result))]
    found = []
    world = run.world_size
    for name, numel, k in contract.SPARSE_CASES:
        inputs = [_dense(*i["sparse"][name], numel) for i in run.inputs]
        want = reference_average(inputs, k, rank)[0]
        got = result.get(name)
        if _same(got, want):
            continue
        if _same(got, want * world):
            found.append(problem("lab04_sparse_sum", name=name, world=world))
        elif isinstance(got, torch.Tensor) and got.shape == want.shape:
            found.append(combine(problem("lab04_sparse_case", name=name, numel=numel, k=k), _difference(got, want),
                                 sep=""))
        else:
            found.append(problem("lab04_sparse_shape", name=name, numel=numel, got=_shown(got)))
    return _first_and_count(found)


def _no_summed_indices_or_dense(dense_sizes):
    def check(run):
        for rank, calls in sorted(run.traces.items()):
            for c in calls:
                if c.get("op") != "all_reduce":
                    continue
                dtype = str(c.get("dtype", ""))
                if dtype.startswith(("int", "uint", "long")):
                    return [problem("lab04_summed_indices", rank=rank, dtype=dtype, shape=short(c.get("shape")))]
                if math.prod(c.get("shape") or [0]) in dense_sizes:
                    return [problem("lab04_dense_allreduce", rank=rank, shape=short(c.get("shape")))]
        return []
    return check


WIRE_BUDGET = 256 << 10   # bytes: every honest solution sends under 110 KiB (the rendezvous and gloo's own
                          # handshakes included); one dense copy of the large case is 1 MiB
# a dense exchange of the large case sends a megabyte whichever call it goes through, traced or not
# (a ProcessGroup method, a socket of its own); k values and k indices send hundreds of bytes
_bytes_from_outside = patterns.bytes_at_most(WIRE_BUDGET, "lab04_wire_bytes", numel=contract.LARGE,
                                             dense=(contract.LARGE * 4) >> 10)


def _explain_gather(outcome: str, feedback: str, source: str) -> list:
    """A crash or hang in all-gather (gloo: "Received data size doesn't match expected size"): most
    often ranks that pass tensors of different sizes."""
    signs = ("all_gather", "allgather", "received data size", "size doesn't match")
    if not any(sign in feedback.lower() for sign in signs):
        return []
    return [problem("lab04_gather_sizes")]


# ------------------------------------------------------------------ 2. top-k with error feedback
def reference_ef(grads: list[torch.Tensor], k: int, rank: int, *, error_feedback: bool = True) -> list[dict]:
    """Every step of rank ``rank`` when the ranks' gradients are ``grads`` (one ``(steps, numel)``
    tensor per rank): ``grad``, ``input`` (gradient + residual), ``update``, ``sent``, ``residual``."""
    world, steps, numel = len(grads), grads[0].shape[0], grads[0].shape[1]
    residuals = [torch.zeros(numel) for _ in range(world)]
    out = []
    for step in range(steps):
        g = [grads[r][step] for r in range(world)]
        inputs = [x + res for x, res in zip(g, residuals)] if error_feedback else g
        results = [reference_average(inputs, k, r) for r in range(world)]
        residuals = [x - sent for x, (_, sent) in zip(inputs, results)] if error_feedback else residuals
        out.append({"grad": g[rank], "input": inputs[rank], "update": results[rank][0],
                    "sent": results[rank][1], "residual": residuals[rank]})
    return out


def _residual_hint(residual, want: dict, numel: int) -> dict:
    if _same(residual, want["input"] - want["update"]):
        return problem("lab04_residual_averaged")
    if _same(residual, want["grad"] - want["sent"]):
        return problem("lab04_residual_dropped")
    if _same(residual, torch.zeros(numel)):
        return problem("lab04_residual_zero")
    return problem("lab04_residual_rule")


def _check_ef_case(run, rank, name, numel, k, steps, got) -> dict | None:
    world = run.world_size
    if not isinstance(got, list) or len(got) != steps or not all(isinstance(s, list) and len(s) == 2 for s in got):
        return problem("lab04_ef_unfinished", name=name)
    grads = [i["ef"][name] for i in run.inputs]
    ref = reference_ef(grads, k, rank)
    no_ef = reference_ef(grads, k, rank, error_feedback=False)
    # a residual that subtracted the averaged update can leave every update equal to top-k without
    # error feedback for some drawn gradients: that bug is named by its own hint below, not as "no EF"
    first_residual, want0 = got[0][1], ref[0]
    averaged = isinstance(first_residual, torch.Tensor) and first_residual.shape == want0["residual"].shape \
        and _same(first_residual, want0["input"] - want0["update"]) and not _same(first_residual, want0["residual"])
    if not averaged and all(_same(u, s["update"]) for (u, _), s in zip(got, no_ef)) \
            and not all(_same(u, s["update"]) for (u, _), s in zip(got, ref)):
        return problem("lab04_no_error_feedback", name=name)
    for step, ((update, residual), want) in enumerate(zip(got, ref)):
        where = problem("lab04_where", name=name, step=step + 1)
        if not _same(update, want["update"]):
            if _same(update, want["update"] * world):
                return combine(where, problem("lab04_update_sum", world=world), sep="")
            if not isinstance(update, torch.Tensor) or update.shape != want["update"].shape:
                return combine(where, problem("lab04_update_shape", numel=numel, got=_shown(update)), sep="")
            return combine(where, problem("lab04_update_wrong"), _difference(update, want["update"]), sep="")
        if not _same(residual, want["residual"]):
            if isinstance(residual, torch.Tensor) and residual.shape == want["residual"].shape:
                d = _difference(residual, want["residual"])
            else:
                d = problem("lab04_yours_is", got=_shown(residual))
            return combine(where, problem("lab04_residual_wrong"), d, problem("lab04_full_stop"),
                           _residual_hint(residual, want, numel), sep="")
    return None


def _check_ef(run, rank, result):
    if not isinstance(result, dict):
        return [problem("lab04_want_ef_cases", got=short(result))]
    found = [_check_ef_case(run, rank, name, numel, k, steps, result.get(name)) for name, numel, k, steps in contract.EF_CASES]
    return _first_and_count([p for p in found if p is not None])


EXERCISES = [
    Exercise(id="lab04.sparse_allreduce", lab=LAB, filename="lab04_sparse_allreduce.py", timeout=20,
             title=rendered("lab04_title_sparse_allreduce"),
             checks=[_check_sparse],
             job_checks=[_no_summed_indices_or_dense({n for _, n, _ in contract.SPARSE_CASES})],
             pattern_checks=[patterns.sparse(max(k for _, _, k in contract.SPARSE_CASES)), _bytes_from_outside],
             explain=_explain_gather, world_sizes=(2, 3), make_inputs=contract.make_inputs, hide=HIDE),
    Exercise(id="lab04.topk_ef", lab=LAB, filename="lab04_topk_ef.py", timeout=20,
             title=rendered("lab04_title_topk_ef"),
             checks=[_check_ef],
             job_checks=[_no_summed_indices_or_dense({n for _, n, _, _ in contract.EF_CASES})],
             pattern_checks=[patterns.sparse(max(k for _, _, k, _ in contract.EF_CASES)), _bytes_from_outside],
             explain=_explain_gather, world_sizes=(2, 3), make_inputs=contract.make_inputs, hide=HIDE),
]
