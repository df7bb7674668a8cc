"""Lab 09 — survive a killed rank: the checks and the reference run, in the grader's process.

Exercise 1 (``atomic_save``) is judged on what :func:`dtrain_lab.grading.lab09.atomic_cases` reported
from inside the sandbox: what ``path`` held after each save, the files left over, the durability
calls. That report is the rank's own (a submission could forge it): the behaviour it describes is
only observed inside the sandbox, which the instructor guide's "what the grader proves" table says.

Exercise 2 (``resume``) is judged on the final parameters: they are compared with a one-process
simulation of the uninterrupted run computed here from **every** rank's private data (which no rank
had: each rank holds only its own shard, drawn per run), so no rank can produce them without the
job's communication. The steps the final attempt ran are self-reported (whether it resumed or
started over is explained, not proven). When the parameters are wrong, the run is replayed with one
part of the state missing at the resume to say which part it was.
"""
from __future__ import annotations

import copy
import os

import torch
import torch.nn.functional as F

from dtrain_lab.grading import lab09 as contract
from dtrain_lab.grading.channel import short
from dtrain_lab.grading.exercise import Exercise, problem
from dtrain_lab.i18n import LabError, rendered

LAB = contract.LAB
RTOL, ATOL = 1e-6, 1e-7


# ------------------------------------------------------------------ 1. atomic save
def _check_atomic(run, rank, result):
    if not isinstance(result, dict) or not all(isinstance(result.get(k), dict) for k in ("first", "crash", "third")):
        return [problem("lab09_atomic_raised", error=short(result))]
    p = []
    first, crash, third = result["first"], result["crash"], result["third"]
    folder, path = str(result.get("folder")), str(result.get("path"))
    for case, step in ((first, 1), (third, 3)):
        if case.get("raised") not in (None, "crash"):
            return [problem("lab09_atomic_raised", error=short(case.get("raised"), 200))]
        holds = case.get("holds") or {}
        if holds.get("step") != step or not holds.get("whole"):
            return [problem("lab09_atomic_wrong_content", step=step, holds=short(holds, 200))]
    events = {name: [list(e) for e in (case.get("events") or [])] for name, case in
              (("first", first), ("crash", crash), ("third", third))}
    saves = [e for e in events["first"] if e and e[0] == "save"]
    if not saves:
        return [problem("lab09_atomic_no_save")]
    if crash.get("raised") != "crash":
        p.append(problem("lab09_atomic_no_crash"))
    held = crash.get("holds") or {}
    if held.get("step") != 1 or not held.get("whole"):
        if "error" in held:
            what = LabError("lab09_what_half")
        elif held.get("missing"):
            what = LabError("lab09_what_nothing")
        else:
            what = LabError("lab09_what_other", held=short(held, 120))
        p.append(problem("lab09_atomic_torn", what=what))
    targets = [e[1] for e in saves if len(e) > 1 and e[1]]
    replaces = [e for e in events["first"] + events["third"] if e and e[0] == "replace" and len(e) > 2]
    if targets and any(os.path.abspath(str(t)) == os.path.abspath(path) for t in targets):
        if not p:
            p.append(problem("lab09_atomic_direct"))
    elif any(os.path.dirname(os.path.abspath(str(e[1]))) != os.path.abspath(folder) for e in replaces):
        p.append(problem("lab09_atomic_other_folder"))
    left = [f for f in third.get("files") or [] if f != "state.pt"]
    leftovers_after_ok = [f for f in first.get("files") or [] if f != "state.pt"]
    if leftovers_after_ok:
        p.append(problem("lab09_atomic_leftovers", files=short(leftovers_after_ok, 120)))
    elif len(left) > 1:
        p.append(problem("lab09_atomic_tmp_per_crash", files=short(left, 120)))
    ev = events["third"]
    kinds = [e[0] if e else None for e in ev]
    if "replace" not in kinds:
        p.append(problem("lab09_atomic_no_replace"))
    else:
        i = kinds.index("replace")
        if ["fsync", "file"] not in ev[:i]:
            p.append(problem("lab09_atomic_no_fsync_file"))
        if ["fsync", "dir"] not in ev[i + 1:]:
            p.append(problem("lab09_atomic_no_fsync_dir"))
    return p


# ------------------------------------------------------------------ 2. the job that must survive a kill
def simulate(inputs: list, steps: int = contract.STEPS, resume_at: int | None = None, drop: str | None = None) -> list:
    """Every rank's final parameters of the run, in one process with no communication, from every
    rank's inputs (``inputs[r]`` is rank r's).

    Rank ``r``'s gradient is computed from its own batch with its own generator state; the average
    is taken as DDP takes it. With ``resume_at``, the run is stopped after that many steps and the
    state is rebuilt as a new attempt would build it (fresh model, optimizer, scheduler, reseeded
    generators), then loaded from the state at that step except ``drop``: ``"optimizer"``,
    ``"scheduler"``, ``"rng"`` or ``"rng_rank0"`` (rank 0's generator state loaded on every rank).
    """
    world = len(inputs)
    saved_rng = torch.get_rng_state()
    try:
        def fresh():
            model = contract.lab_model()
            opt, sched = contract.make_optim(model)
            rngs = []
            for r in range(world):
                torch.manual_seed(contract.rank_seed(r))
                rngs.append(torch.get_rng_state())
            return model, opt, sched, rngs

        model, opt, sched, rngs = fresh()
        for step in range(steps):
            if step == resume_at:
                state = {"model": {k: v.clone() for k, v in model.state_dict().items()},
                         "opt": copy.deepcopy(opt.state_dict()), "sched": sched.state_dict(),
                         "rngs": [s.clone() for s in rngs]}
                model, opt, sched, fresh_rngs = fresh()
                model.load_state_dict(state["model"])
                if drop != "optimizer":
                    opt.load_state_dict(state["opt"])
                if drop != "scheduler":
                    sched.load_state_dict(state["sched"])
                rngs = {"rng": fresh_rngs, "rng_rank0": [state["rngs"][0]] * world}.get(drop, state["rngs"])
            opt.zero_grad(set_to_none=True)
            grads = None
            for r in range(world):
                torch.set_rng_state(rngs[r])
                x, y = contract.batch_of(inputs[r], step)
                loss = F.mse_loss(model(x), y)
                g = torch.autograd.grad(loss, list(model.parameters()))
                rngs[r] = torch.get_rng_state()
                g = [t / world for t in g]
                grads = g if grads is None else [a + b for a, b in zip(grads, g)]
            for p, g in zip(model.parameters(), grads):
                p.grad = g
            opt.step()
            sched.step()
        return [p.detach().clone() for p in model.parameters()]
    finally:
        torch.set_rng_state(saved_rng)


