"""dtrain_lab.parallel.pipeline: GPipe and 1F1B schedules, their checker and simulator, and the executor.

In-process: every schedule for p = 1…6 stages and m = 1…9 micro-batches is valid, holds the expected
number of micro-batches in flight and has the bubble of the formula; broken schedules are caught
(deadlock, B before F, missing/duplicated actions, out-of-order messages); the executor on one
stage equals plain training. Multi-process (two launches of ``dtrain_lab.demos.pp_run``: 2 ranks with
m = 3, 4, and 4 ranks with m = 5 plus the ``ParallelDims`` meshes and DP × PP training): pipelined
training, ours and ``torch.distributed.pipelining``'s,
ends with the same parameters as one process training the whole model on the whole batches; the
executor really keeps min(p-s, m) (1F1B) or m (GPipe) micro-batches' activations; its recorded
timelines respect the data dependencies across processes. No timing is asserted.
"""
import copy
import uuid

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from dtrain_lab.i18n import LabError, set_lang, get_lang
from dtrain_lab.models import MLP
from dtrain_lab.parallel.pipeline import (Action, PipelineError, PipelineStage, bubble_fraction, idle_fraction,
                                 peak_in_flight, run_schedule, schedule, simulate_timeline, split_sequential,
                                 train_step, validate)
from conftest import job_metrics
from forkjob import fork_launch

TOL = 1e-6
PAIRS = [(p, m) for p in range(1, 7) for m in range(1, 10)]
A = Action


# ------------------------------------------------------------------------------------ schedules
@pytest.mark.parametrize("kind", ["gpipe", "1f1b"])
def test_every_schedule_is_valid(kind):
    for p, m in PAIRS:
        sched = schedule(kind, p, m)
        assert len(sched) == p
        assert validate(sched, p, m) == [], (kind, p, m)
        for s, acts in enumerate(sched):
            assert sorted(acts) == sorted([A("F", i) for i in range(m)] + [A("B", i) for i in range(m)])
            expected = m if kind == "gpipe" else min(p - s, m)
            assert peak_in_flight(acts) == expected, (kind, p, m, s)


def test_1f1b_shape():
    # stage s: min(p-s-1, m) warm-up forwards, then F/B pairs, then the cool-down backwards
    sched = schedule("1f1b", 4, 6)
    assert [str(a) for a in sched[0]] == "F0 F1 F2 F3 B0 F4 B1 F5 B2 B3 B4 B5".split()
    assert [str(a) for a in sched[3]] == "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5".split()
    assert [str(a) for a in schedule("1f1b", 4, 2)[0]] == "F0 F1 B0 B1".split()
    assert [str(a) for a in schedule("gpipe", 2, 2)[1]] == "F0 F1 B0 B1".split()


@pytest.mark.parametrize("kind", ["gpipe", "1f1b"])
def test_simulated_idle_equals_bubble_formula(kind):
    for p, m in PAIRS:
        for t_f, t_b in ((1.0, 2.0), (1.0, 1.0), ([0.5] * p, [1.5] * p)):
            tl = simulate_timeline(schedule(kind, p, m), t_f, t_b)
            assert idle_fraction(tl) == pytest.approx(bubble_fraction(p, m), abs=1e-12), (kind, p, m)
            tf = t_f if isinstance(t_f, float) else t_f[0]
            tb = t_b if isinstance(t_b, float) else t_b[0]
            assert max(e for st in tl for _, e, _ in st) == pytest.approx((m + p - 1) * (tf + tb))


def test_simulated_timeline_respects_dependencies():
    tl = simulate_timeline(schedule("1f1b", 4, 6), 1, 2)
    end = {(s, a.kind, a.microbatch): e for s, st in enumerate(tl) for _, e, a in st}
    start = {(s, a.kind, a.microbatch): b for s, st in enumerate(tl) for b, _, a in st}
    for s in range(4):
        for i in range(6):
            if s > 0:
                assert start[(s, "F", i)] >= end[(s - 1, "F", i)]
            if s < 3:
                assert start[(s, "B", i)] >= end[(s + 1, "B", i)]
        spans = sorted((b, e) for b, e, _ in tl[s])
        assert all(spans[k][1] <= spans[k + 1][0] for k in range(len(spans) - 1))   # one thing at a time
    # a message that takes time costs 1F1B more than GPipe (its steady state waits for each message)
    late = {k: idle_fraction(simulate_timeline(schedule(k, 2, 8), 1, 2, t_comm=0.3)) for k in ("gpipe", "1f1b")}
    assert bubble_fraction(2, 8) < late["gpipe"] < late["1f1b"]


