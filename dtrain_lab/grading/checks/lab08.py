"""Lab 08 — 1F1B: the reference schedule and the checks, run in the grader's process.

The schedule is checked by rules written here, independently of any construction of it: every
micro-batch runs forward and backward exactly once per stage, forward first; a simulation of the
pipeline (:func:`dtrain_lab.grading.lab08.simulate`) matches every receive with the send of the
neighbour and finds deadlocks; the peak number of micro-batches alive on stage ``s`` must be
``min(p − s, m)``; last, the exact order, from the rule "run a forward while fewer than
``min(p − s, m)`` micro-batches are alive, else a backward" (:func:`reference_1f1b`; the tests check
that it is the order in which PyTorch's ``torch.distributed.pipelining.Schedule1F1B`` runs its
forwards and backwards). GPipe (Huang et al., "GPipe", NeurIPS 2019) has the same bubble,
``(p − 1)/(m + p − 1)``, but keeps all ``m`` micro-batches alive on every stage.

Exercise 2 runs on two ranks; the reference is the whole model on one process with gradient
accumulation over the same micro-batches, from stage 0's inputs and stage 1's targets together
(which no rank had both of), then SGD, in float64.
"""
from __future__ import annotations

import math

import re

import torch

from dtrain_lab.i18n import rendered
from dtrain_lab.grading import lab08 as contract
from dtrain_lab.grading import patterns
from dtrain_lab.grading.channel import short
from dtrain_lab.grading.exercise import Exercise, problem

LAB = contract.LAB
RTOL, ATOL = 1e-9, 1e-12
HIDE = ("dtrain_lab.parallel.pipeline",)   # the course's pipeline schedules would be the answer
T_F, T_B, M = contract.T_F, contract.T_B, contract.M
case_name, max_alive, simulate, peak_alive = contract.case_name, contract.max_alive, contract.simulate, contract.peak_alive


def reference_1f1b(p: int, m: int) -> list[list[tuple[str, int]]]:
    """1F1B as a rule: stage ``s`` runs its next forward while fewer than ``min(p − s, m)``
    micro-batches are alive on it and forwards remain, otherwise its next backward."""
    out = []
    for s in range(p):
        acts, f, b = [], 0, 0
        while b < m:
            if f < m and f - b < max_alive(p, m, s):
                acts.append(("F", f))
                f += 1
            else:
                acts.append(("B", b))
                b += 1
        out.append(acts)
    return out


def _warmup_then_1f1b(p: int, m: int, warmup, cap: bool = True, backward_first: bool = False):
    """Warm-up forwards, then (F, B) pairs, then the remaining backwards, as a learner writes it:
    the slips the hints recognise are variants of it."""
    out = []
    for s in range(p):
        w = warmup(p, s)
        if cap:
            w = min(w, m)
        acts = [("F", i) for i in range(w)]
        for i in range(m - w):
            pair = [("F", w + i), ("B", i)]
            acts += pair[::-1] if backward_first else pair
        acts += [("B", i) for i in range(m - w, m)]
        out.append(acts)
    return out


# ------------------------------------------------------------------ 1. the schedule
def _normalise(value, p: int):
    """``[[(kind, mb), ...] per stage]`` or None if ``value`` is not shaped like a schedule."""
    if not isinstance(value, (list, tuple)) or len(value) != p:
        return None
    out = []
    for acts in value:
        if not isinstance(acts, (list, tuple)):
            return None
        row = []
        for a in acts:
            if not isinstance(a, (list, tuple)) or len(a) != 2 or a[0] not in ("F", "B") \
                    or isinstance(a[1], bool) or not isinstance(a[1], int):
                return None
            row.append((a[0], int(a[1])))
        out.append(row)
    return out


def _short(acts, n: int = 10) -> str:
    text = ", ".join(f"{k}{mb}" for k, mb in acts[:n])
    return text + (", …" if len(acts) > n else "")


