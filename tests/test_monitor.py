"""dtrain_lab.jobs.monitor: the step-time split, the straggler, throughput and a profiler trace.

One launch (2 ranks, gloo) of dtrain_lab.demos.monitor_run with rank 1 made slower on purpose; the
split is checked against an independent wall clock around the loop, the trained parameters against
one process on the concatenated batches, the trace against the steps that were traced. The rest runs
in this process (nesting arithmetic with sleeps, misuse errors, the rank-0-only progress bar).
"""
import io
import json
import os

import pytest
import torch
import torch.nn.functional as F

from conftest import assert_no_survivors, new_tag
from dtrain_lab.jobs import monitor
from dtrain_lab.i18n import LANGS, LabError
from dtrain_lab.jobs.launch import launch

# DELAY: rank 1's extra sleep per step, large against what a loaded machine adds to a tiny step
STEPS, WARMUP, BATCH, DELAY, SLOW, TRACE_STEPS = 12, 2, 8, 0.2, 1, 2


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    tag = new_tag()
    trace_dir = tmp_path_factory.mktemp("traces")
    r = launch("dtrain_lab.demos.monitor_run", nproc=2, timeout=90, quiet=True,
               env={"DTRAIN_TEST_TAG": tag},
               args=["--steps", STEPS, "--warmup", WARMUP, "--batch", BATCH, "--slow-rank", SLOW,
                     "--delay", DELAY, "--trace-dir", str(trace_dir), "--trace-steps", TRACE_STEPS])
    assert_no_survivors(tag)
    assert r.ok, r.summary()
    return r


def test_split_covers_the_step_measured_by_another_clock(job):
    for m in job.gathered("summary"):
        assert m["steps"] == STEPS and m["clock"] == "perf_counter"
        t = m["total"]
        phases = sum(t[p] for p in monitor.PHASES)
        # the four phases account for (nearly) all of the step time ...
        assert phases <= t["step"] + 1e-9
        assert phases >= 0.9 * t["step"], t
        assert abs(phases + t["other"] - t["step"]) < 1e-6
    for m, loop_s in zip(job.gathered("summary"), job.gathered("loop_s")):
        # ... and the steps add up to the loop's own wall clock (only loop overhead in between)
        assert m["total"]["step"] <= loop_s
        assert m["total"]["step"] >= 0.85 * loop_s - 0.01, (m["total"]["step"], loop_s)


def test_slow_rank_is_named_and_the_fast_one_waits(job):
    rows = job.metrics[0]["rows"]
    assert job.metrics[0]["slowest"] == SLOW
    assert "slowest" not in job.metrics[1]                     # the table lives on rank 0 only
    assert [r["steps"] for r in rows] == [STEPS, STEPS]
    slow, fast = rows[SLOW]["mean"], rows[1 - SLOW]["mean"]
    assert slow["compute"] >= DELAY                             # the sleep is inside its compute
    assert fast["compute"] < slow["compute"] - 0.5 * DELAY
    # synchronous all-reduce: the fast rank spends the difference waiting in comm
    assert fast["comm"] > slow["comm"] + 0.5 * DELAY
    assert rows[SLOW]["busy"] > rows[1 - SLOW]["busy"] + 0.5 * DELAY
    # ... so both steps last about as long
    assert abs(slow["step"] - fast["step"]) < 0.5 * DELAY
    # the report holds data, no per-language text; the table renders from it in every language
    assert not [k for m in job.metrics.values() for k in m if k.endswith(("_en", "_zh"))]
    for lang in LANGS:
        shown = monitor.RankTable(rows).table(lang)
        assert f"rank {SLOW}" in shown and shown.count("\n") == len(rows) + 2, (lang, shown)


def test_throughput_matches_the_step_count(job):
    for m in job.gathered("summary"):
        assert m["samples"] == STEPS * BATCH and m["tokens"] == STEPS * BATCH * 16
        assert m["samples_per_s"] == pytest.approx(STEPS * BATCH / m["total"]["step"])
        assert m["tokens_per_s"] == pytest.approx(16 * m["samples_per_s"])
    for m, loop_s in zip(job.gathered("summary"), job.gathered("loop_s")):
        assert STEPS * BATCH / loop_s <= m["samples_per_s"] <= 1.2 * STEPS * BATCH / loop_s + 1


