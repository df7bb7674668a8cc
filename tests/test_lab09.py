"""Lab 09 (survive a killed rank): the solutions pass, learner stubs are "not yet" (tests/test_learner_copies.py), plausible wrong
answers fail with the right explanation, and the grader's reference is what it claims.

Solutions and stubs come from solutions/_source/lab_09_recovery.md; wrong answers live in
tests/submissions/lab09. Exercise 1's checks run here, in this process (its driver needs no process
group); exercise 2 is launched: every launch kills a rank and lets torchrun restart the job, so only a
forged report (no communication) and three wrong answers are launched, each wrong one failing on its
first differing scenario. The solutions are graded, sandboxed, by the solution notebooks (zh and en),
which nbval re-executes (tests/test_solution_cells.py checks each exercise's pass is stored there).
"""
import importlib
import importlib.util
import re

import pytest
import torch

from conftest import ROOT, grade, lab_programs
from dtrain_lab.grading import lab09, registry
from dtrain_lab.grading.checks import lab09 as lab09_checks

WRONG = ROOT / "tests" / "submissions" / "lab09"
HAN = r"[\u4e00-\u9fff]"




PROGRAMS = lab_programs("lab09", "lab_09_recovery.md")
EXERCISES = sorted(e.id for e in registry.all_exercises() if e.lab == "lab_09")