def schedule_problem(value, p: int, m: int) -> dict | None:
    """The first thing wrong with ``value`` as the 1F1B schedule of ``p`` stages and ``m``
    micro-batches, or None. The rules come in the order a reader would check them."""
    case = problem("lab08_case", name=case_name(p, m))
    if isinstance(value, dict) and "error" in value:
        return problem("lab08_raised", case=case, error=short(value["error"], 200))
    sched = _normalise(value, p)
    if sched is None:
        return problem("lab08_not_a_schedule", case=case, p=p, got=short(value, 120))
    for s, acts in enumerate(sched):
        for kind in ("F", "B"):
            mbs = sorted(mb for k, mb in acts if k == kind)
            if mbs != list(range(m)):
                key = "lab08_forwards_once" if kind == "F" else "lab08_backwards_once"
                return problem(key, case=case, s=s, last=m - 1, got=short(mbs, 60))
        done = set()
        for kind, mb in acts:
            if kind == "F":
                done.add(mb)
            elif mb not in done:
                return problem("lab08_backward_first", case=case, s=s, mb=mb, acts=_short(acts))
    sim = simulate(sched)
    if not sim["ok"]:
        return problem("lab08_sim_failed", case=case, why=sim["why"])
    for s, acts in enumerate(sched):
        peak, want = peak_alive(acts), max_alive(p, m, s)
        if peak > want:
            return problem("lab08_too_many_alive", case=case, s=s, peak=peak, want=want, p=p, m=m)
        if peak < want:
            best = simulate(reference_1f1b(p, m))["makespan"]
            return problem("lab08_too_few_alive", case=case, s=s, peak=peak, want=want, t_f=T_F, t_b=T_B,
                           makespan=sim["makespan"], best=best)
    want = reference_1f1b(p, m)
    for s, (acts, ref) in enumerate(zip(sched, want)):
        if acts != ref:
            i = next(i for i, (a, b) in enumerate(zip(acts, ref)) if a != b)
            return problem("lab08_action_differs", case=case, s=s, i=i + 1, got=f"{acts[i][0]}{acts[i][1]}",
                           want=f"{ref[i][0]}{ref[i][1]}")
    return None


SLIPS = [
    (contract.gpipe, "lab08_hint_gpipe"),
    (lambda p, m: _warmup_then_1f1b(p, m, lambda p, s: p - s), "lab08_hint_warmup_p_minus_s"),
    (lambda p, m: _warmup_then_1f1b(p, m, lambda p, s: p - s - 1, cap=False), "lab08_hint_uncapped"),
    (lambda p, m: _warmup_then_1f1b(p, m, lambda p, s: p - s - 1, backward_first=True), "lab08_hint_backward_first"),
    (lambda p, m: _warmup_then_1f1b(p, m, lambda p, s: s), "lab08_hint_warmup_grows"),
]


def _check_schedule(run, rank, result):
    """Every case of this grade against the rules of :func:`schedule_problem`; the first two wrong
    cases are shown, with the explanation of the first slip recognised."""
    if not isinstance(result, dict):
        return [problem("lab08_want_cases", got=short(result))]
    wrong, hint = [], None
    for p, m in run.inputs[0]["schedule_cases"]:
        value = result.get(case_name(p, m))
        found = schedule_problem(value, p, m)
        if found is None:
            continue
        wrong.append(found)
        if hint is None:
            got = _normalise(value, p)
            hint = next((problem(key) for rule, key in SLIPS if got == rule(p, m)), None)
    out = wrong[:2]
    if len(wrong) > 2:
        out.append(problem("grade_more_cases", n=len(wrong) - 2))
    return out + ([hint] if hint else [])


# ------------------------------------------------------------------ 2. run it: one stage per rank
def reference_training(inputs: list, steps: int = contract.STEPS, stage_zero_frozen: bool = False) -> dict:
    """The whole model on one process: for each step, forward and backward every micro-batch
    (gradient accumulation), then SGD. ``{"params": [per stage, per step], "losses": [per step]}``.
    ``stage_zero_frozen`` leaves stage 0 untouched (the hint for a gradient never sent back)."""
    model = contract.lab_model()
    stages = [contract.stage_layers(model, 0), contract.stage_layers(model, 1)]
    for s in range(2):
        contract.load_weights(stages[s], inputs[s]["weights"])
    xs_all, ys_all = inputs[0]["x"], inputs[-1]["y"]
    out = {"params": [[], []], "losses": []}
    for step in range(steps):
        model.zero_grad()
        losses = []
        for x, y in zip(xs_all[step], ys_all[step]):
            loss = contract.loss_fn(model(x), y)
            loss.backward()
            losses.append(loss.item())
        if stage_zero_frozen:
            for p in stages[0].parameters():
                p.grad = None
        contract.sgd_step(model.parameters())
        out["losses"].append(losses)
        for s in range(2):
            out["params"][s].append([p.detach().clone() for p in stages[s].parameters()])
    return out


