"""Lab 08, issue 13: an answer computed without send/recv must fail.

``tests/submissions/lab08/run_no_comm.py`` runs the whole model on every rank (a private copy of the
other stage) and fills in the data it lacks with the practice data. On the practice seed that is
exactly the right answer (checked here in one process: it never communicates), so what defeats it is
that the grader draws the inputs for every grade and gives each rank only its own part.
"""
from __future__ import annotations

import importlib.util

import pytest

from conftest import ROOT, grade
from dtrain_lab.grading import contract, lab08
from dtrain_lab.grading.checks import lab08 as checks
from dtrain_lab.grading.exercise import Run

ATTACK = ROOT / "tests" / "submissions" / "lab08" / "run_no_comm.py"


def attack_results(monkeypatch) -> dict:
    """Both ranks of the attack, one after the other in this process (rank and world from the env,
    each rank's inputs from the practice seed, as outside the grader)."""
    monkeypatch.delenv("DTRAIN_GRADE_INPUTS", raising=False)
    monkeypatch.setattr(contract, "_cache", {})
    out = {}
    for rank in range(2):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        spec = importlib.util.spec_from_file_location(f"run_no_comm_{rank}", ATTACK)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        out[rank] = module.run()
    return out


def test_no_comm_attack_is_right_only_where_the_data_are_public(monkeypatch):
    results = attack_results(monkeypatch)
    public = Run(world_size=2, seed=contract.PRACTICE_SEED, inputs=lab08.make_inputs(contract.PRACTICE_SEED, 2))
    # with every rank's data known to all, running the whole model on each rank is indistinguishable
    assert all(checks._check_run(public, r, results[r]) == [] for r in range(2))
    # a grade's own inputs (any other seed): both stages' parameters, and the losses, are wrong
    graded = Run(world_size=2, seed=7, inputs=lab08.make_inputs(7, 2))
    found = {r: checks._check_run(graded, r, results[r]) for r in range(2)}
    assert all(found.values()), found
    assert "after step 1 stage 0's parameters differ" in found[0][0]["en"], found[0]
    assert "in step 1 the last stage's losses" in found[1][0]["en"], found[1]
    # each rank holds only its part of a grade's data: the other part cannot be read from inside
    assert set(graded.inputs[0]) == {"x", "weights", "schedule_cases"} and set(graded.inputs[1]) == {"y", "weights"}


@pytest.mark.timeout(300)
def test_no_comm_attack_fails_when_graded():
    v = grade("lab08.run_1f1b", ATTACK, lang="en")
    assert not v.passed and v.outcome == "wrong", v.feedback
    assert "stage 0's parameters differ" in v.feedback, v.feedback