def module_from(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


def text(problems, lang: str) -> str:
    return "\n".join(p[lang] for p in problems)


# ------------------------------------------------------------------ structure, no launch
def test_exercises_cells_and_scenarios():
    assert sorted(PROGRAMS) == EXERCISES == ["lab09.atomic_save", "lab09.resume"]
    for ex_id in EXERCISES:
        ex = registry.get(ex_id)
        assert ex.filename == ex_id.replace(".", "_", 1) + ".py" and ex.title["en"] and re.search(HAN, ex.title["zh"])
        assert "# YOUR CODE HERE" in PROGRAMS[ex_id]["learner"] and "YOUR CODE HERE" not in PROGRAMS[ex_id]["solution"]
    resume = registry.get("lab09.resume")
    assert resume.world_sizes == (2,) and len(resume.runs) == 2
    assert all(r["max_restarts"] == 1 and lab09.FAULT_ENV in r["env"] for r in resume.runs)
    for kind in ("labs", "solutions"):
        assert "lab09_*.py" in (ROOT / kind / ".gitignore").read_text().split()


# ------------------------------------------------------------------ exercise 1, in this process
def test_atomic_solution_and_wrong_answers(tmp_path, monkeypatch):
    monkeypatch.setenv("DTRAIN_GRADE_SHARED", str(tmp_path))
    sol = tmp_path / "sol.py"
    sol.write_text(PROGRAMS["lab09.atomic_save"]["solution"])
    result = module_from(sol, "lab09_sol").run()
    assert lab09_checks._check_atomic(None, 0, result) == []
    # the driver really crashed the second save, and the file still held step 1, whole
    assert result["crash"]["raised"] == "crash" and result["crash"]["holds"] == {"step": 1, "whole": True}
    assert result["third"]["holds"] == {"step": 3, "whole": True} and result["third"]["files"] == ["state.pt"]
    # a crash never reaches the learner's except Exception
    assert not issubclass(lab09.SimulatedCrash, Exception)

    expected = {
        "atomic_direct.py": ("zh", ["写了一半的文件", "os.replace"]),
        "atomic_no_fsync.py": ("en", ["not os.fsync'ed before the rename", "folder was not fsync'ed"]),
        "atomic_other_folder.py": ("en", ["not in path's folder"]),
    }
    for name, (lang, phrases) in expected.items():
        res = module_from(WRONG / name, name[:-3]).run()
        found = text(lab09_checks._check_atomic(None, 0, res), lang)
        for phrase in phrases:
            assert phrase in found, (name, phrase, found)
    direct = module_from(WRONG / "atomic_direct.py", "direct2").run()
    assert "error" in direct["crash"]["holds"]          # the torn file really does not load


# ------------------------------------------------------------------ the reference, no launch
def test_reference_is_exact_and_every_slip_moves_the_result():
    inputs = lab09.make_inputs(12345, 2)
    ref = lab09_checks.simulate(inputs)
    whole = lab09_checks.simulate(inputs, resume_at=4)
    assert all(torch.equal(a, b) for a, b in zip(ref, whole))       # a complete resume is bit-identical
    # the data is private and drawn per run: another seed, another result
    other = lab09_checks.simulate(lab09.make_inputs(54321, 2))
    assert not lab09_checks._close(other, ref)
    variants = {d: lab09_checks.simulate(inputs, resume_at=4, drop=d) for d in lab09_checks.DROPS}
    for drop, off in variants.items():
        assert max(float((a - b).abs().max()) for a, b in zip(ref, off)) > 1e-3, drop
    # the slips are told apart: no two variants give the same parameters
    names = sorted(variants)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            assert not lab09_checks._close(variants[a], variants[b]), (a, b)


# ------------------------------------------------------------------ exercise 2, launched with kills and restarts
@pytest.mark.timeout(400)
def test_a_forged_resume_report_fails():
    # the solutions' passing grades: solutions/{zh,en}/lab_09_recovery.ipynb, re-graded by nbval
    # (tests/test_solution_cells.py checks that each exercise's pass is stored there)
    # no Job, no communication, a report claiming a resume: each rank has only its own data
    # it never reaches the grader's fault, so the supervisor never kills anything: one attempt
    forged = grade("lab09.resume", WRONG / "resume_forged.py", lang="en")
    assert forged.outcome == "wrong" and "fault never fired" in forged.feedback, forged.feedback


LAUNCHED_WRONG = {
    "resume_rank0_rng.py": ("zh", "wrong", ["rank 0 的随机数状态", "all_gather_object", "场景"]),
    # starting over trains on the batches handed out after the restart, which differ before step 4
    "resume_start_over.py": ("en", "wrong", ["started over from step 0", "differ from the uninterrupted run's"]),
    "resume_no_checkpoint.py": ("en", "wrong", ["differ from the uninterrupted run's"]),
    # the fault taken out of the rank: the supervisor, not the rank, says whether it fired
    "resume_disarmed.py": ("en", "wrong", ["fault never fired"]),
}


@pytest.mark.timeout(240)
@pytest.mark.parametrize("file", sorted(LAUNCHED_WRONG))
def test_resume_wrong_answers_fail_with_an_explanation(file):
    lang, outcome, phrases = LAUNCHED_WRONG[file]
    v = grade("lab09.resume", WRONG / file, lang=lang)
    assert not v.passed and v.outcome == outcome, v.feedback
    for phrase in phrases:
        assert phrase in v.feedback, (phrase, v.feedback)


@pytest.mark.timeout(240)
def test_the_kill_comes_from_outside_and_lands_inside_the_write(monkeypatch):
    """A non-atomic save is torn by the mid-checkpoint kill: the supervisor's own record says it killed
    rank 0 of the first attempt at the grader's mark in torch.save, the file it was writing holds half
    a checkpoint (seen from here without a sandbox; a sandbox's /shared is its own), and the next
    attempt crashes loading it. (tools/measure_lab09_faults.py measures how often the kill lands
    inside the write.)"""
    import shutil

    from dtrain_lab.grading import runner

    import dataclasses

    from conftest import _box
    from dtrain_lab.grading import grader

    monkeypatch.setenv("DTRAIN_KEEP_GRADE_DIRS", "1")
    # the mid-checkpoint scenario alone (this file survives the other one)
    ex = dataclasses.replace(registry.get("lab09.resume"), runs=(lab09_checks.SCENARIOS[1],))
    v = grader._grade_launched(ex, WRONG / "resume_not_atomic.py", "en", _box())
    jobs = [runner._job_root() / r["job"] for r in v.details["runs"]]
    try:
        assert v.outcome == "crash" and len(jobs) == 1, v.feedback
        assert lab09_checks._explain_resume(v.outcome, v.feedback, "")[0]["en"].startswith("after the restart a checkpoint")
        status = runner._status(jobs[0])      # the supervisor's records, read as the grader reads them
        faults = [(s["attempt"], s["rank"], s["mark"]) for s in status if s["event"] == "fault"]
        assert faults == [(0, 0, lab09.MARK_SAVE)], status
        assert sum(s["event"] == "attempt" for s in status) == 2
        if v.details["runs"][0]["mode"] == "none":   # in a sandbox, /shared is a tmpfs gone with the job
            ckpt = jobs[0] / "shared" / "checkpoints"
            whole, torn = (ckpt / "step_000004.pt").stat().st_size, (ckpt / "step_000008.pt").stat().st_size
            assert 0.4 * whole < torn < 0.6 * whole, (torn, whole)    # half of step 8's bytes
            with pytest.raises((RuntimeError, OSError, EOFError)):  # a torn zip: torch 2.13 raises OSError
                torch.load(ckpt / "step_000008.pt", weights_only=True)
    finally:
        for job in jobs:
            shutil.rmtree(job, ignore_errors=True)
