"""The launcher: success, crash, hangs (run and start-up), interrupt, kernel death, concurrency,
hostile programs; and no process of a job survives any of them. Crash, hang and the hostile programs
run with both ways torchrun can start the ranks: forked from its agent (the default without a CUDA
GPU; make test) and a fresh Python each (the default with GPUs; the exec-start leg, DTRAIN_START=exec)."""
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

import dtrain_lab
from conftest import WORKERS, assert_no_survivors, processes_with_tag
from dtrain_lab.sandbox import contain
from dtrain_lab.i18n import LabError

HOSTILE = str(WORKERS / "hostile.py")


# make test runs these with the CPU default (ranks forked from torchrun's agent); the exec-start leg of
# .ci/run (tools/modes.sh, DTRAIN_START=exec) runs the same tests with a fresh Python per rank, the GPU
# default: each start method is covered once, not twice in one run
STARTS = [os.environ.get("DTRAIN_START") or "fork"]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("start", STARTS)
def test_crash_of_one_rank_is_reported(run, start):
    r = run("dtrain_lab.demos.crash", nproc=2, timeout=60, start=start)
    assert ("--start-method" in r.command) == (start == "fork")
    assert not r.ok and not r.hung and r.returncode != 0
    assert r.first_failure == 1
    assert r.exception == "ValueError: bad batch at step 2 on rank 1"
    assert r.ranks[1].traceback and "crash.py" in r.ranks[1].traceback
    # rank 0 fails after it, in its next collective, because its peer is gone (gloo raises a
    # RuntimeError, or one of torch.distributed's RuntimeError subclasses, depending on where in the
    # collective the closed connection is noticed); or, if a loaded machine did not run it in that
    # moment, it is stopped by torchrun first (SIGTERM, then SIGKILL after torchrun's grace period),
    # which it cannot record: the launcher says so, as it has no exit mark of its own either
    ended = ("RuntimeError", "DistBackendError", "DistNetworkError", "DistError", "killed by SIGTERM",
             "killed by SIGKILL", "stopped from outside after rank 1 failed")
    assert r.ranks[0].exception and r.ranks[0].exception.startswith(ended), r.ranks[0].exception
    assert r.metrics[0]["step"] == 1 and r.metrics[1]["step"] == 1
    summary = r.summary("en")
    assert "first failing rank: 1" in summary and "ValueError" in summary
    assert "最先出错的 rank：1" in r.summary("zh")


AFTER_RANK_0 = """\
import sys, time
import torch, torch.distributed as dist
from dtrain_lab.jobs import runtime


def main():
    dist.all_reduce(torch.zeros(1))
    if runtime.current().rank == 0:
        if sys.argv[1] == "returns":
            return
        sys.exit(0)
    time.sleep(1.0)                       # rank 0 has ended by now
    if sys.argv[1] == "peer_gone":
        dist.all_reduce(torch.zeros(1))   # gloo: its peer closed the connection
    raise ValueError("rank 1 fails after rank 0 ended")


if __name__ == "__main__":
    runtime.entrypoint(main)
"""


# A regression: forked (torchrun's fork start method), a worker whose rank had succeeded stayed alive
# (torchrun keeps a returned worker waiting for the others) and passed torchrun's SIGTERM on to its
# rank, long gone; torchrun then waited its 30 s grace period before SIGKILL, and the launch said the
# job hung. Now both start methods report rank 1's failure at once.
@pytest.mark.timeout(90)
@pytest.mark.parametrize("start", STARTS)
@pytest.mark.parametrize("how", ["exits", "returns", "peer_gone"])
def test_failure_after_a_rank_ended_normally_is_reported_at_once(run, start, how, tmp_path):
    prog = tmp_path / "after_rank_0.py"
    prog.write_text(AFTER_RANK_0)
    t0 = time.monotonic()
    r = run(prog, nproc=2, args=[how], timeout=25, start=start)
    wall = time.monotonic() - t0
    assert not r.hung and not r.ok and r.returncode != 0, r.summary()
    assert r.first_failure == 1, r.summary()
    if how == "peer_gone":
        assert r.exception.startswith(("RuntimeError", "DistBackendError", "DistNetworkError", "DistError"))
    else:
        assert r.exception == "ValueError: rank 1 fails after rank 0 ended"
    assert r.ranks[1].traceback and "after_rank_0.py" in r.ranks[1].traceback
    assert r.ranks[0].exception is None, r.ranks[0].exception    # rank 0 ended well
    assert r.startup is not None and wall - r.startup < 15, (wall, r.startup)   # not torchrun's 30 s