def _close(a: list, b: list) -> bool:
    return len(a) == len(b) and all(isinstance(x, torch.Tensor) and x.shape == y.shape
                                    and torch.allclose(x.float(), y, rtol=RTOL, atol=ATOL) for x, y in zip(a, b))


DROPS = ("optimizer", "scheduler", "rng", "rng_rank0")
_DROP_KEYS = {"optimizer": "lab09_drop_optimizer", "scheduler": "lab09_drop_scheduler", "rng": "lab09_drop_rng",
              "rng_rank0": "lab09_drop_rng_rank0"}


def _check_resume(run, rank, result):
    fault = (run.scenario.get("env") or {}).get(contract.FAULT_ENV)
    if not isinstance(result, dict) or not isinstance(result.get("params"), list):
        return [problem("lab09_want_report", got=short(result))]
    steps_run = result.get("steps_run")
    if steps_run is None:
        return [problem("lab09_no_job")]
    # the supervisor's own record (a rank can neither forge nor disarm it): its kill fired, and the
    # job was started again after it
    if fault and (not run.faults or run.attempts < 2):
        return [problem("lab09_fault_never_fired")]
    if not isinstance(steps_run, list) or steps_run != list(range(steps_run[0] if steps_run else 0, contract.STEPS)):
        return [problem("lab09_steps_run", steps=short(steps_run, 120), last=contract.STEPS - 1)]
    p = []
    if fault and steps_run[0] == 0:
        p.append(problem("lab09_started_over"))
    got = result["params"]
    want = simulate(run.inputs)
    if not _close(got, want):
        diff = max(float((a.float() - b).abs().max()) for a, b in zip(got, want)) \
            if len(got) == len(want) and all(isinstance(a, torch.Tensor) and a.shape == b.shape
                                             for a, b in zip(got, want)) else float("nan")
        p.append(problem("lab09_params_differ", diff=diff, start=steps_run[0] if steps_run else "?"))
        if steps_run and steps_run[0] > 0:
            for drop in DROPS:
                if _close(got, simulate(run.inputs, resume_at=steps_run[0], drop=drop)):
                    p.append(problem(_DROP_KEYS[drop]))
                    break
    return p


def _explain_resume(outcome: str, feedback: str, source: str) -> list:
    # a torn file fails torch.load in many ways: "PytorchStreamReader failed reading zip archive",
    # "OSError: [Errno 22] Invalid argument" (torch 2.13), EOFError, UnpicklingError...
    in_save_kill = any(SCENARIOS[1]["name"][lang] in feedback for lang in ("en", "zh"))
    load_error = any(k in feedback for k in ("PytorchStreamReader", "central directory", "zip archive", "EOFError",
                                              "UnpicklingError", "OSError", "RuntimeError"))
    if outcome == "crash" and in_save_kill and load_error:
        return [problem("lab09_torn_on_load")]
    return []


SCENARIOS = (
    {"name": rendered("lab09_scenario_kill_step", rank=contract.KILL_RANK, step=contract.KILL_STEP),
     "env": {contract.FAULT_ENV: "kill_rank1_step6"}, "max_restarts": 1,
     "fault": {"attempt": 0, "rank": contract.KILL_RANK, "mark": contract.MARK_STEP}},
    {"name": rendered("lab09_scenario_kill_save"),
     "env": {contract.FAULT_ENV: "kill_rank0_in_save2"}, "max_restarts": 1,
     "fault": {"attempt": 0, "rank": 0, "mark": contract.MARK_SAVE}},
)

EXERCISES = [
    Exercise(id="lab09.atomic_save", lab=LAB, shared=True, entry="run", filename="lab09_atomic_save.py", timeout=30,
             title=rendered("lab09_title_atomic_save"), checks=[_check_atomic], world_sizes=(1,)),
    Exercise(id="lab09.resume", lab=LAB, shared=True, entry="run", filename="lab09_resume.py", timeout=60,
             title=rendered("lab09_title_resume"), checks=[_check_resume], world_sizes=(2,),
             consistent_collectives=False, runs=SCENARIOS, setup="dtrain_lab.grading.lab09:arm_fault",
             explain=_explain_resume, make_inputs=contract.make_inputs, restart_inputs=contract.restart_inputs),
]
