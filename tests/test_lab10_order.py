"""Lab 10, exercise 7 (a checkpoint rank 0 writes and the others read): whether a reader waited for
the write is judged from where, among its collectives, it read, not from what it happened to read.

The rule on made-up traces first (every pattern a learner may write), then two graded submissions
that must fail whatever the timing of the run: readers that sleep before reading (and read the right
text, by luck) and the plausible wrong fix (a barrier before the write)."""
import pytest

from conftest import ROOT, grade
from dtrain_lab.grading import lab10, trace
from dtrain_lab.grading.checks.lab10 import _readers_wait_for_writer
from dtrain_lab.grading.exercise import Run

W = {"op": lab10.WRITTEN, "mark": True}
R = {"op": lab10.READ, "mark": True}
BARRIER = {"op": "barrier"}


def judge(timeline: dict) -> list:
    run = Run(world_size=len(timeline), seed=0, inputs=[])
    run.timeline = timeline
    run.traces = {r: trace.calls(t) for r, t in timeline.items()}
    return [p["en"] for p in _readers_wait_for_writer(run)]


@pytest.mark.parametrize("timeline", [
    {0: [W, BARRIER], 1: [BARRIER, R], 2: [BARRIER, R]},                              # the solution
    {0: [BARRIER, W, BARRIER], 1: [BARRIER, BARRIER, R]},                            # one barrier too many
    {0: [W, {"op": "broadcast", "src": 0}], 1: [{"op": "broadcast", "src": 0}, R]},  # any world collective
    {0: [W, {"op": "send", "peer": 1}], 1: [{"op": "recv", "peer": 0}, R]},          # a message after the write
    {0: [W, BARRIER], 1: [R, BARRIER, R]},                                           # the last read counts
    {0: [BARRIER], 1: [BARRIER, R]},                                                 # no write finished: the result says it
    {0: [W, {"op": "barrier", "group": [0, 1, 2]}], 1: [{"op": "barrier", "group": [0, 1, 2]}, R]},  # new_group()
    {0: [W, {"op": "barrier", "group": [0, 1]}], 1: [{"op": "barrier", "group": [0, 1]}, R]},        # a pair
])
def test_readers_that_waited_for_the_write(timeline):
    assert judge(timeline) == []


@pytest.mark.parametrize("timeline, reader", [
    ({0: [W, BARRIER], 1: [R, BARRIER]}, 1),                                  # read, then synchronise
    ({0: [BARRIER, W], 1: [BARRIER, R]}, 1),                                  # synchronise, then write
    ({0: [W, BARRIER], 1: [BARRIER, R], 2: [R, BARRIER]}, 2),                 # one reader of two
    ({0: [{"op": "send", "peer": 1}, W, BARRIER], 1: [{"op": "recv", "peer": 0}, R, BARRIER]}, 1),
    ({0: [W, {"op": "barrier", "group": [0, 2]}], 1: [{"op": "barrier", "group": [1]}, R]}, 1),
    # a barrier on another group than the one rank 0 joins after the write
    ({0: [{"op": "barrier", "group": [0, 1]}, W, BARRIER], 1: [{"op": "barrier", "group": [0, 1]}, R, BARRIER]}, 1),
])
def test_readers_that_read_before_a_synchronisation_after_the_write(timeline, reader):
    assert judge(timeline) == [judge_message(reader)]


def judge_message(rank: int) -> str:
    from dtrain_lab.grading.exercise import problem

    return problem("lab10_read_before_sync", rank=rank)["en"]


def test_marks_are_not_collectives():
    # the other checks and the comparison of the ranks' sequences never see a mark
    assert trace.calls([W, BARRIER, R]) == [BARRIER]
    assert trace.first_mismatch({0: [W, BARRIER], 1: [BARRIER, R]}) is None


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", ["barrier_rank0_lucky", "barrier_rank0_wrong"])
def test_a_reader_that_did_not_wait_fails_whatever_it_read(name):
    v = grade("lab10.barrier_rank0", ROOT / "tests" / "submissions" / "lab10" / f"{name}.py", lang="en")
    assert not v.passed and v.outcome == "wrong", v.feedback
    assert "before any synchronisation that follows the write" in v.feedback, v.feedback
