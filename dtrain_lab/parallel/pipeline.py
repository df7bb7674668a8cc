"""Pipeline parallelism: GPipe and 1F1B schedules, checked, simulated and executed over send/recv.

A model too big for one device is cut into ``p`` consecutive *stages*, one per rank; stage ``s``
receives activations from ``s-1`` and sends its output to ``s+1`` (and gradients the other way in
backward). Run naively, one batch at a time, only one stage computes at any moment. Splitting the
batch into ``m`` *micro-batches* lets the stages work on different micro-batches at once.

* **GPipe** (Huang et al. 2019, "GPipe: Efficient Training of Giant Neural Networks using Pipeline
  Parallelism"): every stage runs the ``m`` forwards, then the ``m`` backwards. With equal stages the
  idle share of the ``p`` devices (the *bubble*) is ``(p-1)/(m+p-1)``, and every stage holds the
  activations of all ``m`` micro-batches before the first backward.
* **1F1B** (PipeDream-Flush, Narayanan et al. 2021, "Memory-Efficient Pipeline-Parallel DNN
  Training"; the schedule of Megatron-LM): stage ``s`` runs ``min(p-s-1, m)`` warm-up forwards, then
  alternates one forward and one backward, then finishes the remaining backwards. Same bubble, but
  stage ``s`` holds at most ``min(p-s, m)`` micro-batches' activations instead of ``m``.

Both are *synchronous* ("flush") schedules: gradients of all micro-batches are accumulated and the
optimizer steps once, so the result equals training on the whole batch (:func:`run_schedule`).

What is here:

* :class:`Action`, :func:`schedule` (per-stage lists of actions), :func:`validate` (each micro-batch's
  F and B once per stage, F before B, and a step-by-step simulation of the send/recv between
  neighbours that finds deadlocks and out-of-order messages), :func:`peak_in_flight`;
* :func:`bubble_fraction`, :func:`simulate_timeline` (the ideal timeline from the dependencies),
  :func:`idle_fraction` (of a simulated or a measured timeline);
* the executor: :func:`split_sequential`, :class:`PipelineStage`, :func:`run_schedule` (over
  ``dist.isend``/``dist.recv`` between neighbour ranks; records when each action computed and the
  activation bytes it kept), :func:`train_step`.

Launch a demo with ``torchrun --standalone --nproc-per-node 2 -m dtrain_lab.demos.pp_run``.
``torch.distributed.pipelining`` (``PipelineStage``, ``ScheduleGPipe``, ``Schedule1F1B``) is
PyTorch's implementation of the same schedules; ``dtrain_lab.demos.pp_run`` runs both side by side.
"""
from __future__ import annotations

import math
import time
from typing import Any, Callable, NamedTuple, Sequence

import torch
import torch.nn as nn

from dtrain_lab.i18n import LabError, get_lang, tr

__all__ = ["Action", "SCHEDULES", "schedule", "validate", "peak_in_flight", "bubble_fraction",
           "simulate_timeline", "idle_fraction", "format_schedule", "split_sequential", "PipelineStage",
           "run_schedule", "train_step", "PipelineError"]

SCHEDULES = ("gpipe", "1f1b")


class PipelineError(LabError):
    """A schedule that cannot run: the message lists every problem, in the learner's language
    first, then in the other one; ``problems`` keeps them as ``(message key, fields)``."""

    def __init__(self, problems: list[tuple[str, dict]]):
        self.problems = problems
        self.key, self.fields = "pp_invalid", {}
        first = get_lang()
        langs = (first, "en" if first == "zh" else "zh")
        ValueError.__init__(self, "\n".join(self.message(lang) for lang in langs))

    def message(self, lang: str | None = None) -> str:
        return tr("pp_invalid", lang, problems="\n  ".join(_fmt(k, kw, lang) for k, kw in self.problems))


class Action(NamedTuple):
    """One unit of work of a stage: the forward (``"F"``) or backward (``"B"``) of one micro-batch."""

    kind: str
    microbatch: int

    def __str__(self) -> str:
        return f"{self.kind}{self.microbatch}"