@pytest.mark.timeout(120)
@pytest.mark.parametrize("start", STARTS)
def test_hang_is_reported_with_every_ranks_wait_site(run, start):
    timeout = 4.0
    t0 = time.monotonic()
    r = run("dtrain_lab.demos.hang", nproc=2, timeout=timeout, start=start)
    wall = time.monotonic() - t0
    assert r.hung and not r.ok and r.phase == "run"
    assert r.startup is not None and wall <= r.startup + timeout + 45    # not the 600 s default
    assert r.waiting[0].call == "all_reduce" and "hang.py" in r.waiting[0].where
    assert "in evaluate" in r.waiting[0].where
    assert r.waiting[1].call == "barrier" and "in main" in r.waiting[1].where
    s = r.summary("en")
    assert "rank 0 is waiting in all_reduce" in s and "rank 1 is waiting in barrier" in s
    assert "rank 0 卡在 all_reduce" in r.summary("zh")
    assert r.killed >= 3  # torchrun and both ranks had to be killed
    assert "never printed" not in r.output[1]


@pytest.mark.timeout(120)
def test_hang_in_a_program_that_never_imports_dtrain_lab(run):
    r = run(HOSTILE, nproc=2, args=["recv_recv"], timeout=3)
    assert r.hung and r.phase == "run"
    for rank in (0, 1):
        assert r.waiting[rank].call == "recv", r.stacks[rank]
        assert "hostile.py" in r.waiting[rank].where


@pytest.mark.timeout(120)
def test_startup_hang_has_its_own_limit(run):
    # 15 s: the ranks are forked from an agent that has imported torch (the agent server, the default
    # on CPU), so they reach their sleep in about a second even on a loaded machine
    r = run(HOSTILE, nproc=2, args=["never_init"], timeout=300, startup_timeout=15)
    assert r.hung and r.phase == "startup" and r.startup is None
    assert r.elapsed < 15 + 60 and r.limit == 15      # the start-up limit, not the run's 300 s
    assert "start-up" in r.summary("en") and "启动阶段" in r.summary("zh")
    assert r.waiting[1] is not None and "sleep" in r.waiting[1].call


@pytest.mark.timeout(120)
@pytest.mark.parametrize("start", STARTS)
def test_orphans_flood_os_exit_and_args(run, start):
    daemon = run(HOSTILE, nproc=2, args=["fork_daemon"], timeout=60, start=start)
    assert daemon.ok, daemon.summary()
    assert daemon.killed >= 2          # the two setsid daemons were found and killed
    assert not processes_with_tag(daemon.tag)

    flood = run(HOSTILE, nproc=2, args=["flood"], timeout=60, max_output_lines=500, start=start)
    assert flood.ok and all(x.truncated for x in flood.ranks)
    assert flood.output[0].count("\n") == 500

    gone = run(HOSTILE, nproc=2, args=["os_exit"], timeout=60, start=start)
    assert not gone.ok and gone.first_failure == 1 and gone.exception == "exit code 3"

    args = run(HOSTILE, nproc=2, args=["args", "--lr", 0.5], timeout=60, start=start)
    assert args.ok, args.summary() + "\n" + args.agent_output[-3000:] + "\n".join(x.output[-2000:] for x in args.ranks)
    assert "args: ['--lr', '0.5']" in args.output[1]
    # the program ran as `python hostile.py ...` would run it, forked or not
    assert "main: __main__ hostile.py [] " in args.output[0] and "workers\n" in args.output[0]


@pytest.mark.timeout(120)
def test_a_forked_rank_ends_as_the_interpreter_would(run):
    # non-daemon threads are waited for, then atexit handlers run, then the exit code is torchrun's
    r = run(HOSTILE, nproc=2, args=["ends_with_a_thread"], timeout=60, start="fork")
    assert r.ok, r.summary()
    for out in r.output.values():
        assert out.index("thread finished") < out.index("atexit ran")


