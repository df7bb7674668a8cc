"""dtrain_lab.resilience.recovery: atomic checkpoints, exact resume, fault injection, heartbeats, DCP 2 -> 3 ranks.

In-process tests (world of one) for the file format, the resume and the watchdog; two launches for
the sharded checkpoint (saved by 2 ranks, loaded by 3) and the watchdog naming a stalled rank.
Elastic restarts are in tests/test_elastic.py.
"""
import json
import random
import re
import shutil
import time
import uuid
import warnings

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, DistributedSampler

from dtrain_lab.resilience import checkpoint, faults, recovery
from dtrain_lab.data import regression_dataset
from dtrain_lab.i18n import LabError, catalogue
from forkjob import fork_launch


def _state(seed=0):
    g = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(7, 3, generator=g), "step": seed, "name": "x"}


# ------------------------------------------------------------------------------ file checkpoints
def test_save_load_roundtrip_and_name(tmp_path):
    s = _state(1)
    path = recovery.save(s, tmp_path, 3)
    assert path.name == "step_00000003.pt" and recovery.verify(path)
    got = recovery.load(path)
    assert torch.equal(got["w"], s["w"]) and got["step"] == 1 and got["name"] == "x"
    assert not list(tmp_path.glob(".*tmp*")), "temporary file left behind"


@pytest.mark.parametrize("damage", ["empty", "half", "no_last_byte", "payload_only", "flip_byte", "append"])
def test_latest_skips_damaged_newest(tmp_path, damage):
    recovery.save(_state(1), tmp_path, 1)
    good = recovery.save(_state(2), tmp_path, 2)
    bad = recovery.save(_state(3), tmp_path, 3)
    data = bad.read_bytes()
    payload_len = len(data) - recovery.FOOTER.size
    new = {"empty": b"", "half": data[: len(data) // 2], "no_last_byte": data[:-1],
           "payload_only": data[:payload_len],
           "flip_byte": data[:100] + bytes([data[100] ^ 0xFF]) + data[101:],
           "append": data + b"\0"}[damage]
    bad.write_bytes(new)
    from dtrain_lab import i18n

    before = i18n.get_lang()
    try:
        for lang in ("zh", "en"):
            i18n.set_lang(lang)
            with pytest.warns(RuntimeWarning, match="step_00000003.pt") as record:
                assert recovery.latest(tmp_path) == good
            # each half of the bilingual warning is in one language, the reason included
            first, second = str(record[0].message).split("\n")
            zh, en = (first, second) if lang == "zh" else (second, first)
            assert en.startswith("Skipping") and not re.search(r"[\u4e00-\u9fff]", en)
            reason_zh = zh[zh.index("（") + 1: zh.rindex("），")]
            assert zh.startswith("跳过") and re.search(r"[\u4e00-\u9fff]", reason_zh), zh
    finally:
        i18n.set_lang(before)
    with pytest.raises(recovery.CheckpointError):
        recovery.load(bad)
    assert torch.equal(recovery.load(good)["w"], _state(2)["w"])


def test_crash_between_temp_file_and_rename_keeps_old(tmp_path, monkeypatch):
    old = recovery.save(_state(1), tmp_path, 5)

    class Killed(BaseException):
        pass

    def die(where, step):
        assert where == "ckpt_rename" and step == 10
        raise Killed

    monkeypatch.setattr(checkpoint, "fault_point", die)   # the name save() calls
    with pytest.raises(Killed):
        recovery.save(_state(2), tmp_path, 10)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert "step_00000010.pt" not in names and any(n.startswith(".step_00000010.pt.tmp.") for n in names)
    with warnings.catch_warnings():
        warnings.simplefilter("error")      # a stray temp file is not even worth a warning
        assert recovery.latest(tmp_path) == old
    assert torch.equal(recovery.load(old)["w"], _state(1)["w"])


def test_keep_last_k_and_bad_arguments(tmp_path):
    for s in range(1, 6):
        recovery.save(_state(s), tmp_path, s * 10, keep=2)
    assert [st for st, _ in recovery.checkpoints(tmp_path)] == [40, 50]
    assert recovery.latest(tmp_path / "nothing_here") is None
    for bad in (-1, 1.5, "3", True):
        with pytest.raises(LabError):
            recovery.save(_state(), tmp_path, bad)
    with pytest.raises(LabError):
        recovery.save([1, 2], tmp_path, 1)
    with pytest.raises(LabError):
        recovery.save(_state(), tmp_path, 1, keep=0)
    with pytest.raises(recovery.CheckpointError, match="step_00000099"):
        recovery.load(tmp_path / "step_00000099.pt")


# ----------------------------------------------------------------------------------- data order
@pytest.mark.parametrize("n,replicas,rank,epoch,index", [(21, 2, 1, 3, 4), (20, 3, 0, 1, 0), (20, 3, 2, 0, 7)])
def test_resumable_sampler_continues_torch_order(n, replicas, rank, epoch, index):
    data = list(range(n))
    ref = DistributedSampler(data, num_replicas=replicas, rank=rank, shuffle=True, seed=5)
    ref.set_epoch(epoch)
    s = recovery.ResumableDistributedSampler(data, num_replicas=replicas, rank=rank, shuffle=True, seed=5)
    s.load_position(recovery.DataPosition(epoch, index))
    s.set_epoch(epoch)                       # same epoch: the resume index stays
    assert list(s) == list(ref)[index:] and len(s) == len(ref) - index
    s.set_epoch(epoch + 1)                   # next epoch: from its start
    ref.set_epoch(epoch + 1)
    assert list(s) == list(ref)
    with pytest.raises(LabError):
        s.load_position({"epoch": 0, "index": len(ref) + 1})


# ----------------------------------------------------------------------------------- exact resume
def _training(loader_generator=True):
    torch.manual_seed(3)
    random.seed(4)
    np.random.seed(5)
    g = torch.Generator().manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 2))
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=4, gamma=0.5)
    data = regression_dataset(n=30, d_in=6, d_out=2, seed=1)
    sampler = recovery.ResumableDistributedSampler(data, num_replicas=1, rank=0, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=4, sampler=sampler,
                        generator=torch.Generator() if loader_generator else None)
    return model, opt, sched, sampler, loader