def test_deadlock_detected():
    # stage 0 waits for B0's gradient before sending F1; stage 1 waits for F1 before doing B0
    bad = [[A("F", 0), A("B", 0), A("F", 1), A("B", 1)], [A("F", 0), A("F", 1), A("B", 0), A("B", 1)]]
    problems = validate(bad, 2, 2)
    assert len(problems) == 1 and ("Deadlock" in problems[0] or "死锁" in problems[0])
    assert "B0" in problems[0] and "F1" in problems[0]
    with pytest.raises(PipelineError) as e:
        validate(bad, 2, 2, strict=True)
    assert "Deadlock" in str(e.value) and "死锁" in str(e.value)
    with pytest.raises(PipelineError):
        simulate_timeline(bad)


def test_blocking_sends_deadlock_1f1b_not_gpipe():
    for p, m in PAIRS:
        assert validate(schedule("gpipe", p, m), p, m, blocking_sends=True) == []
        dead = validate(schedule("1f1b", p, m), p, m, blocking_sends=True)
        assert bool(dead) == (p > 1 and m > 1), (p, m)


def test_broken_schedules_detected():
    good = schedule("gpipe", 2, 2)
    lang = get_lang()
    set_lang("en")
    try:
        b_first = [[A("B", 0), A("F", 0)], [A("F", 0), A("B", 0)]]
        assert any("B0 before F0" in x for x in validate(b_first, 2, 1))
        missing = [good[0][:-1], good[1]]
        assert any("never runs B1" in x for x in validate(missing, 2, 2))
        dup = [good[0] + [A("F", 1)], good[1]]
        assert any("F1 twice" in x for x in validate(dup, 2, 2))
        order = [good[0], [A("F", 1), A("F", 0), A("B", 0), A("B", 1)]]
        assert any("Out of order" in x for x in validate(order, 2, 2))
        assert any("stage lists" in x for x in validate(good, 3, 2))
        assert any("not an action" in x for x in validate([good[0], good[1] + [A("F", 7)]], 2, 2))
        set_lang("zh")
        assert any("之前执行了 B0" in x for x in validate(b_first, 2, 1))
    finally:
        set_lang(lang)


def test_bad_arguments_are_clear_errors():
    for call in (lambda: schedule("zigzag", 2, 2), lambda: schedule("gpipe", 0, 2),
                 lambda: schedule("1f1b", 2, 1.5), lambda: bubble_fraction(2, 0),
                 lambda: simulate_timeline(schedule("gpipe", 2, 2), t_f=[1.0]),
                 lambda: split_sequential(MLP(depth=1), 3), lambda: split_sequential(nn.Linear(2, 2), 1),
                 lambda: PipelineStage(nn.Linear(2, 2), 2, 2), lambda: PipelineStage(nn.Linear(2, 2), 0, 2)):
        with pytest.raises(LabError) as e:
            call()
        assert "\n" in str(e.value)          # both languages
    assert bubble_fraction(4, 12) == pytest.approx(3 / 15)


# ------------------------------------------------------------------------------------ executor, one process
def test_split_sequential():
    model = MLP(16, 32, 4, depth=3, seed=0)
    for p in (1, 2, 3, 4):
        parts = split_sequential(model, p)
        assert len(parts) == p
        flat = [q for part in parts for q in part.parameters()]
        assert [id(q) for q in flat] == [id(q) for q in model.parameters()]
        x = torch.randn(5, 16)
        y = x
        for part in parts:
            y = part(y)
        assert torch.equal(y, model(x))
    assert [len(p) for p in split_sequential(model, 3)] == [4, 2, 1]   # ReLU stays with its Linear