def test_training_is_still_ddp(job):
    # the timing hook all-reduced one bucket per step, and the replicas equal one process on all batches
    assert job.gathered("hook_calls") == [STEPS + WARMUP] * 2
    a, b = job.gathered("checksum")
    assert a == b
    from dtrain_lab.demos.monitor_run import _model
    ref = _model()
    opt = torch.optim.SGD(ref.parameters(), lr=0.05)
    gens = [torch.Generator().manual_seed(100 + r) for r in range(2)]
    for _ in range(STEPS + WARMUP):
        xs = [torch.randn(BATCH, 16, generator=g) for g in gens]
        x = torch.cat(xs)
        F.mse_loss(ref(x), x[:, :4] * 2.0).backward()
        opt.step()
        opt.zero_grad()
    assert a == pytest.approx(float(torch.cat([p.detach().reshape(-1) for p in ref.parameters()]).double().sum()),
                              abs=1e-4)


def test_trace_files_hold_the_collectives(job):
    for r, (path, facts) in enumerate(zip(job.gathered("trace"), job.gathered("trace_facts"))):
        assert os.path.basename(path) == f"rank{r}.json" and os.path.getsize(path) == facts["bytes"]
        with open(path) as f:
            events = json.load(f)["traceEvents"]
        names = [e.get("name", "") for e in events if e.get("ph") == "X"]
        # one bucket per step: one all-reduce per traced step, seen by the dispatcher and by gloo
        assert names.count("c10d::allreduce_") == TRACE_STEPS
        assert names.count("gloo:all_reduce") == TRACE_STEPS
        assert facts["collective_events"] >= 2 * TRACE_STEPS and facts["c10d_calls"] >= TRACE_STEPS
        assert facts["step_spans"] == TRACE_STEPS
    for mem in job.gathered("memory"):
        assert mem["tensor_mib"] == pytest.approx((16 * 32 + 32 + 32 * 4 + 4) * 4 / 2**20)
        assert mem["rss_mib"] is None or mem["rss_mib"] > 10


# ------------------------------------------------------------------------------ in this process
class FakeClock:
    """A clock the test advances by hand: the arithmetic is checked exactly, whatever the load."""

    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_nested_phases_are_exclusive():
    clock = FakeClock()
    t = monitor.StepTimer(clock=clock)
    for _ in range(2):
        t.start_step()
        clock.sleep(0.004)                  # outside every phase: "other"
        with t.phase("compute"):
            clock.sleep(0.03)
            with t.phase("comm"):
                clock.sleep(0.02)
            t.add("comm", 0.005)        # measured elsewhere (a callback) during compute
        s = t.end_step(samples=4)
        assert s["step"] == pytest.approx(0.054, abs=1e-12) and s["other"] == pytest.approx(0.004, abs=1e-12)
        assert s["comm"] == pytest.approx(0.025, abs=1e-12)              # nested 0.02 + added 0.005
        assert s["compute"] == pytest.approx(0.025, abs=1e-12)           # its own 0.03 minus the added comm
        assert s["compute"] + s["comm"] == pytest.approx(s["step"] - s["other"], abs=1e-12)
    summ = t.summary()
    assert summ["steps"] == 2 and summ["samples"] == 8
    assert summ["busy"] == pytest.approx((summ["total"]["step"] - summ["total"]["comm"]) / 2)
    assert "compute" in monitor.format_split(summ, "en") and "每步" in monitor.format_split(summ, "zh")


def test_misuse_gives_clear_errors():
    t = monitor.StepTimer()
    with pytest.raises(LabError, match="start_step"):
        with t.phase("data"):
            pass
    with pytest.raises(LabError):
        t.end_step()
    t.start_step()
    with pytest.raises(LabError):
        t.start_step()
    with pytest.raises(LabError):
        t.summary()
    with pytest.raises(LabError):
        monitor.trace_facts("/nonexistent/trace.json")
    with pytest.raises(LabError):
        monitor.profile_step(lambda i: None, "/tmp/x.json", steps=0)


def test_progress_prints_on_rank_0_only():
    out = io.StringIO()
    assert list(monitor.progress(range(20), desc="go", rank=0, plain=True, file=out)) == list(range(20))
    lines = out.getvalue().splitlines()
    assert len(lines) == 10 and lines[-1].startswith("go 20/20")
    quiet = io.StringIO()
    assert list(monitor.progress(range(20), rank=1, file=quiet)) == list(range(20))
    assert quiet.getvalue() == ""


def test_profile_step_without_collectives(tmp_path):
    path = monitor.profile_step(lambda i: torch.ones(8).sum(), str(tmp_path / "t.json"), steps=3)
    facts = monitor.trace_facts(path)
    assert facts["step_spans"] == 3 and facts["collective_events"] == 0 and facts["events"] > 3