def _as_action(a: Any) -> Action:
    # JSON round trips turn an Action into a list ["F", 0]
    return a if isinstance(a, Action) else Action(str(a[0]), int(a[1]))


def _check_int(name: str, value: Any, minimum: int = 1) -> int:
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
    p = _check_int("num_stages", num_stages)
    m = _check_int("num_microbatches", num_microbatches)
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
    return "\n".join(f"stage {s}: " + " ".join(str(_as_action(a)) for a in acts)
                     for s, acts in enumerate(schedules))


def peak_in_flight(schedule_of_stage: Sequence[Action]) -> int:
    """Largest number of micro-batches whose forward is done and backward not yet, on one stage:
    how many micro-batches' activations the stage must keep at once."""
    live, peak = set(), 0
    for a in map(_as_action, schedule_of_stage):
        if a.kind == "F":
            live.add(a.microbatch)
            peak = max(peak, len(live))
        else:
            live.discard(a.microbatch)
    return peak


# ------------------------------------------------------------------------------------ validation
def _static_problems(schedules, p: int, m: int) -> list[tuple[str, dict]]:
    probs: list[tuple[str, dict]] = []
    if len(schedules) != p:
        return [("pp_wrong_stage_count", {"got": len(schedules), "p": p})]
    for s, acts in enumerate(schedules):
        seen_f: dict[int, int] = {}
        seen_b: dict[int, int] = {}
        for pos, raw in enumerate(acts):
            try:
                a = _as_action(raw)
            except (TypeError, ValueError, IndexError):
                probs.append(("pp_bad_action", {"stage": s, "pos": pos, "action": raw}))
                continue
            if a.kind not in ("F", "B") or not 0 <= a.microbatch < m:
                probs.append(("pp_bad_action", {"stage": s, "pos": pos, "action": raw}))
                continue
            seen = seen_f if a.kind == "F" else seen_b
            if a.microbatch in seen:
                probs.append(("pp_duplicate", {"stage": s, "action": str(a)}))
            seen.setdefault(a.microbatch, pos)
            if a.kind == "B" and a.microbatch not in seen_f:
                probs.append(("pp_b_before_f", {"stage": s, "mb": a.microbatch}))
        for i in range(m):
            for kind, seen in (("F", seen_f), ("B", seen_b)):
                if i not in seen:
                    probs.append(("pp_missing", {"stage": s, "action": f"{kind}{i}"}))
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


def _simulate_comm(schedules, p: int, blocking_sends: bool) -> list[tuple[str, dict]]:
    """Step the stages' send/recv sequences until all finish or none can move.

    Sends are non-blocking (posted to a FIFO channel, as ``dist.isend``) unless ``blocking_sends``:
    then a send completes only when the peer stands at the matching recv (a rendezvous, as a plain
    ``dist.send`` of a large message). A recv blocks until the channel holds a message; the message
    must be the micro-batch the receiver expects (send/recv match by order, not by name).
    """
    ops = [_ops([_as_action(a) for a in acts], s, p) for s, acts in enumerate(schedules)]
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
                            return [("pp_order", {"stage": peer, "src": s, "what": ("pp_" + what, {}),
                                                  "expected": got, "got": mb})]
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
                        return [("pp_order", {"stage": s, "src": peer, "what": ("pp_" + what, {}),
                                                  "expected": mb, "got": got})]
                    pc[s] += 1
                moved = True
        if all(pc[s] == len(ops[s]) for s in range(p)):
            return []
        if not moved:
            waits = []
            for s in range(p):
                if pc[s] < len(ops[s]):
                    op, what, peer, mb, act = ops[s][pc[s]]
                    waits.append(("pp_wait_" + op, {"stage": s, "action": str(act), "what": ("pp_" + what, {}),
                                                    "peer": peer}))
            return [("pp_deadlock", {"waits": waits})]


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
    p = _check_int("num_stages", num_stages)
    m = _check_int("num_microbatches", num_microbatches)
    probs = _static_problems(schedules, p, m)
    if not probs:
        probs = _simulate_comm(schedules, p, blocking_sends)
    if strict and probs:
        raise _invalid(probs)
    return [_fmt(k, kw) for k, kw in probs]


