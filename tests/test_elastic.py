"""Elastic restarts with torchrun --max-restarts: a rank killed mid-run, then rank 0 killed while
writing a checkpoint; each time the job restarts, resumes from the last good checkpoint, and it
ends with exactly the parameters of an uninterrupted run (``torch.equal``).

Two launches of dtrain_lab/demos/recovery_train.py on 2 ranks (gloo), 16 steps, a checkpoint every
4: the uninterrupted reference, and one run with two injected faults (``max_restarts=2``):
attempt 0 — rank 1 SIGKILLs itself before step 6 (resume from step 4);
attempt 1 — rank 0 SIGKILLs itself between the temporary file and the rename of the step-12
checkpoint (resume from step 8: the half-done save must not be used).
"""
import uuid

import pytest
import torch

import dtrain_lab

TARGET = "dtrain_lab.demos.recovery_train"
EVERY, EPOCHS, STEPS = 4, 2, 16      # 2 epochs x 64 samples / (2 ranks x 4 per batch)


def _run(tmp_path_factory, name, faults=None, max_restarts=0):
    root = tmp_path_factory.mktemp(name)
    env = {"DTRAIN_TEST_TAG": uuid.uuid4().hex, "DTRAIN_PG_TIMEOUT": "20"}
    if faults:
        env.update(faults)
        env["DTRAIN_FAIL_ONCE_FILE"] = str(root / "failed_once")
    return dtrain_lab.launch(TARGET, nproc=2, args=[str(root / "ckpt"), EVERY, EPOCHS], timeout=120,
                             quiet=True, max_restarts=max_restarts, env=env)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    return _run(tmp_path_factory, "ref")


@pytest.fixture(scope="module")
def faulty(tmp_path_factory):
    return _run(tmp_path_factory, "faults", {"DTRAIN_FAIL_AT_STEP": "6;12", "DTRAIN_FAIL_RANK": "1;0",
                                              "DTRAIN_FAIL_MODE": "sigkill;ckpt"}, max_restarts=2)


def _ok(r):
    detail = "\n".join(x.output[-2500:] for x in r.ranks) + "\n" + r.agent_output[-2500:]
    assert r.ok, r.summary() + "\n" + detail
    return r


def _params(r):
    ps = [torch.tensor(p, dtype=torch.float32) for p in r.gathered("params")]
    assert torch.equal(ps[0], ps[1]), "DDP replicas differ"
    return ps[0]


def _attempts(r, rank=0):
    return [rep for rep in r.ranks[rank].reports if "attempt" in rep]


@pytest.mark.timeout(400)
def test_uninterrupted_reference(reference):
    r = _ok(reference)
    assert r.gathered("steps") == [STEPS, STEPS]
    assert [(a["attempt"], a["resumed_from"]) for a in _attempts(r)] == [(0, 0)]


@pytest.mark.timeout(400)
def test_restarts_resume_from_last_good_checkpoint(faulty):
    r = _ok(faulty)
    for rank in (0, 1):
        assert [(a["attempt"], a["resumed_from"]) for a in _attempts(r, rank)] == [(0, 0), (1, 4), (2, 8)]
    # the faults really fired (each rank's own message, printed just before it killed itself) ...
    assert "mode sigkill: rank 1 fails at step 6 (step)" in r.ranks[1].output
    assert "mode ckpt: rank 0 fails at step 12 (ckpt_rename)" in r.ranks[0].output
    # ... and torchrun saw a killed process (the first failure it notices may be the peer's exit 1)
    assert "exitcode: -9" in r.agent_output, r.agent_output[-3000:]
    assert r.gathered("steps") == [STEPS, STEPS]


@pytest.mark.timeout(400)
def test_kill_during_checkpoint_write_leaves_only_good_checkpoints(faulty):
    r = _ok(faulty)
    files = _attempts(r)[2]["ckpt_files"]      # what the save killed at step 12 left behind
    assert "step_00000008.pt" in files and "step_00000012.pt" not in files
    assert any(f.startswith(".step_00000012.pt.tmp.") for f in files), files


@pytest.mark.timeout(400)
def test_resumed_parameters_equal_uninterrupted(reference, faulty):
    ref, got = _params(_ok(reference)), _params(_ok(faulty))
    assert torch.equal(got, ref), f"max abs diff {(got - ref).abs().max().item()}"


def test_restart_store_prefix_per_attempt(monkeypatch):
    """runtime's fix, in-process: a first attempt uses torch's own path (no store of ours); attempt n
    writes under ``dtrain_attempt_<n>/default_pg`` of torchrun's shared store, so keys left by the
    previous attempt (gloo's peer addresses) are invisible to it."""
    import datetime

    import torch.distributed as dist

    from dtrain_lab.jobs import runtime

    server = dist.TCPStore("127.0.0.1", 0, 1, is_master=True, timeout=datetime.timedelta(seconds=5))
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(server.port))
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")   # as torchrun --standalone sets it
    timeout = datetime.timedelta(seconds=5)
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    assert runtime._restart_store(0, 1, timeout) is None
    server.set("default_pg/0//cpu//0/0", "stale address of attempt 0")
    for attempt in (1, 2):
        monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", str(attempt))
        store = runtime._restart_store(0, 1, timeout)
        assert not store.check(["0//cpu//0/0"])                    # the stale key is not seen
        store.set("0//cpu//0/0", f"attempt {attempt}")
        assert server.get(f"dtrain_attempt_{attempt}/default_pg/0//cpu//0/0") == f"attempt {attempt}".encode()
    assert server.get("default_pg/0//cpu//0/0") == b"stale address of attempt 0"
