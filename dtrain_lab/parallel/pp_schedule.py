"""Pipeline schedules: GPipe and 1F1B as per-stage lists of actions, checked, simulated and costed.

The overview of pipeline parallelism is in :mod:`dtrain_lab.parallel.pipeline`. Here:
:class:`Action`, :func:`schedule`, :func:`validate` (each micro-batch's F and B once per stage, F
before B, and a step-by-step simulation of the send/recv between neighbours that finds deadlocks and
out-of-order messages), :func:`peak_in_flight`, :func:`bubble_fraction`, :func:`simulate_timeline`
and :func:`idle_fraction`. No process group: this is plain code about schedules. The executor that
runs a schedule over send/recv is :mod:`dtrain_lab.parallel.pp_stage`.
"""
from __future__ import annotations

import math
from typing import Any, NamedTuple, Sequence

from dtrain_lab.i18n import LabError, tr

__all__ = ["Action", "SCHEDULES", "schedule", "validate", "peak_in_flight", "bubble_fraction",
           "simulate_timeline", "idle_fraction", "format_schedule", "PipelineError", "as_action",
           "static_problems", "check_int"]

SCHEDULES = ("gpipe", "1f1b")
# what travels on a link, and what a stage waits for (keys written out for the catalogue's test)
_WHAT = {"act": "pp_act", "grad": "pp_grad"}
_WAIT = {"send": "pp_wait_send", "recv": "pp_wait_recv"}


class Joined(LabError):
    """Messages as one field of another, joined by the separator ``sep_key`` of the language the
    outer message is rendered in (``dtrain_lab.i18n.tr`` renders a ``LabError`` field so), or by the
    literal ``sep``."""

    def __init__(self, items: list[LabError], sep_key: str | None = None, sep: str = ""):
        self.items, self.sep_key, self.sep = list(items), sep_key, sep
        self.key, self.fields = sep_key or "", {}
        ValueError.__init__(self, self.message())

    def message(self, lang: str | None = None) -> str:
        sep = tr(self.sep_key, lang) if self.sep_key else self.sep
        return sep.join(item.message(lang) for item in self.items)


class PipelineError(LabError):
    """A schedule that cannot run: the message lists every problem, in the learner's language
    first, then in the other one; ``problems`` keeps them as messages (``LabError``)."""

    def __init__(self, problems: list[LabError]):
        self.problems = list(problems)
        super().__init__("pp_invalid", problems=Joined(self.problems, sep="\n  "))


class Action(NamedTuple):
    """One unit of work of a stage: the forward (``"F"``) or backward (``"B"``) of one micro-batch."""

    kind: str
    microbatch: int

    def __str__(self) -> str:
        return f"{self.kind}{self.microbatch}"


def as_action(a: Any) -> Action:
    # JSON round trips turn an Action into a list ["F", 0]
    return a if isinstance(a, Action) else Action(str(a[0]), int(a[1]))


