"""Lab 13 — ring attention and MoE dispatch/combine: the references and the checks, in the grader's process.

Exercise 1: every rank's output rows against causal attention over the whole sequence, computed
here from every rank's q, k, v (which no rank had); the learner's ``merge`` against attention over
both halves of the rank's own keys at once. Wrong answers are recognised: attention to the rank's own
block only (no communication), attention without the causal mask, NaN from merging two empty results.

Exercise 2: every rank's rows against ``tanh(x W_e)`` of each token's expert, with the weights of
every rank (each rank had only its own experts'), zero for dropped rows. Recognised: remote rows
wrong while local ones are right, rows in the wrong order, dropped rows not zero.
"""
from __future__ import annotations

import torch

from dtrain_lab.i18n import rendered
from dtrain_lab.grading import lab13 as contract
from dtrain_lab.grading import patterns
from dtrain_lab.grading.channel import short
from dtrain_lab.grading.exercise import Exercise, problem

LAB = contract.LAB
RTOL, ATOL = 1e-9, 1e-12
HIDE = ("dtrain_lab.parallel.context", "dtrain_lab.parallel.expert", "dtrain_lab.parallel.compose",
        "dtrain_lab.planner")   # the course's ring attention and MoE would be the answer


def _close(a, b) -> bool:
    return isinstance(a, torch.Tensor) and a.shape == b.shape and bool(torch.allclose(a.double(), b, rtol=RTOL, atol=ATOL))


# ------------------------------------------------------------------ 1. ring attention
def _attention(q, k, v, causal: bool = True):
    s = (q @ k.transpose(-2, -1)) / q.shape[-1] ** 0.5
    if causal:
        n, m = q.shape[-2], k.shape[-2]
        s = s.masked_fill(torch.ones(n, m, dtype=torch.bool).tril(m - n).logical_not(), float("-inf"))
    return s.softmax(-1) @ v


def reference_rows(inputs: list, rank: int, causal: bool = True) -> torch.Tensor:
    """This rank's rows of attention over the whole sequence (every rank's shard, in rank order)."""
    q, k, v = (torch.cat([i[name] for i in inputs], dim=2) for name in ("q", "k", "v"))
    n = contract.TOKENS
    return _attention(q, k, v, causal)[..., rank * n:(rank + 1) * n, :]


def _check_ring(run, rank, result):
    if not isinstance(result, dict) or "out" not in result or "merge" not in result:
        return [problem("lab13_want_driver", got=short(result))]
    mine = run.inputs[rank]
    n = contract.TOKENS
    want_o, want_lse = contract.block_attention(mine["q"], mine["k"], mine["v"], (rank + 1) * n, rank * n)
    merged = result["merge"]
    if not (isinstance(merged, list) and len(merged) == 2):
        return [problem("lab13_merge_shape", got=short(merged))]
    if not (_close(merged[0], want_o) and _close(merged[1], want_lse)):
        which = "o" if not _close(merged[0], want_o) else "lse"
        return [problem("lab13_merge_wrong", which=which)]
    out = result["out"]
    want = reference_rows(run.inputs, rank)
    if not isinstance(out, torch.Tensor) or out.shape != want.shape:
        return [problem("lab13_ring_shape", want=tuple(want.shape), got=short(out))]
    if _close(out, want):
        return []
    if torch.isnan(out).any():
        return [problem("lab13_ring_nan", rank=rank)]
    own = _attention(mine["q"], mine["k"], mine["v"])
    if _close(out, own):
        return [problem("lab13_ring_no_comm", rank=rank)]
    if _close(out, reference_rows(run.inputs, rank, causal=False)):
        return [problem("lab13_ring_mask", rank=rank)]
    return [problem("lab13_ring_wrong", rank=rank, world=run.world_size)]


def _no_blocking_send(run):
    """With blocking sends, every rank sends to its right neighbour at once and waits for it to
    receive: a ring of waits (lesson 10)."""
    senders = [r for r, calls in sorted(run.traces.items()) if any(c.get("op") == "send" for c in calls)]
    return [problem("lab13_blocking_send", ranks=senders)] if senders else []