def _close(a, b) -> bool:
    return isinstance(a, list) and len(a) == len(b) and all(
        isinstance(x, torch.Tensor) and x.shape == y.shape and bool(torch.allclose(x.double(), y, rtol=RTOL, atol=ATOL))
        for x, y in zip(a, b))


def _check_run(run, rank, result):
    if not isinstance(result, dict) or not isinstance(result.get("steps"), list) \
            or not all(isinstance(s, dict) for s in result["steps"]):
        return [problem("lab08_want_driver", got=short(result))]
    world = run.world_size
    want_sched = reference_1f1b(world, M)
    actions = _normalise([result.get("actions")], 1)
    if actions is None or actions[0] != want_sched[rank]:
        got = [actions[0] if (s == rank and actions) else want_sched[s] for s in range(world)]
        found = schedule_problem(got, world, M) if actions else None
        return [problem("lab08_copy_schedule", why=found or problem("lab08_not_a_schedule_short"))]
    steps = result["steps"]
    ref = reference_training(run.inputs)
    frozen = reference_training(run.inputs, stage_zero_frozen=True)
    for step, rec in enumerate(steps):
        n = step + 1
        if rec.get("forwards") != M:
            return [problem("lab08_forward_count", step=n, rank=rank, got=short(rec.get("forwards")), m=M)]
        want_peak = max_alive(world, M, rank)
        if not isinstance(rec.get("peak"), int) or rec["peak"] > want_peak:
            return [problem("lab08_run_too_many_alive", step=n, rank=rank, peak=short(rec.get("peak")), want=want_peak)]
        losses = rec.get("losses")
        if rank == world - 1 and losses != [] and not (
                isinstance(losses, list) and len(losses) == M
                and all(isinstance(a, float) and abs(a - b) <= ATOL + RTOL * abs(b)
                        for a, b in zip(losses, ref["losses"][step]))):
            return [problem("lab08_losses", step=n, want=[round(v, 8) for v in ref["losses"][step]], got=short(losses))]
        if _close(rec.get("params"), ref["params"][rank][step]):
            continue
        if rank == 0 and _close(rec.get("params"), frozen["params"][0][step]):
            return [problem("lab08_no_gradient_back", step=n)]
        return [problem("lab08_params_differ", step=n, rank=rank, m=M)]
    if len(steps) != contract.STEPS:
        return [problem("grade_driver_steps")]
    return []


def _no_blocking_send(run):
    """A blocking send in 1F1B's steady phase meets the neighbour's blocking send: at the same moment
    stage s sends an activation forward and stage s + 1 sends a gradient back."""
    senders = [r for r, calls in sorted(run.traces.items()) if any(c.get("op") == "send" for c in calls)]
    if not senders:
        return []
    return [problem("lab08_blocking_send", ranks=senders)]


def _explain_run(outcome: str, feedback: str, source: str) -> list:
    low = feedback.lower()
    waits = re.findall(r"^\s*rank \d+[:：] ?(\w+)", feedback, flags=re.M)
    if outcome == "hang" and waits and all(w == "send" for w in waits):
        return [problem("lab08_hang_send")]
    if outcome == "hang":
        return [problem("lab08_hang_recv")]
    if outcome == "crash" and any(s in low for s in ("nonetype", "does not require grad", "grad can be implicitly")):
        return [problem("lab08_requires_grad")]
    if outcome == "crash" and any(s in low for s in ("size", "shape", "dtype")):
        return [problem("lab08_shapes")]
    return []


EXERCISES = [
    Exercise(id="lab08.schedule", lab=LAB, filename="lab08_schedule.py", timeout=20,
             title=rendered("lab08_title_schedule"),
             checks=[_check_schedule], world_sizes=(1,), make_inputs=contract.make_inputs, hide=HIDE),
    Exercise(id="lab08.run_1f1b", lab=LAB, filename="lab08_run_1f1b.py", timeout=15,
             title=rendered("lab08_title_run_1f1b"),
             checks=[_check_run], job_checks=[_no_blocking_send], explain=_explain_run, world_sizes=(2,),
             pattern_checks=[patterns.pipeline(contract.M * contract.STEPS, math.prod(contract.ACT_SHAPE))],
             make_inputs=contract.make_inputs, hide=HIDE),
]
