"""One submission cannot slow a classmate's grade into another verdict (issue 22, point 4): a correct
lab 10 submission graded in a -j 2 class run beside a neighbour that starts 300 busy loops in sessions
of their own, a fork bomb and a memory hog keeps its pass, and nothing of the neighbour survives (its
cgroup included). How much slower it gets is a ratio in ``make bench`` (dtrain_lab.bench.fairness),
not a timed test. Where the grader gets no cgroup per job (a normal user without a delegated cgroup
v2 subtree), CPU is shared per process and a classmate can be starved: skipped there, with the reason
(the instructor guide's modes table says so)."""
import pytest

from conftest import _box, assert_no_survivors, new_tag
from dtrain_lab import caps
from dtrain_lab.bench import fairness
from dtrain_lab.sandbox import cgroup


@pytest.mark.timeout(300)
def test_a_correct_classmate_keeps_its_verdict_beside_a_hostile_neighbour():
    if not caps.have("cgroup"):
        pytest.skip(f"no cgroup per graded job here: {cgroup.why_not() or 'forced off (DTRAIN_CAPS)'}")
    tag = new_tag()
    out = fairness.pair(fairness.HOSTILE.read_text(encoding="utf-8"), sandbox=_box())
    assert out["alice"][0] == "pass", out
    assert out["mallory"][0] != "pass", out
    assert_no_survivors(tag)


@pytest.mark.timeout(60)
def test_a_job_group_limits_and_measures_from_outside_and_leaves_nothing():
    """cgroup.create: the job's processes are born inside, its memory peak is read from outside, and
    remove() kills what is left and deletes the folders."""
    import subprocess
    import sys

    if not caps.have("cgroup"):
        pytest.skip(f"no cgroup per graded job here: {cgroup.why_not() or 'forced off (DTRAIN_CAPS)'}")
    group = cgroup.create("test-" + new_tag()[:8], memory_bytes=1 << 30, pids_max=64)
    assert group is not None
    code = ("import os, time\nb = bytearray(200 << 20)\nfor i in range(0, len(b), 4096): b[i] = 1\n"
            "pid = os.fork()\nif pid:\n    print(pid, flush=True)\ntime.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", "import sys, time; sys.stdin.readline(); exec(sys.argv[1])", code],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert group.add(proc.pid)
        proc.stdin.write("go\n")
        proc.stdin.flush()
        child = int(proc.stdout.readline())
        assert {proc.pid, child} <= group.pids()          # the fork was born inside
        assert group.memory_peak() >= 200 << 20           # the kernel's count, not the process's word
    finally:
        group.remove()
        proc.wait(timeout=10)
    assert proc.returncode == -9 and all(not f.exists() for f in group.folders.values())
