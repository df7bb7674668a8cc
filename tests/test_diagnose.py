"""dtrain_lab.jobs.diagnose.diagnose and the launcher's reading of native aborts: fast, no launch (the live
versions of every case run in lesson 10's notebooks)."""
from types import SimpleNamespace as NS

import pytest

from dtrain_lab.jobs.diagnose import Frame, WaitSite, diagnose, wait_site
from dtrain_lab.jobs.outcome import native_abort, signal_or_code

DIST = "/x/site-packages/torch/distributed/distributed_c10d.py"


def site(call, dist=True):
    frames = [Frame(DIST if dist else "/x/train.py", 1, call)]
    return WaitSite(call=call, where="train.py:1 in main", frames=frames)


def hung(*sites, phase="run"):
    return NS(hung=True, ok=False, phase=phase, exception=None, first_failure=None,
              ranks=[NS(rank=i, waiting=s) for i, s in enumerate(sites)])


def failed(exception, first=1):
    return NS(hung=False, ok=False, phase="run", exception=exception, first_failure=first, ranks=[])


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_hang_readings(lang):
    (h,) = diagnose(hung(site("all_reduce"), site("broadcast")), lang)
    assert "all_reduce" in h and "broadcast" in h and "DETAIL" in h
    (h,) = diagnose(hung(site("all_reduce"), site("time.sleep(3600)", dist=False)), lang)
    assert "1" in h and "all_reduce" in h            # rank 1 is outside any collective
    (h,) = diagnose(hung(site("all_reduce"), site("all_reduce")), lang)
    assert "all_reduce" in h                          # same collective: the transport
    hints = diagnose(hung(site("barrier"), site("backward", dist=False)), lang)
    assert len(hints) == 2 and "join()" in hints[1]  # uneven inputs
    # a rank in DDP's backward: the hint warns against DETAIL (DDP segfaults under it, lesson 10)
    # instead of recommending it as it does for plain collectives
    from dtrain_lab.i18n import tr
    calls = "rank 0: barrier; rank 1: backward"
    assert hints[0] == tr("diag_different_collectives_ddp", lang, calls=calls)
    assert hints[0] != tr("diag_different_collectives", lang, calls=calls)
    (h,) = diagnose(hung(None, None, phase="startup"), lang)
    assert "init_process_group" in h


def test_failure_readings():
    cases = {
        "RuntimeError: Detected mismatch between collectives on ranks.": "Desync detected",
        "RuntimeError: [Rank 0]: Ranks 1 failed to pass monitoredBarrier in 2000 ms": "monitored_barrier",
        "RuntimeError: Expected to have finished reduction in the prior iteration": "find_unused_parameters",
        "DistNetworkError: ... name: EADDRINUSE, message: address already in use": "--standalone",
        "gloo::EnforceNotMet (C++ abort): Received data size doesn't match expected size.": "different sizes",
        "RuntimeError: Timed out waiting 3000ms for recv operation to complete": "timeout",
        "RuntimeError: Connection reset by peer": "another rank",
        "ValueError: bad batch": "rank 1's exception",
    }
    for exc, expected in cases.items():
        (h,) = diagnose(failed(exc), "en")
        assert expected in h, (exc, h)
    assert diagnose(NS(hung=False, ok=True), "en") == []


def test_native_abort_is_read_from_stderr():
    stderr = ("terminate called after throwing an instance of 'gloo::EnforceNotMet'\n"
              "  what():  [enforce fail at pair.cc:456] op.preamble.length <= op.nbytes. 8 vs 4.\n")
    assert native_abort(stderr) == ("gloo::EnforceNotMet (C++ abort): [enforce fail at pair.cc:456] "
                                     "op.preamble.length <= op.nbytes. 8 vs 4.")
    assert native_abort("Traceback ...\nValueError: x") is None


def test_a_rank_inside_backward_waits_in_backward():
    dump = ("Current thread 0x00007f (most recent call first):\n"
            '  File "/v/site-packages/torch/autograd/graph.py", line 979 in _engine_run_backward\n'
            '  File "/v/site-packages/torch/autograd/__init__.py", line 395 in backward\n'
            '  File "/v/site-packages/torch/_tensor.py", line 623 in backward\n'
            '  File "/home/me/train.py", line 12 in train\n'
            '  File "/home/me/train.py", line 30 in <module>\n')
    w = wait_site(dump)
    assert w.call == "backward" and w.where == "train.py:12 in train"


def test_signal_is_read_from_the_failing_ranks_own_block():
    agent = ("Failures:\n[1]:\n  rank      : 1 (local_rank: 1)\n  exitcode  : 1 (pid: 11)\n"
             "  traceback : To enable traceback see ...\n-----------------------\n"
             "Root Cause (first observed failure):\n[0]:\n  rank      : 0 (local_rank: 0)\n"
             "  exitcode  : -11 (pid: 10)\n  traceback : Signal 11 (SIGSEGV) received by PID 10\n=========\n")
    assert signal_or_code(agent, 0) == "killed by SIGSEGV"
    assert signal_or_code(agent, 1) == "exit code 1"


def test_a_rank_in_ddps_buffer_broadcast_waits_in_a_collective():
    dump = ("Current thread 0x00007f (most recent call first):\n"
            '  File "/v/site-packages/torch/nn/parallel/distributed.py", line 2100 in _distributed_broadcast_coalesced\n'
            '  File "/v/site-packages/torch/nn/parallel/distributed.py", line 2060 in _sync_buffers\n'
            '  File "/v/site-packages/torch/nn/parallel/distributed.py", line 1800 in _pre_forward\n'
            '  File "/home/me/train.py", line 12 in evaluate\n'
            '  File "/home/me/train.py", line 30 in <module>\n')
    w = wait_site(dump)
    assert w.call == "_distributed_broadcast_coalesced" and w.where == "train.py:12 in evaluate"
    (h,) = diagnose(hung(w, site("barrier")), "en")
    assert "different collectives" in h


def test_secondary_errors_are_consequences_not_causes():
    from dtrain_lab.jobs.diagnose import is_secondary_error

    assert is_secondary_error("RuntimeError: [../gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:1")
    assert not is_secondary_error("ValueError: the learner's own bug")
    fail = NS(hung=False, ok=False, phase=None, first_failure=1, ranks=[],
              exception="RuntimeError: Connection reset by peer")
    assert len(diagnose(fail, "en")) == 1


def test_a_hung_jobs_grouped_output_stops_where_it_was_found_hung():
    """What the ranks print while they are killed (a peer's collective failing as the other dies,
    cut off by the kill) depends on the kill order: the notebook shows each rank's lines up to the
    moment the job was found hung (launch.py takes that count before it kills)."""
    from dtrain_lab.jobs.output import grouped
    from dtrain_lab.jobs.result import RankResult

    ranks = [RankResult(rank=0, output="step 1\n"), RankResult(rank=1, output="step 1\nTraceback (most recent call last):\n")]
    assert grouped(ranks) == "[rank0] step 1\n[rank1] step 1\n[rank1] Traceback (most recent call last):"
    assert grouped(ranks, upto={0: 1, 1: 1}) == "[rank0] step 1\n[rank1] step 1"
    assert grouped(ranks, upto={0: 0, 1: 0}) == ""