def _fmt(key: str, fields: dict, lang: str | None = None) -> str:
    """tr() with nested messages: a field that is ``(key, fields)`` or a list of them is rendered
    in the same language (a deadlock lists every stage's wait)."""
    def render(v):
        if isinstance(v, tuple) and len(v) == 2 and isinstance(v[0], str) and isinstance(v[1], dict):
            return _fmt(v[0], v[1], lang)
        if isinstance(v, list) and v and all(isinstance(x, tuple) for x in v):
            return ("；" if (lang or get_lang()) == "zh" else "; ").join(render(x) for x in v)
        return v
    return tr(key, lang, **{k: render(v) for k, v in fields.items()})


def _invalid(probs: list[tuple[str, dict]]) -> PipelineError:
    return PipelineError(probs)


# ------------------------------------------------------------------------------------ cost model
def bubble_fraction(p: int, m: int) -> float:
    """Idle share of ``p`` equal stages running ``m`` micro-batches with GPipe or 1F1B:
    ``(p-1)/(m+p-1)`` (GPipe paper, section 2.2: overhead ``O((K-1)/(M+K-1))``)."""
    p = _check_int("p", p)
    m = _check_int("m", m)
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
    acts = [[_as_action(a) for a in st] for st in schedules]
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


# ------------------------------------------------------------------------------------ executor
def split_sequential(model: nn.Module, num_stages: int) -> list[nn.Sequential]:
    """Cut an ``nn.Sequential`` (or a model with a ``.layers`` Sequential, e.g. ``models.MLP``) into
    ``num_stages`` consecutive ``nn.Sequential`` parts with as equal numbers of parametrised layers
    as possible; a parameter-free layer (ReLU) stays with the layer before it. The parts share the
    model's modules (no copy)."""
    p = _check_int("num_stages", num_stages)
    seq = model if isinstance(model, nn.Sequential) else getattr(model, "layers", None)
    if not isinstance(seq, nn.Sequential):
        raise LabError("pp_not_sequential", type=type(model).__name__)
    units: list[list[nn.Module]] = []
    for child in seq:
        if units and not any(True for _ in child.parameters()):
            units[-1].append(child)
        else:
            units.append([child])
    if len(units) < p:
        raise LabError("pp_too_few_layers", layers=len(units), p=p)
    base, extra = divmod(len(units), p)
    parts, i = [], 0
    for s in range(p):
        n = base + (1 if s < extra else 0)
        parts.append(nn.Sequential(*[mod for unit in units[i:i + n] for mod in unit]))
        i += n
    return parts


_DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]
_HEADER = 10   # ndim, dtype code, up to 8 sizes


