"""Shortcuts that return the right values without the technique the exercise teaches (issue 22): each
is what a learner in a hurry might honestly write, and each must fail, saying what the exercise wanted
(dtrain_lab/grading/patterns.py). The solutions' passes are re-graded by nbval
(solutions/{zh,en}/lab_*.ipynb) and by each lab's own tests."""
import pytest

from conftest import ROOT, grade

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