@pytest.mark.timeout(120)
def test_concurrent_launches_do_not_collide(run):
    results = {}

    def go(i):
        results[i] = run("dtrain_lab.demos.hello", nproc=2, timeout=60)

    threads = [threading.Thread(target=go, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(r.ok for r in results.values()), [r.summary() for r in results.values()]
    ports = {r.metrics[0]["env"]["MASTER_PORT"] for r in results.values()}
    assert len(ports) == 2
    for r in results.values():
        assert r.gathered("all_reduce_sum") == [3.0, 3.0]


_DRIVERS: list = []


@pytest.fixture(autouse=True)
def _no_driver_left():
    """A driver a failed test left behind is killed with its job (the test already failed)."""
    yield
    while _DRIVERS:
        proc = _DRIVERS.pop()
        contain.kill_tree(proc.pid)
        proc.wait()


def _driver(tag, runs):
    env = dict(os.environ, PYTHONUNBUFFERED="1", DTRAIN_RUN_DIR=str(runs))
    proc = subprocess.Popen([sys.executable, str(WORKERS / "driver.py"), tag, HOSTILE],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    _DRIVERS.append(proc)
    deadline = time.monotonic() + 60
    while len(list(runs.glob("*/ready.*"))) < 2:  # both ranks have joined the process group
        assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read().decode()
        time.sleep(0.3)
    assert len(processes_with_tag(tag)) >= 3   # the driver, and the job's processes in its tree
    time.sleep(1.0)
    return proc


@pytest.mark.timeout(120)
def test_interrupt_kills_every_rank(tag, tmp_path):
    proc = _driver(tag, tmp_path)
    proc.send_signal(signal.SIGINT)  # what Jupyter's stop button sends to the kernel
    try:
        out, _ = proc.communicate(timeout=45)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGUSR1)  # the driver prints every thread's stack
        time.sleep(1)
        proc.kill()
        out, _ = proc.communicate()
        pytest.fail("the driver did not stop 45 s after SIGINT:\n" + out.decode(errors="replace")[-6000:])
    assert proc.returncode == 130 and b"DRIVER-INTERRUPTED" in out
    assert_no_survivors(tag)


@pytest.mark.timeout(120)
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="parent-death signal is Linux-only")
def test_killed_kernel_leaves_no_job_behind(tag, tmp_path):
    proc = _driver(tag, tmp_path)
    proc.kill()  # the kernel dies without running any cleanup
    proc.wait(timeout=10)
    # torchrun gets SIGTERM from the kernel (PR_SET_PDEATHSIG) and stops its workers; a worker that
    # ignores SIGTERM is killed by torchrun after its grace period
    assert_no_survivors(tag, grace=45)


@pytest.mark.timeout(30)
def test_bad_arguments_get_bilingual_errors():
    with pytest.raises(LabError) as e:
        dtrain_lab.launch("dtrain_lab.demos.hello", nproc=0)
    assert "nproc" in str(e.value) and "正整数" in str(e.value)
    with pytest.raises(LabError) as e:
        dtrain_lab.launch("no_such_module.anywhere")
    assert "importable" in str(e.value) and "无法启动" in str(e.value)
    with pytest.raises(LabError):
        dtrain_lab.launch("dtrain_lab.demos.hello", timeout=-1)
    with pytest.raises(LabError):
        dtrain_lab.launch("dtrain_lab.demos.hello", nnodes=2)
    with pytest.raises(LabError, match="start"):
        dtrain_lab.launch("dtrain_lab.demos.hello", start="spawn")


def test_read_jsonl_skips_a_line_cut_off_by_a_kill(tmp_path):
    from dtrain_lab.jobs.launch import read_jsonl

    f = tmp_path / "report.0.0.jsonl"
    f.write_text('{"loss": 1.5}\n[1, 2]\nnot json\n{"step": 3, "loss": 0.5}\n{"step": 4, "lo')
    assert read_jsonl(str(f)) == [{"loss": 1.5}, {"step": 3, "loss": 0.5}]
    assert read_jsonl(str(tmp_path / "missing.jsonl")) == []


def test_ranks_are_forked_only_without_a_cuda_gpu(monkeypatch, tmp_path):
    from dtrain_lab.jobs import options, runtime

    monkeypatch.delenv("DTRAIN_START", raising=False)
    monkeypatch.setattr(runtime, "gpu_count", lambda: 0)
    cmd = options.LaunchOptions("dtrain_lab.demos.hello", 2).command(tmp_path)
    assert cmd[cmd.index("--start-method") + 1] == "fork" and "--run-path" in cmd
    # torchrun's own options first, then our rank file, then the program as `python -m` takes it
    assert cmd[-3:] == [options.FORKED_RANK, "-m", "dtrain_lab.demos.hello"]
    monkeypatch.setattr(runtime, "gpu_count", lambda: 2)  # CUDA cannot be used in a forked child
    cmd = options.LaunchOptions("dtrain_lab.demos.hello", 2).command(tmp_path)
    assert "--start-method" not in cmd and "--run-path" not in cmd and cmd[-2:] == ["-m", "dtrain_lab.demos.hello"]
    monkeypatch.setenv("DTRAIN_START", "fork")
    assert options.LaunchOptions("dtrain_lab.demos.hello", 2).start == "fork"
    monkeypatch.setenv("DTRAIN_START", "exec")
    monkeypatch.setattr(runtime, "gpu_count", lambda: 0)
    assert options.LaunchOptions("dtrain_lab.demos.hello", 2).start == "exec"
    assert options.LaunchOptions("dtrain_lab.demos.hello", 2, start="fork").start == "fork"


def test_rank_stopped_from_outside_is_told_apart(tmp_path):
    """A rank with no exception and no exit mark for its last attempt was stopped from outside; one that
    ended by itself (an exit mark) or never started keeps no exception."""
    from dtrain_lab.jobs.outcome import mark_stopped
    from dtrain_lab.jobs.result import RankResult

    for name in ("started.0.0", "started.0.1", "exit.0.0", "started.1.1", "started.2.0", "exit.2.0"):
        (tmp_path / name).write_text("1")
    ranks = {r: RankResult(rank=r) for r in range(4)}
    ranks[3].exception = "ValueError: x"
    mark_stopped(ranks, tmp_path, failed_rank=3)
    assert ranks[0].exception == "stopped from outside after rank 3 failed (no exception of its own)"
    assert ranks[1].exception.startswith("stopped from outside")
    assert ranks[2].exception is None           # ended by itself
    assert ranks[3].exception == "ValueError: x"
    mark_stopped(ranks := {0: RankResult(rank=0)}, tmp_path, failed_rank=None)
    assert ranks[0].exception is None