class PipelineStage:
    """One stage of a pipeline: ``module_part`` on this rank, which is stage ``stage_index`` of
    ``num_stages``; neighbours are the group's ranks ``stage_index ± 1`` (``group=None``: the world).
    With ``num_stages == 1`` no process group is needed: the schedule runs as plain local code."""

    def __init__(self, module_part: nn.Module, stage_index: int, num_stages: int, group=None):
        import torch.distributed as dist

        self.module = module_part
        self.num_stages = _check_int("num_stages", num_stages)
        if isinstance(stage_index, bool) or not isinstance(stage_index, int) or not 0 <= stage_index < num_stages:
            raise LabError("pp_bad_stage_index", index=stage_index, p=num_stages)
        self.stage_index = stage_index
        self.group = group
        self.is_first, self.is_last = stage_index == 0, stage_index == num_stages - 1
        param = next(iter(module_part.parameters()), None)
        self.device = param.device if param is not None else torch.device("cpu")
        self.prev_rank = self.next_rank = None
        if num_stages > 1:
            if not dist.is_initialized():
                raise LabError("pp_no_group", p=num_stages)
            size = dist.get_world_size(group)
            me = dist.get_rank(group)
            if size != num_stages or me != stage_index:
                raise LabError("pp_group_mismatch", size=size, rank=me, index=stage_index, p=num_stages)
            g = group if group is not None else dist.group.WORLD
            if not self.is_first:
                self.prev_rank = dist.get_global_rank(g, stage_index - 1)
            if not self.is_last:
                self.next_rank = dist.get_global_rank(g, stage_index + 1)
        self.timeline: list[tuple[float, float, Action]] = []
        self.stats: dict[str, Any] = {}

    # communication: activations carry a small header (shape, dtype) so that any stage boundary works
    def _send_act(self, t: torch.Tensor, works: list) -> None:
        import torch.distributed as dist

        if t.dim() > _HEADER - 2 or t.dtype not in _DTYPES:
            raise LabError("pp_bad_activation", shape=tuple(t.shape), dtype=str(t.dtype))
        header = torch.zeros(_HEADER, dtype=torch.int64, device=self.device)
        header[0], header[1] = t.dim(), _DTYPES.index(t.dtype)
        header[2:2 + t.dim()] = torch.tensor(t.shape, dtype=torch.int64)
        t = t.detach().contiguous()
        for buf in (header, t):   # isend: never blocks; the tensors stay referenced until waited
            works.append((dist.isend(buf, self.next_rank, group=self.group), buf))

    def _recv_act(self) -> torch.Tensor:
        import torch.distributed as dist

        header = torch.empty(_HEADER, dtype=torch.int64, device=self.device)
        dist.recv(header, self.prev_rank, group=self.group)
        ndim, code = int(header[0]), int(header[1])
        x = torch.empty([int(v) for v in header[2:2 + ndim]], dtype=_DTYPES[code], device=self.device)
        dist.recv(x, self.prev_rank, group=self.group)
        return x


def _tensor_key(t: torch.Tensor) -> tuple:
    """Identity of a tensor's data: its storage, offset and shape (views of one batch, as the
    micro-batches of ``tensor_split``, are counted by their own bytes, not their storage's)."""
    try:
        ptr = t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):   # tensors without storage (wrapper subclasses)
        ptr = id(t)
    return (ptr, t.device, t.storage_offset(), tuple(t.shape), tuple(t.stride()))


def _stored_bytes(counter: dict, module: nn.Module, extra: torch.Tensor | None) -> int:
    """Activation bytes kept for one micro-batch: the tensors autograd saved for backward, each
    counted once, parameters (and views of them, e.g. ``weight.t()``) excluded, plus the stage output
    the executor keeps for ``backward(output, grad)``."""
    params = {(p.untyped_storage().data_ptr(), p.device) for p in module.parameters()}
    total = sum(n for key, n in counter.items() if (key[0], key[1]) not in params)
    if extra is not None and _tensor_key(extra) not in counter:
        total += extra.numel() * extra.element_size()
    return total


