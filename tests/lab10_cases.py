"""Shared by the lab-10 grading tests (split in two files so pytest-xdist runs them in parallel)."""
import time



from conftest import ROOT
from dtrain_lab.grading import grade, registry

SUBMISSIONS = ROOT / "tests" / "submissions" / "lab10"
NAMES = sorted(e.id.split(".", 1)[1] for e in registry.all_exercises() if e.lab == "lab_10")


def check_exercise(name, tmp_path):
    ex_id = f"lab10.{name}"
    ex = registry.get(ex_id)
    solution = grade(ex_id, SUBMISSIONS / f"{name}_solution.py", lang="en")
    assert solution.passed and solution.outcome == "pass" and solution.score == ex.max_score, solution.feedback

    t0 = time.monotonic()
    broken = grade(ex_id, SUBMISSIONS / f"{name}_broken.py", lang="en")
    assert not broken.passed and broken.outcome in ("wrong", "crash", "hang"), broken.feedback
    if broken.outcome == "hang":  # graded within the exercise's limit + 15 s (start-up excluded)
        assert "rank 0:" in broken.feedback and "rank 1:" in broken.feedback
    assert time.monotonic() - t0 < 60 + len(ex.world_sizes) * (ex.timeout + 15)

    wrong = grade(ex_id, SUBMISSIONS / f"{name}_wrong.py", lang="zh")
    assert not wrong.passed and wrong.outcome in ("wrong", "crash", "hang"), wrong.feedback
    assert any("\u4e00" <= ch <= "\u9fff" for ch in wrong.feedback)   # feedback in the learner's language

    # the learner's copy: the broken program plus the stub marker -> "not yet", without running it
    stub = tmp_path / ex.filename
    stub.write_text("# YOUR CODE HERE: fix the program below\n" + (SUBMISSIONS / f"{name}_broken.py").read_text())
    v = grade(ex_id, stub, lang="en")
    assert not v.passed and v.outcome == "error" and "not attempted" in v.feedback


assert len(NAMES) == 8
HALVES = (NAMES[:4], NAMES[4:])