def check_int(name: str, value: Any, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise LabError("pp_bad_int", name=name, value=value, minimum=minimum)
    return value


# ------------------------------------------------------------------------------------ schedules
def schedule(kind: str, num_stages: int, num_microbatches: int) -> list[list[Action]]:
    """The ordered actions of every stage: ``result[s]`` is stage ``s``'s list.

    ``"gpipe"``: ``F0 … F(m-1)`` then ``B0 … B(m-1)`` on every stage (backwards in micro-batch order,
    as ``torch.distributed.pipelining.ScheduleGPipe``).
    ``"1f1b"``: ``w = min(p-s-1, m)`` warm-up forwards, then ``F(w+i) B(i)`` pairs, then the
    remaining backwards (cool-down). At most ``min(p-s, m)`` micro-batches are in flight on stage s.
    """
    p = check_int("num_stages", num_stages)
    m = check_int("num_microbatches", num_microbatches)
    if kind not in SCHEDULES:
        raise LabError("pp_bad_kind", value=kind, choices=", ".join(SCHEDULES))
    out = []
    for s in range(p):
        if kind == "gpipe":
            acts = [Action("F", i) for i in range(m)] + [Action("B", i) for i in range(m)]
        else:
            warmup = min(p - s - 1, m)
            acts = [Action("F", i) for i in range(warmup)]
            for i in range(m - warmup):           # steady state: one forward, one backward
                acts += [Action("F", warmup + i), Action("B", i)]
            acts += [Action("B", i) for i in range(m - warmup, m)]   # cool-down
        out.append(acts)
    return out


def format_schedule(schedules: Sequence[Sequence[Action]]) -> str:
    """One line per stage: ``stage 0: F0 F1 B0 …``."""
    return "\n".join(tr("pp_schedule_line", stage=s, actions=" ".join(str(as_action(a)) for a in acts))
                     for s, acts in enumerate(schedules))


def peak_in_flight(schedule_of_stage: Sequence[Action]) -> int:
    """Largest number of micro-batches whose forward is done and backward not yet, on one stage:
    how many micro-batches' activations the stage must keep at once."""
    live, peak = set(), 0
    for a in map(as_action, schedule_of_stage):
        if a.kind == "F":
            live.add(a.microbatch)
            peak = max(peak, len(live))
        else:
            live.discard(a.microbatch)
    return peak


# ------------------------------------------------------------------------------------ validation
def static_problems(schedules, p: int, m: int) -> list[LabError]:
    """What is wrong with the actions themselves: each micro-batch's F and B exactly once per stage,
    F before B. One message per problem."""
    probs: list[LabError] = []
    if len(schedules) != p:
        return [LabError("pp_wrong_stage_count", got=len(schedules), p=p)]
    for s, acts in enumerate(schedules):
        seen_f: dict[int, int] = {}
        seen_b: dict[int, int] = {}
        for pos, raw in enumerate(acts):
            try:
                a = as_action(raw)
            except (TypeError, ValueError, IndexError):
                probs.append(LabError("pp_bad_action", stage=s, pos=pos, action=raw))
                continue
            if a.kind not in ("F", "B") or not 0 <= a.microbatch < m:
                probs.append(LabError("pp_bad_action", stage=s, pos=pos, action=raw))
                continue
            seen = seen_f if a.kind == "F" else seen_b
            if a.microbatch in seen:
                probs.append(LabError("pp_duplicate", stage=s, action=str(a)))
            seen.setdefault(a.microbatch, pos)
            if a.kind == "B" and a.microbatch not in seen_f:
                probs.append(LabError("pp_b_before_f", stage=s, mb=a.microbatch))
        for i in range(m):
            for kind, seen in (("F", seen_f), ("B", seen_b)):
                if i not in seen:
                    probs.append(LabError("pp_missing", stage=s, action=f"{kind}{i}"))
    return probs


def _ops(acts: Sequence[Action], s: int, p: int) -> list[tuple]:
    """The communication a stage performs, in order: what :func:`run_schedule` does."""
    ops = []
    for a in acts:
        if a.kind == "F":
            if s > 0:
                ops.append(("recv", "act", s - 1, a.microbatch, a))
            if s < p - 1:
                ops.append(("send", "act", s + 1, a.microbatch, a))
        else:
            if s < p - 1:
                ops.append(("recv", "grad", s + 1, a.microbatch, a))
            if s > 0:
                ops.append(("send", "grad", s - 1, a.microbatch, a))
    return ops


def _simulate_comm(schedules, p: int, blocking_sends: bool) -> list[LabError]:
    """Step the stages' send/recv sequences until all finish or none can move.

    Sends are non-blocking (posted to a FIFO channel, as ``dist.isend``) unless ``blocking_sends``:
    then a send completes only when the peer stands at the matching recv (a rendezvous, as a plain
    ``dist.send`` of a large message). A recv blocks until the channel holds a message; the message
    must be the micro-batch the receiver expects (send/recv match by order, not by name).
    """
    ops = [_ops([as_action(a) for a in acts], s, p) for s, acts in enumerate(schedules)]
    pc = [0] * p
    chan: dict[tuple[int, int, str], list[int]] = {}
    while True:
        moved = False
        for s in range(p):
            while pc[s] < len(ops[s]):
                op, what, peer, mb, act = ops[s][pc[s]]
                if op == "send" and not blocking_sends:
                    chan.setdefault((s, peer, what), []).append(mb)
                    pc[s] += 1
                elif op == "send":
                    q = pc[peer]
                    if q < len(ops[peer]) and ops[peer][q][:3] == ("recv", what, s):
                        got = ops[peer][q][3]
                        if got != mb:
                            return [LabError("pp_order", stage=peer, src=s, what=LabError(_WHAT[what]),
                                             expected=got, got=mb)]
                        pc[s] += 1
                        pc[peer] += 1
                    else:
                        break
                else:
                    queue = chan.get((peer, s, what), [])
                    if not queue:
                        break
                    got = queue.pop(0)
                    if got != mb:
                        return [LabError("pp_order", stage=s, src=peer, what=LabError(_WHAT[what]),
                                         expected=mb, got=got)]
                    pc[s] += 1
                moved = True
        if all(pc[s] == len(ops[s]) for s in range(p)):
            return []
        if not moved:
            waits = []
            for s in range(p):
                if pc[s] < len(ops[s]):
                    op, what, peer, mb, act = ops[s][pc[s]]
                    waits.append(LabError(_WAIT[op], stage=s, action=str(act), what=LabError(_WHAT[what]),
                                          peer=peer))
            return [LabError("pp_deadlock", waits=Joined(waits, "pp_list_sep"))]


def validate(schedules: Sequence[Sequence[Action]], num_stages: int, num_microbatches: int, *,
             blocking_sends: bool = False, strict: bool = False) -> list[str]:
    """Problems of a pipeline schedule, in the learner's language (``[]`` when it is correct).

    Checks that every stage runs each micro-batch's F and B exactly once, F before B, then simulates
    the neighbour send/recv step by step (F on stage s receives the activation that F on s-1 sent;
    B on s receives the gradient that B on s+1 sent): a cycle of waits is a deadlock, a message of
    the wrong micro-batch an ordering error. ``blocking_sends=True`` makes every send a rendezvous
    (1F1B then deadlocks: stage s sends an activation while stage s+1 sends a gradient; this is why
    PyTorch and Megatron post the pair as one batched isend/irecv). ``strict=True`` raises
    :class:`PipelineError` (both languages) instead of returning the list.
    """
    p = check_int("num_stages", num_stages)
    m = check_int("num_microbatches", num_microbatches)
    probs = static_problems(schedules, p, m)
    if not probs:
        probs = _simulate_comm(schedules, p, blocking_sends)
    if strict and probs:
        raise PipelineError(probs)
    return [p.message() for p in probs]


# ------------------------------------------------------------------------------------ cost model
def bubble_fraction(p: int, m: int) -> float:
    """Idle share of ``p`` equal stages running ``m`` micro-batches with GPipe or 1F1B:
    ``(p-1)/(m+p-1)`` (GPipe paper, section 2.2: overhead ``O((K-1)/(M+K-1))``)."""
    p = check_int("p", p)
    m = check_int("m", m)
    return (p - 1) / (m + p - 1)


def _per_stage(value, p: int, name: str) -> list[float]:
    vals = [float(value)] * p if isinstance(value, (int, float)) else [float(v) for v in value]
    if len(vals) != p or any(not (v >= 0 and math.isfinite(v)) for v in vals):
        raise LabError("pp_bad_times", name=name, value=value, p=p)
    return vals


def simulate_timeline(schedules: Sequence[Sequence[Action]], t_f: float | Sequence[float] = 1.0,
                      t_b: float | Sequence[float] = 2.0, t_comm: float = 0.0,
                      ) -> list[list[tuple[float, float, Action]]]:
    """The ideal timeline: each action starts as soon as its stage is free and its input is there
    (F of mb on stage s after F of mb on s-1; B on s after B on s+1), a message taking ``t_comm``
    (default 0: the timeline of the bubble formula). ``t_f``/``t_b``: forward/backward time of one
    micro-batch, a number or one per stage.
    Returns per stage a list of ``(start, end, Action)``. A schedule that deadlocks raises."""
    p = len(schedules)
    tf, tb = _per_stage(t_f, p, "t_f"), _per_stage(t_b, p, "t_b")
    t_comm = _per_stage(t_comm, 1, "t_comm")[0]
    acts = [[as_action(a) for a in st] for st in schedules]
    m = 1 + max((a.microbatch for st in acts for a in st), default=0)
    validate(acts, p, m, strict=True)
    done: dict[tuple[int, str, int], float] = {}
    free = [0.0] * p
    pc = [0] * p
    out: list[list] = [[] for _ in range(p)]
    while any(pc[s] < len(acts[s]) for s in range(p)):
        for s in range(p):
            while pc[s] < len(acts[s]):
                a = acts[s][pc[s]]
                dep = (s - 1, "F", a.microbatch) if a.kind == "F" else (s + 1, "B", a.microbatch)
                if 0 <= dep[0] < p:
                    if dep not in done:
                        break
                    ready = done[dep] + t_comm
                else:
                    ready = 0.0
                start = max(free[s], ready)
                end = start + (tf[s] if a.kind == "F" else tb[s])
                out[s].append((start, end, a))
                done[(s, a.kind, a.microbatch)] = free[s] = end
                pc[s] += 1
    return out


def idle_fraction(timeline) -> float:
    """``1 - busy / (p · makespan)``: the share of the stages' time spent not computing, from the
    first action's start to the last action's end (simulated or measured; a measured timeline's
    clocks must be comparable across processes: ``time.perf_counter`` on one machine is)."""
    spans = [(float(e[0]), float(e[1])) for stage in timeline for e in stage]
    if not spans:
        return 0.0
    t0, t1 = min(a for a, _ in spans), max(b for _, b in spans)
    busy = sum(b - a for a, b in spans)
    return 1.0 - busy / (len(timeline) * (t1 - t0)) if t1 > t0 else 0.0