@pytest.mark.parametrize("kind", ["gpipe", "1f1b"])
@pytest.mark.parametrize("rows,m", [(12, 3), (10, 3), (7, 7)])
def test_one_stage_equals_plain_training(kind, rows, m):
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randn(rows, 16, generator=gen), torch.randn(rows, 4, generator=gen)
    ref = MLP(16, 32, 4, depth=3, seed=0)
    ours = copy.deepcopy(ref)
    opt_r, opt_o = torch.optim.SGD(ref.parameters(), lr=0.1), torch.optim.SGD(ours.parameters(), lr=0.1)
    stage = PipelineStage(ours.layers, 0, 1)
    for _ in range(2):
        opt_r.zero_grad()
        F.mse_loss(ref(x), y).backward()
        opt_r.step()
        stats = train_step(stage, schedule(kind, 1, m)[0], list(x.tensor_split(m)), list(y.tensor_split(m)),
                           F.mse_loss, opt_o)
    for a, b in zip(ref.parameters(), ours.parameters()):
        assert torch.allclose(a, b, atol=TOL), (a - b).abs().max()
    assert stats["peak_in_flight"] == (m if kind == "gpipe" else 1)
    assert len(stats["losses"]) == m and len(stats["timeline"]) == 2 * m
    if kind == "1f1b":
        assert stats["peak_activation_bytes"] == max(stats["activation_bytes"])
    else:
        assert stats["peak_activation_bytes"] == sum(stats["activation_bytes"])
    # 4 rows of 16 inputs, 3 ReLU outputs of 32, the prediction and the target of 4 (fp32)
    if rows == 12:
        assert stats["activation_bytes"] == [4 * 4 * (16 + 3 * 32 + 4 + 4)] * m


def test_executor_rejects_bad_actions():
    stage = PipelineStage(nn.Sequential(nn.Linear(2, 2)), 0, 1)
    x = [torch.zeros(1, 2)]
    with pytest.raises(PipelineError):
        run_schedule(stage, [A("B", 0), A("F", 0)], x, x, F.mse_loss)
    with pytest.raises(LabError):
        run_schedule(stage, [A("F", 0), A("B", 0)], None, x, F.mse_loss)


# ------------------------------------------------------------------------------------ multi-process
LAUNCHES = {2: ["train", "3,4"], 4: ["train,dims", "5"]}


@pytest.fixture(scope="module")
def results():

    return {n: fork_launch("dtrain_lab.demos.pp_run", nproc=n, args=args, timeout=240, quiet=True,
                           env={"DTRAIN_TEST_TAG": uuid.uuid4().hex})
            for n, args in LAUNCHES.items()}


def metrics(results, n):
    return job_metrics(results[n], n, last=False)


def _maxdiff(a, b):
    assert len(a) == len(b) and len(a) > 0
    return max(abs(u - v) for u, v in zip(a, b))


@pytest.mark.timeout(400)
@pytest.mark.parametrize("n", sorted(LAUNCHES))
def test_pipelined_equals_unpipelined_and_torch(results, n):
    ms = [int(v) for v in LAUNCHES[n][1].split(",")]
    for rank, m in metrics(results, n).items():
        runs = m["train"]
        assert sorted(runs) == sorted([f"{k}_m{i}" for k in ("gpipe", "1f1b") for i in ms] + ["gpipe_unequal"])
        for name, r in runs.items():
            assert _maxdiff(r["params"], r["reference"]) < TOL, (rank, name)
            if "torch" in r:
                assert _maxdiff(r["params"], r["torch"]) < TOL, (rank, name)
        assert all("torch" in runs[f"{k}_m{i}"] for k in ("gpipe", "1f1b") for i in ms)   # every m >= p here
        # the training moved the parameters (a test that cannot pass by doing nothing)
        first = runs[f"gpipe_m{ms[0]}"]
        assert _maxdiff(first["params"], runs["gpipe_unequal"]["params"]) > 1e-4