def run_schedule(stage: PipelineStage, actions: Sequence[Action], microbatches: Sequence[torch.Tensor] | None,
                 targets: Sequence[torch.Tensor] | None, loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                 ) -> dict:
    """Run this stage's ``actions`` (from :func:`schedule`) for one training step; gradients of all
    micro-batches accumulate in ``.grad`` (call the optimizer afterwards, see :func:`train_step`).

    ``microbatches`` are needed on the first stage, ``targets`` on the last (``None`` elsewhere).
    The last stage's loss of micro-batch ``i`` is ``loss_fn(out_i, target_i) * rows_i / rows``: for a
    mean-reducing loss the accumulated gradient is that of the whole batch's mean loss (with equal
    micro-batches, ``1/m`` — what ``torch.distributed.pipelining`` does with ``scale_grads=True``).

    F: receive the activation from the previous stage (``dist.recv``), compute, ``dist.isend`` the
    output to the next. B: receive the output's gradient from the next stage, backward,
    ``dist.isend`` the input's gradient to the previous. Sends are waited for at the end.
    Returns ``losses`` (last stage), ``timeline`` (``(start, end, Action)``, ``time.perf_counter``,
    computation only: waiting for a message is idle time), ``peak_in_flight``,
    ``peak_activation_bytes`` and ``activation_bytes`` (per micro-batch) actually kept.
    """
    acts = [_as_action(a) for a in actions]
    m = 1 + max((a.microbatch for a in acts), default=-1)
    probs = _static_problems([acts], 1, max(m, 1))
    if probs:
        raise _invalid(probs)
    if stage.is_first and (microbatches is None or len(microbatches) != m):
        raise LabError("pp_need_inputs", what="microbatches", stage=stage.stage_index, m=m,
                       got=None if microbatches is None else len(microbatches))
    if stage.is_last and (targets is None or len(targets) != m):
        raise LabError("pp_need_inputs", what="targets", stage=stage.stage_index, m=m,
                       got=None if targets is None else len(targets))
    rows = sum(int(t.shape[0]) for t in targets) if stage.is_last else 0
    import torch.distributed as dist

    works: list = []
    inflight: dict[int, tuple] = {}
    live_bytes, peak_bytes, peak = 0, 0, 0
    per_mb_bytes: list[int] = [0] * m
    losses: list[float] = []
    timeline: list[tuple[float, float, Action]] = []
    try:
        for a in acts:
            i = a.microbatch
            if a.kind == "F":
                if stage.is_first:
                    x = microbatches[i].to(stage.device)
                else:
                    x = stage._recv_act().requires_grad_(True)
                saved: dict = {}

                def pack(t, saved=saved):
                    saved[_tensor_key(t)] = t.numel() * t.element_size()
                    return t

                t0 = time.perf_counter()
                with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                    y = stage.module(x)
                    if stage.is_last:
                        y = loss_fn(y, targets[i].to(stage.device)) * (int(targets[i].shape[0]) / rows)
                t1 = time.perf_counter()
                timeline.append((t0, t1, a))
                nbytes = _stored_bytes(saved, stage.module, None if stage.is_last else y)
                inflight[i] = (x, y)
                per_mb_bytes[i] = nbytes
                live_bytes += nbytes
                peak_bytes, peak = max(peak_bytes, live_bytes), max(peak, len(inflight))
                if stage.is_last:
                    losses.append(float(y.detach()) * rows / int(targets[i].shape[0]))
                else:
                    stage._send_act(y, works)
            else:
                x, y = inflight.pop(i)
                if stage.is_last:
                    t0 = time.perf_counter()
                    y.backward()
                else:
                    grad = torch.empty_like(y)
                    dist.recv(grad, stage.next_rank, group=stage.group)
                    t0 = time.perf_counter()
                    torch.autograd.backward(y, grad)
                t1 = time.perf_counter()
                timeline.append((t0, t1, a))
                live_bytes -= per_mb_bytes[i]
                if not stage.is_first:
                    g = x.grad.detach()
                    works.append((dist.isend(g, stage.prev_rank, group=stage.group), g))
                del x, y
    finally:
        for work, _ in works:
            work.wait()
    stage.timeline = timeline
    stage.stats = {"losses": losses, "timeline": timeline, "peak_in_flight": peak,
                   "peak_activation_bytes": peak_bytes, "activation_bytes": per_mb_bytes}
    return stage.stats


def train_step(stage: PipelineStage, actions: Sequence[Action], microbatches, targets, loss_fn,
               optimizer: torch.optim.Optimizer) -> dict:
    """``zero_grad`` → :func:`run_schedule` (all micro-batches) → one ``optimizer.step()``."""
    optimizer.zero_grad(set_to_none=True)
    stats = run_schedule(stage, actions, microbatches, targets, loss_fn)
    optimizer.step()
    return stats
