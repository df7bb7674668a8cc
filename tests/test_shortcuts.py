"""Shortcuts that return the right values without the technique the exercise teaches (issue 22): each
is what a learner in a hurry might honestly write, and each must fail, saying what the exercise wanted
(dtrain_lab/grading/patterns.py). The solutions' passes are re-graded by nbval
(solutions/{zh,en}/lab_*.ipynb) and by each lab's own tests."""
import pytest

from conftest import ROOT, _box, grade
from dtrain_lab.grading import lab04

SHORTCUTS = ROOT / "tests" / "submissions" / "shortcuts"
CASES = {
    # file: (exercise, words the feedback must hold, in English)
    "lab13_ring_all_gather.py": ("lab13.ring_attention", ["all_gather", "one K/V block at a time"]),
    "lab13_moe_gather_weights.py": ("lab13.dispatch_combine", ["all_gather", "two All-to-Alls"]),
    "lab04_sparse_dense.py": ("lab04.sparse_allreduce", ["all_reduce", "k values and their k indices"]),
    "lab10_hier_flat_gather.py": ("lab10.hierarchical", ["all_gather", "inside its node"]),
    "lab02_sync_decoys.py": ("lab02.sync", ["all_gather", "one all-reduce"]),
    "lab10_barrier_dir_fd.py": ("lab10.barrier_rank0", ["bet on timing"]),
    "lab08_broadcast_whole_model.py": ("lab08.run_1f1b", ["broadcast", "is not a pipeline"]),
    # PyTorch's own bucket assignment is withheld in the rank: calling it is a crash that says why
    "lab02_buckets_torch.py": ("lab02.buckets", ["_compute_bucket_assignment_by_size", "build the buckets yourself"]),
}
OUTCOME = {"lab02_buckets_torch.py": "crash"}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", sorted(CASES))
def test_a_shortcut_fails_and_says_what_the_exercise_wanted(name):
    exercise, words = CASES[name]
    v = grade(exercise, SHORTCUTS / name, lang="en")
    assert not v.passed and v.outcome == OUTCOME.get(name, "wrong"), v.feedback
    for word in words:
        assert word in v.feedback, (word, v.feedback)


def test_the_byte_budget_from_outside():
    """Lab 04's check of the bytes the kernel counted: nothing without a count, a sparse job's count
    passes, one dense copy of the large case fails and says what was counted."""
    from dtrain_lab.grading.checks import lab04 as checks04
    from dtrain_lab.grading.exercise import Run
    from dtrain_lab.sandbox import supervisor

    def found(n):
        return checks04._bytes_from_outside(Run(world_size=2, seed=0, inputs=[], wire_bytes=n))

    dense = 4 * lab04.LARGE
    assert found(None) == [] and found(100 << 10) == [] and found(checks04.WIRE_BUDGET) == []
    assert checks04.WIRE_BUDGET < dense // 2            # even a dense fp16 copy of the large case is over
    got = found(dense)[0]
    assert "sent each other 1024 KiB" in got["en"] and "1024 KiB" in got["zh"] and "内核" in got["zh"]
    sent, packets = supervisor.loopback()                # this process's namespace: counters that only grow
    assert sent >= 0 and packets >= 0


UNTRACED = {
    # file: (exercise, words the feedback must hold, in English)
    "lab04_sparse_dense_untraced.py": ("lab04.sparse_allreduce", ["counted by the kernel", "1024 KiB", "k indices"]),
    "lab13_moe_gather_weights_untraced.py": ("lab13.dispatch_combine", ["counted by the kernel", "512 KiB", "not the experts"]),
}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", sorted(UNTRACED))
def test_a_shortcut_hidden_from_the_trace_is_seen_in_the_bytes(name):
    """A dense all-reduce, or the experts' weights gathered, through the process group's own C++
    method: no trace. In the sandbox the job has a network namespace of its own and the kernel counts
    its bytes; without one (a self-check, ``DTRAIN_CAPS=sandbox=0``) nothing does, and the guide's
    mode table says that this passes there."""
    exercise, words = UNTRACED[name]
    v = grade(exercise, SHORTCUTS / name, lang="en")
    if _box() is None:
        assert not v.passed and v.outcome == "wrong", v.feedback
        for word in words:
            assert word in v.feedback, (word, v.feedback)
    else:
        assert v.passed, v.feedback