@pytest.mark.timeout(400)
@pytest.mark.parametrize("n", sorted(LAUNCHES))
def test_peak_activations_measured(results, n):
    for s, m in metrics(results, n).items():
        for name, r in m["train"].items():
            if name == "gpipe_unequal":
                assert r["peak_in_flight"] == 3
                assert r["peak_activation_bytes"] == sum(r["activation_bytes"])
                sizes = r["activation_bytes"]
                assert sizes[0] > sizes[1] == sizes[2]       # 4, 3 and 3 rows
                continue
            kind, mb = name.split("_m")
            mb = int(mb)
            expected = mb if kind == "gpipe" else min(n - s, mb)
            assert r["peak_in_flight"] == expected, (s, name)
            per_mb = r["activation_bytes"]
            assert len(set(per_mb)) == 1 and per_mb[0] > 0
            assert r["peak_activation_bytes"] == expected * per_mb[0]
        ratio = m["train"][f"1f1b_m{mb}"]["peak_activation_bytes"] / m["train"][f"gpipe_m{mb}"]["peak_activation_bytes"]
        assert ratio == pytest.approx(min(n - s, mb) / mb)


@pytest.mark.timeout(400)
@pytest.mark.parametrize("n", sorted(LAUNCHES))
def test_measured_timelines_respect_dependencies(results, n):
    ms = metrics(results, n)
    for name in ms[0]["train"]:
        tl = [ms[s]["train"][name]["timeline"] for s in range(n)]
        start = {(s, a[0], a[1]): b for s in range(n) for b, _, a in tl[s]}
        end = {(s, a[0], a[1]): e for s in range(n) for _, e, a in tl[s]}
        mb = 1 + max(k[2] for k in start)
        for s in range(n):
            assert [tuple(a) for _, _, a in tl[s]] == [tuple(a) for a in schedule(
                "1f1b" if name.startswith("1f1b") else "gpipe", n, mb)[s]]
            for i in range(mb):
                if s > 0:
                    assert start[(s, "F", i)] >= end[(s - 1, "F", i)], (name, s, i)
                if s < n - 1:
                    assert start[(s, "B", i)] >= end[(s + 1, "B", i)], (name, s, i)
        assert 0 < idle_fraction(tl) < 1


# ------------------------------------------------------------------------------------ ParallelDims mesh (4 ranks)
@pytest.mark.timeout(400)
def test_device_mesh_matches_grid(results):
    from dtrain_lab.parallel.dims import MESH_DIMS, ParallelDims

    for rank, m in metrics(results, 4).items():
        for key, shape in (("221", (2, 2, 1)), ("122", (1, 2, 2))):
            dims = ParallelDims(dp=shape[1], tp=shape[2], pp=shape[0], world_size=4)
            got = m["dims"][key]
            assert got["coordinate"] == list(dims.coordinate(rank).values())
            for dim in MESH_DIMS:
                group = next(g for g in dims.groups(dim) if rank in g)
                assert got["groups"][dim] == group, (rank, key, dim)


@pytest.mark.timeout(400)
def test_dp_times_pp_equals_one_process(results):
    seen = set()
    for rank, m in metrics(results, 4).items():
        r = m["dims"]["dp_pp"]
        seen.add((r["stage"], r["dp_rank"]))
        assert len(r["params"]) == len(r["reference"]) > 0
        assert max(abs(a - b) for a, b in zip(r["params"], r["reference"])) < 1e-6, rank
    assert seen == {(0, 0), (0, 1), (1, 0), (1, 1)}


# ------------------------------------------------------------------------------------ plots
def test_timeline_plot_and_widget():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from dtrain_lab import viz

    tl = simulate_timeline(schedule("1f1b", 3, 4), 1, 2)
    ax = viz.pipeline_timeline(tl, title="1F1B")
    assert len(ax.collections) == 3 * 2 * 4            # one bar per action
    assert f"{bubble_fraction(3, 4):.1%}" in ax.get_title()
    # a measured timeline comes back from JSON as lists
    as_json = [[[b, e, [a.kind, a.microbatch]] for b, e, a in st] for st in tl]
    assert len(viz.pipeline_timeline(as_json).collections) == 24
    box = viz.pipeline_widget(3, 4, "gpipe")
    box.children[0].children[1].value = 6                 # the m slider
    plt.close("all")