# ------------------------------------------------------------------ 2. dispatch and combine
def reference_moe(inputs: list, rank: int) -> torch.Tensor:
    """``tanh(x_t W_e)`` for every token of ``rank`` with its expert ``e``; 0 where it was dropped."""
    weights = torch.cat([i["weights"] for i in inputs])          # (E, D, D): every rank's experts
    x, dest = inputs[rank]["x"], inputs[rank]["dest"]
    y = torch.zeros_like(x)
    for t, e in enumerate(dest.tolist()):
        if e >= 0:
            y[t] = contract.apply_expert(weights[e], x[t])
    return y


def _check_moe(run, rank, result):
    if not isinstance(result, dict) or "y" not in result:
        return [problem("lab13_want_driver", got=short(result))]
    y, want = result["y"], reference_moe(run.inputs, rank)
    if not isinstance(y, torch.Tensor) or y.shape != want.shape:
        return [problem("lab13_moe_shape", want=tuple(want.shape), got=short(y))]
    if _close(y, want):
        return []
    dest = run.inputs[rank]["dest"]
    first = run.inputs[rank]["first_expert"]
    dropped = dest < 0
    local = (dest >= first) & (dest < first + contract.EXPERTS_PER_RANK)
    remote = ~dropped & ~local
    if dropped.any() and not torch.allclose(y[dropped].double(), torch.zeros_like(want[dropped])):
        return [problem("lab13_moe_dropped", rows=dropped.nonzero().flatten().tolist())]
    rows_ok = torch.isclose(y.double(), want, rtol=RTOL, atol=ATOL).all(-1)
    if rows_ok[local].all() and not rows_ok[remote].all():
        return [problem("lab13_moe_remote", rank=rank, rows=(~rows_ok & remote).nonzero().flatten().tolist())]
    if sorted(map(tuple, y.double().round(decimals=9).tolist())) == sorted(map(tuple, want.round(decimals=9).tolist())):
        return [problem("lab13_moe_order")]
    return [problem("lab13_moe_wrong", rank=rank)]


def _explain_moe(outcome: str, feedback: str, source: str) -> list:
    """gloo aborts the process (SIGABRT) or raises "Split sizes doesn't match" when what one rank
    sends another is not what that rank expects; with all_to_all_single the likely cause."""
    low = feedback.lower()
    if outcome in ("crash", "hang") and ("split" in low or "sigabrt" in low or "all_to_all" in source):
        return [problem("lab13_moe_splits")]
    return []


WIRE_BUDGET = 256 << 10   # bytes: dispatching and combining the tokens sends under 80 KiB (rendezvous and
                          # handshakes included); one expert's (D, D) float64 weights alone are 512 KiB
EXPERT_BYTES = contract.D * contract.D * 8

EXERCISES = [
    Exercise(id="lab13.ring_attention", lab=LAB, filename="lab13_ring_attention.py", timeout=20,
             title=rendered("lab13_title_ring_attention"),
             checks=[_check_ring], job_checks=[_no_blocking_send],
             pattern_checks=[patterns.ring(lambda run, r: 2 * run.inputs[r]["k"].numel())], world_sizes=(2, 3),
             make_inputs=contract.make_inputs, hide=HIDE),
    Exercise(id="lab13.dispatch_combine", lab=LAB, filename="lab13_dispatch_combine.py", timeout=20,
             title=rendered("lab13_title_dispatch_combine"),
             checks=[_check_moe], explain=_explain_moe, world_sizes=(2, 3), make_inputs=contract.make_inputs,
             pattern_checks=[patterns.all_to_all,
                             patterns.bytes_at_most(WIRE_BUDGET, "lab13_wire_bytes", expert=EXPERT_BYTES >> 10)],
             hide=HIDE, consistent_collectives=False),   # uneven splits: the ranks' All-to-Alls differ in size
]
