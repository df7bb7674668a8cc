"""tests/forkjob.py, the forked ranks of the correctness tests: it must report what torchrun's
launcher reports, or a failing technique could pass there. Same programs as test_launch."""
import os
import time

import pytest

from forkjob import fork_launch


@pytest.mark.timeout(120)
@pytest.mark.parametrize("n", [2, 3])
def test_every_rank_runs_the_program_with_torchruns_environment(n):
    r = fork_launch("dtrain_lab.demos.hello", nproc=n, timeout=60)
    assert r.ok and not r.hung and r.returncode == 0, r.summary() + r.ranks[0].output
    assert sorted(r.metrics) == list(range(n))
    assert [m["env"]["RANK"] for m in r.metrics.values()] == [str(i) for i in range(n)]
    assert {m["env"]["WORLD_SIZE"] for m in r.metrics.values()} == {str(n)}
    assert r.gathered("all_reduce_sum") == [n * (n + 1) / 2] * n
    assert len({m["pid"] for m in r.metrics.values()} | {os.getpid()}) == n + 1


@pytest.mark.timeout(120)
def test_a_crash_is_reported_like_the_launchers():
    r = fork_launch("dtrain_lab.demos.crash", nproc=2, timeout=60)
    assert not r.ok and not r.hung and r.returncode != 0
    assert r.first_failure == 1
    assert r.exception == "ValueError: bad batch at step 2 on rank 1"
    assert r.ranks[1].traceback and "crash.py" in r.ranks[1].traceback
    assert r.metrics[0]["step"] == 1 and r.metrics[1]["step"] == 1


@pytest.mark.timeout(120)
def test_a_hang_is_killed_at_the_limit_with_every_ranks_stack():
    t0 = time.monotonic()
    r = fork_launch("dtrain_lab.demos.hang", nproc=2, timeout=4, startup_timeout=2)
    assert r.hung and not r.ok
    assert time.monotonic() - t0 < 45           # the 4 s limit, not the pytest timeout
    for rank in (0, 1):
        assert "thread 0x" in r.ranks[rank].stack.lower() and "hang.py" in r.ranks[rank].waiting.where
    assert r.waiting[0].call == "all_reduce" and r.waiting[1].call == "barrier"