def _train(parts, epochs, stop_at=None, step=0):
    model, opt, sched, sampler, loader = parts
    for epoch in range(sampler.epoch, epochs):
        sampler.set_epoch(epoch)
        for i, (x, y) in enumerate(loader):
            x = x * (1 + 0.1 * random.random()) + 0.1 * float(np.random.rand()) + 0.05 * torch.randn_like(x)
            opt.zero_grad()
            F.mse_loss(model(x), y).backward()
            opt.step()
            sched.step()
            step += 1
            if step == stop_at:
                return recovery.capture(model, opt, sched, sampler.position(i + 1, 4), step)
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def _resumed(tmp_path, drop=(), loader_generator=True, stop_at=6):
    state = _train(_training(loader_generator), 3, stop_at=stop_at)
    recovery.save(state, tmp_path, stop_at)
    loaded = recovery.load(recovery.latest(tmp_path))
    for key in drop:
        loaded[key] = None
    parts = _training(loader_generator)       # fresh objects; RNGs re-seeded (wrongly) at start
    torch.manual_seed(999)
    step, pos = recovery.restore(loaded, *parts[:3], sampler=parts[3])
    assert step == stop_at and pos == recovery.DataPosition((stop_at - 1) // 8, min(30, ((stop_at - 1) % 8 + 1) * 4))
    return _train(parts, 3, step=step)


@pytest.mark.parametrize("stop_at", [6, 8, 13])      # mid-epoch, at an epoch end, mid-epoch later
def test_resume_is_bit_identical(tmp_path, stop_at):
    ref = _train(_training(), 3)
    got = _resumed(tmp_path, stop_at=stop_at)
    assert torch.equal(got, ref), (got - ref).abs().max()


def test_resume_without_rng_or_with_default_loader_differs(tmp_path):
    """Controls: the test above can fail. Without the RNG states, or with a DataLoader that draws its
    base seed from the global RNG at every new iterator, the resumed run drifts."""
    ref = _train(_training(), 3)
    assert not torch.equal(_resumed(tmp_path / "a", drop=("rng",)), ref)
    ref_default = _train(_training(loader_generator=False), 3)
    assert not torch.equal(_resumed(tmp_path / "b", loader_generator=False), ref_default)


def test_restore_errors(tmp_path):
    model, opt, sched, sampler, _ = _training()
    state = recovery.capture(model, None, None, None, 0)
    with pytest.raises(LabError):
        recovery.restore(state, model, opt)              # no optimizer state saved
    with pytest.raises(LabError):
        recovery.restore({"w": 1}, model)
    with pytest.raises(LabError):
        recovery.capture(model, opt, sched, "epoch 3", 0)


# ---------------------------------------------------------------------------------- fault injection
class _Exit(BaseException):
    pass


def test_maybe_fail_env_and_once(tmp_path, monkeypatch):
    exits = []

    def fake_exit(code):
        exits.append(code)
        raise _Exit

    monkeypatch.setattr(faults.os, "_exit", fake_exit)
    once = tmp_path / "once"
    monkeypatch.setenv("DTRAIN_FAIL_AT_STEP", "3")
    monkeypatch.setenv("DTRAIN_FAIL_RANK", "1")
    monkeypatch.setenv("DTRAIN_FAIL_MODE", "exit")
    monkeypatch.setenv("DTRAIN_FAIL_CODE", "7")
    monkeypatch.setenv("DTRAIN_FAIL_ONCE_FILE", str(once))
    recovery.maybe_fail(3, rank=0)           # other rank
    recovery.maybe_fail(2, rank=1)           # other step
    assert exits == [] and not once.exists()
    with pytest.raises(_Exit):
        recovery.maybe_fail(3, rank=1)
    assert exits == [7] and once.exists()
    recovery.maybe_fail(3, rank=1)           # after the "restart": the once file stops it
    assert exits == [7]
    monkeypatch.setenv("DTRAIN_FAIL_MODE", "explode")
    with pytest.raises(LabError, match="explode"):
        recovery.maybe_fail(3, rank=1)
    monkeypatch.setenv("DTRAIN_FAIL_MODE", "exit")
    monkeypatch.setenv("DTRAIN_FAIL_AT_STEP", "three")
    with pytest.raises(LabError):
        recovery.maybe_fail(3, rank=1)
    monkeypatch.delenv("DTRAIN_FAIL_AT_STEP")
    recovery.maybe_fail(3, rank=1)           # no variables: nothing happens
    # two faults, each once: exit on rank 1 at step 2, exit on rank 0 at step 5 (code broadcast)
    monkeypatch.setenv("DTRAIN_FAIL_AT_STEP", "2;5")
    monkeypatch.setenv("DTRAIN_FAIL_RANK", "1;0")
    for step, rank in [(2, 1), (5, 0)]:
        with pytest.raises(_Exit):
            recovery.maybe_fail(step, rank=rank)
        recovery.maybe_fail(step, rank=rank)
    assert exits == [7, 7, 7] and sorted(p.name for p in tmp_path.iterdir()) == ["once", "once.0", "once.1"]
    monkeypatch.setenv("DTRAIN_FAIL_RANK", "1;0;1")
    with pytest.raises(LabError):
        recovery.maybe_fail(2, rank=1)


def test_ckpt_mode_fires_only_inside_save(tmp_path, monkeypatch):
    kills = []
    monkeypatch.setattr(faults.os, "kill", lambda pid, sig: (kills.append(sig), (_ for _ in ()).throw(_Exit())))
    monkeypatch.setenv("DTRAIN_FAIL_AT_STEP", "10")
    monkeypatch.setenv("DTRAIN_FAIL_MODE", "ckpt")
    monkeypatch.setenv("RANK", "0")
    recovery.maybe_fail(10, rank=0)          # a plain step: ckpt mode waits for the save
    recovery.save(_state(1), tmp_path, 5)    # before the step: no failure
    with pytest.raises(_Exit):
        recovery.save(_state(2), tmp_path, 10)
    assert len(kills) == 1 and recovery.latest(tmp_path).name == "step_00000005.pt"


# ------------------------------------------------------------------------------------ heartbeats
def test_heartbeats_and_watchdog(tmp_path):
    hb = tmp_path / "hb"
    recovery.heartbeat(hb, 5, rank=0)
    recovery.heartbeat(hb, 9, rank=1)
    beats = recovery.read_heartbeats(hb)
    assert {r: b["step"] for r, b in beats.items()} == {0: 5, 1: 9}
    now = time.time()
    assert recovery.stalled(hb, 2, 10.0, now=now) == []
    late = recovery.stalled(hb, 3, 10.0, now=now + 20, since=now - 30)
    assert [(x["rank"], x["step"]) for x in late] == [(0, 5), (1, 9), (2, None)]
    # what the watchdog reports, on a clock the test controls (a loaded machine cannot starve it)
    seen = []
    dog = recovery.Watchdog(hb, 2, stale_after=10.0, on_stall=seen.append)
    t0 = time.time()
    recovery.heartbeat(hb, 6, rank=0)
    assert dog.check(now=t0 + 5) == []                   # both fresh enough
    with open(hb / "hb.0", "r+") as f:                   # rank 0 keeps beating: its beat is always fresh
        info = json.load(f)
        info["time"] = t0 + 1e6
        f.seek(0), f.truncate(), json.dump(info, f)
    for dt in (20, 30, 40):                              # rank 1 is silent
        dog.check(now=t0 + dt)
    assert [(x["rank"], x["step"]) for x in seen] == [(1, 9)]     # named once, with its last step
    assert "rank 1" in seen[0]["message"] and "9" in seen[0]["message"]
    recovery.heartbeat(hb, 10, rank=1)                    # it moves on, then stalls again: a new stall
    dog.check(now=time.time() + 20)
    assert [(x["rank"], x["step"]) for x in seen] == [(1, 9), (1, 10)]
    # the thread: it checks by itself, every `interval`, and reports through on_stall
    seen_by_thread = []
    with recovery.Watchdog(hb, 2, stale_after=0.2, interval=0.05, on_stall=seen_by_thread.append):
        deadline = time.monotonic() + 60
        while not seen_by_thread and time.monotonic() < deadline:
            time.sleep(0.05)
    assert [(x["rank"], x["step"]) for x in seen_by_thread] == [(1, 10)]
    with pytest.raises(LabError):
        recovery.Watchdog(hb, 2, stale_after=0)


def test_messages_bilingual():
    keys = [k for k in catalogue() if k.startswith("rec_")]
    assert len(keys) >= 15
    for k in keys:
        assert catalogue()[k]["en"] and catalogue()[k]["zh"], k


# ------------------------------------------------------------------------------- DCP 2 -> 3 ranks
@pytest.fixture(scope="module")
def dcp_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("dcp")
    env = {"DTRAIN_TEST_TAG": uuid.uuid4().hex, "DTRAIN_PG_TIMEOUT": "30",
           "DTRAIN_FAIL_AT_STEP": "4", "DTRAIN_FAIL_RANK": "1", "DTRAIN_FAIL_MODE": "stall",
           "DTRAIN_FAIL_STALL_S": "2.5", "DTRAIN_TEST_STALE": "1.0"}
    saved = fork_launch("dtrain_lab.demos.recovery_dcp", nproc=2, args=["save", root], timeout=90,
                        quiet=True, env=env)
    loaded = None
    if saved.ok:
        loaded = fork_launch("dtrain_lab.demos.recovery_dcp", nproc=3, args=["load", root], timeout=90,
                             quiet=True, env={"DTRAIN_TEST_TAG": env["DTRAIN_TEST_TAG"]})
    return root, saved, loaded


def _ok(r):
    assert r is not None and r.ok, (r.summary() + "\n" + "\n".join(x.output[-2000:] for x in r.ranks)) if r else "not run"


FULL = torch.arange(30, dtype=torch.float32).reshape(10, 3)


@pytest.mark.timeout(300)
def test_dcp_saved_by_2_loaded_by_3(dcp_runs):
    root, saved, loaded = dcp_runs
    _ok(saved)
    _ok(loaded)
    for rank, local in enumerate(saved.gathered("local")):
        assert torch.equal(torch.tensor(local), FULL.chunk(2)[rank])
    for rank, local in enumerate(loaded.gathered("local")):      # 4 + 4 + 2 rows
        assert torch.equal(torch.tensor(local), FULL.chunk(3)[rank])
    for m in loaded.metrics.values():
        assert torch.equal(torch.tensor(m["full"]), FULL)
        assert torch.equal(torch.tensor(m["vec"]), torch.linspace(0, 1, 5))
        assert m["step"] == 7 and m["loaded"] == "step_00000007"
    folder = root / "step_00000007"
    info = json.loads((folder / "COMMIT").read_text())
    assert info["world_size"] == 2 and ".metadata" in info["files"]
    assert sum(n.endswith(".distcp") for n in info["files"]) == 2      # one shard file per rank


@pytest.mark.timeout(300)
def test_dcp_uncommitted_or_damaged_is_not_loaded(dcp_runs, tmp_path):
    root, saved, _ = dcp_runs
    _ok(saved)
    src = root / "step_00000007"
    good = tmp_path / "step_00000007"
    shutil.copytree(src, good)
    assert recovery.dcp_committed(good)
    uncommitted = tmp_path / "step_00000008"               # newer, but its COMMIT never came
    shutil.copytree(src, uncommitted)
    (uncommitted / "COMMIT").unlink()
    damaged = tmp_path / "step_00000009"                   # newer, committed, one shard corrupted
    shutil.copytree(src, damaged)
    shard = next(p for p in damaged.iterdir() if p.name.endswith(".distcp"))
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    assert not recovery.dcp_committed(uncommitted) and not recovery.dcp_committed(damaged)
    with pytest.warns(RuntimeWarning) as record:
        assert recovery.dcp_latest(tmp_path) == good
    text = " ".join(str(w.message) for w in record)
    assert "step_00000009" in text and "step_00000008" in text
    with pytest.raises(recovery.CheckpointError):
        recovery.dcp_load({}, uncommitted)


@pytest.mark.timeout(300)
def test_watchdog_names_the_stalled_rank(dcp_runs):
    _, saved, _ = dcp_runs
    _ok(saved)
    reports = saved.metrics[0]["watchdog"]
    assert [(r["rank"], r["step"]) for r in reports] == [(1, 3)], reports
    assert reports[0]["age"] > 1.0
    msg = reports[0]["message"]
    assert "rank 1" in msg and "3" in msg and "看门狗" in msg and "watchdog" in msg


def test_on_fault_is_told_before_a_fault_fires(tmp_path, monkeypatch):
    """faults.on_fault (lesson 09 records which rank died where): called once per fired fault, before it fires."""
    told, exits = [], []

    def fake_exit(code):
        exits.append((code, len(told)))
        raise _Exit

    monkeypatch.setattr(faults.os, "_exit", fake_exit)
    monkeypatch.setattr(faults, "on_fault", told.append)
    monkeypatch.setenv("DTRAIN_FAIL_AT_STEP", "3")
    monkeypatch.setenv("DTRAIN_FAIL_RANK", "1")
    monkeypatch.setenv("DTRAIN_FAIL_MODE", "exit")
    monkeypatch.setenv("DTRAIN_FAIL_ONCE_FILE", str(tmp_path / "once"))
    recovery.maybe_fail(3, rank=0)
    assert told == []
    with pytest.raises(_Exit):
        recovery.maybe_fail(3, rank=1)
    assert told == [{"mode": "exit", "rank": 1, "step": 3, "where": "step"}] and exits == [(13, 1)]
