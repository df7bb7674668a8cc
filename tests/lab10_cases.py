"""Shared by the lab-10 grading tests (split in two files so pytest-xdist runs them in parallel).

Solutions and learner stubs come from the lab's one source, solutions/_source/lab_10_deadlocks.md
(the notebooks are generated from it); plausible wrong fixes live in tests/submissions/lab10/."""
import time

from conftest import ROOT, grade
from dtrain_lab import authoring
from dtrain_lab.grading import registry

SOURCE = ROOT / "solutions" / "_source" / "lab_10_deadlocks.md"
WRONG = ROOT / "tests" / "submissions" / "lab10"
STUB_LINE = "# YOUR CODE HERE"


def programs() -> dict:
    """``{name: {"solution": code, "learner": code}}`` from the lab's %%writefile cells."""
    return {ex_id.split(".", 1)[1]: code for ex_id, code in authoring.lab_programs("lab10", SOURCE).items()}


PROGRAMS = programs()
NAMES = sorted(e.id.split(".", 1)[1] for e in registry.all_exercises() if e.lab == "lab_10")
assert sorted(PROGRAMS) == NAMES, "every lab-10 exercise has one %%writefile cell in the lab"
HALVES = (NAMES[:4], NAMES[4:])


def broken(name: str) -> str:
    """The learner's starting program without the stub marker: what a learner who changes nothing submits."""
    return "\n".join(line for line in PROGRAMS[name]["learner"].split("\n") if STUB_LINE not in line)


def check_exercise(name, tmp_path):
    ex_id = f"lab10.{name}"
    ex = registry.get(ex_id)

    def submit(code: str, tag: str):
        path = tmp_path / tag / ex.filename
        path.parent.mkdir()
        path.write_text(code)
        return path

    # the solution's passing grade: solutions/{zh,en}/lab_10_deadlocks.ipynb, re-graded by nbval
    # (tests/test_solution_cells.py checks that each exercise's pass is stored there)
    t0 = time.monotonic()
    v = grade(ex_id, submit(broken(name), "broken"), lang="en")
    assert not v.passed and v.outcome in ("wrong", "crash", "hang"), v.feedback
    if v.outcome == "hang":  # graded within the exercise's limit + 15 s (start-up excluded)
        assert "rank 0:" in v.feedback and "rank 1:" in v.feedback
    assert time.monotonic() - t0 < 60 + len(ex.world_sizes) * (ex.timeout + 15)

    wrong = grade(ex_id, WRONG / f"{name}_wrong.py", lang="zh")
    assert not wrong.passed and wrong.outcome in ("wrong", "crash", "hang"), wrong.feedback
    assert any("\u4e00" <= ch <= "\u9fff" for ch in wrong.feedback)   # feedback in the learner's language

    # the learner's copy as generated: the stub marker is there -> "not yet", without running anything
    stub = grade(ex_id, submit(PROGRAMS[name]["learner"], "learner"), lang="en")
    assert not stub.passed and stub.outcome == "error" and "not attempted" in stub.feedback
