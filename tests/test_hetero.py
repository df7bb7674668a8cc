"""dtrain_lab.parallel.hetero: uneven batch shares for mixed GPUs, and gradients weighted by sample counts.

One launch (gloo, 2 ranks with 3 and 5 samples) checks every weighting against one process on the
whole batch; the planner is tested in-process.
"""
import uuid

import pytest
import torch

from dtrain_lab.parallel import hetero
from dtrain_lab.i18n import LabError
from forkjob import fork_launch


@pytest.fixture(scope="module")
def run():
    r = fork_launch("dtrain_lab.demos.multinode_hetero", nproc=2, args=["--counts", "3,5"],
                    timeout=90, quiet=True, env={"DTRAIN_TEST_TAG": uuid.uuid4().hex})
    assert r.ok, r.summary() + "\n" + "\n".join(x.output[-3000:] for x in r.ranks)
    return r


@pytest.mark.timeout(300)
def test_weighted_gradients_equal_the_large_batch_step(run):
    assert run.gathered("samples") == [3, 5]
    assert run.gathered("n_global") == [8, 8]
    assert run.gathered("scale") == [2 / 8, 2 / 8]
    for m in run.metrics.values():
        # float32 rounding of sums taken in another order (measured ~5e-7 on a gradient of norm ~7)
        assert m["ddp_scaled"]["grad"] < 1e-5
        assert m["ddp_scaled"]["params"] < 1e-6
        assert m["ddp_scaled_accum"]["grad"] < 1e-5
        assert m["manual_weighted"]["grad"] < 1e-5
    # ranks took different numbers of accumulation steps, and it still matched
    assert [m["ddp_scaled_accum"]["micro_sizes"] for m in run.metrics.values()] == [[2, 1], [2, 2, 1]]


@pytest.mark.timeout(300)
def test_naive_averaging_is_the_mean_of_means(run):
    for m in run.metrics.values():
        # clearly different from the global-batch gradient ...
        assert m["naive"]["vs_global_mean"] > 1e-3 * m["grad_norm_ref"]
        # ... and exactly what one process gets by averaging the two per-rank mean losses
        assert m["naive"]["vs_mean_of_means"] < 1e-5
        assert m["naive_spread"] == 0.0


def test_plan_proportional_to_throughput():
    p = hetero.plan(64, throughputs=[300, 300, 100, 100], max_micro=[16, 16, 8, 8])
    assert [(r.samples, r.micro_batch, r.accum_steps) for r in p.ranks] == [(24, 12, 2), (24, 12, 2),
                                                                          (8, 8, 1), (8, 8, 1)]
    assert sum(p.samples) == 64
    assert p.weights == [24 / 64, 24 / 64, 8 / 64, 8 / 64]
    # the uneven split finishes sooner than an even one (the slow ranks no longer set the pace)
    assert p.step_seconds == pytest.approx(24 / 300)
    assert p.even_step_seconds == pytest.approx(16 / 100)
    assert "micro" in p.table("en") and "0.08 s" in p.table("en") and "(2.00×)" in p.table("en")
    assert "平均切分 0.16 s" in p.table("zh")


@pytest.mark.parametrize("global_batch,tp,mm", [
    (7, [1.0, 1.0, 1.0], None), (100, [3.3, 1.1, 7.7], [5, 3, 40]), (5, [1000, 1, 1, 1, 1], [1] * 5),
    (33, None, [8, 4]), (1000, [1.5, 2.5], [7, 11])])
def test_plan_invariants(global_batch, tp, mm):
    p = hetero.plan(global_batch, throughputs=tp, max_micro=mm)
    assert sum(p.samples) == global_batch
    speeds = tp if tp is not None else mm
    for r in p.ranks:
        assert r.samples >= 1
        assert sum(r.micro_sizes) == r.samples and len(r.micro_sizes) == r.accum_steps
        assert max(r.micro_sizes) - min(r.micro_sizes) <= r.micro_batch - 1
        if mm is not None:
            assert r.micro_batch <= mm[r.rank]
            assert r.accum_steps == -(-r.samples // mm[r.rank])       # the fewest steps that fit
        # within one sample of the exact proportional share (every rank gets at least one)
        exact = (global_batch - len(speeds)) * speeds[r.rank] / sum(speeds) + 1
        assert abs(r.samples - exact) < 1 + 1e-9


def test_plan_rejects_bad_input_clearly():
    cases = [((0, [1.0]), "global_batch"), ((8, None, None), "rank"), ((8, [1.0, -2.0]), "throughputs[1]"),
             ((8, [1.0, 1.0], [4]), "max_micro"), ((1, [1.0, 1.0]), "global_batch=1"),
             ((8, None, [4, 2.5]), "max_micro[1]"), ((8, [1.0, float("nan")]), "throughputs[1]")]
    for args, needle in cases:
        with pytest.raises(LabError) as e:
            hetero.plan(*args)
        assert needle in str(e.value), (args, str(e.value))
        assert "\n" in str(e.value)      # both languages


def test_loss_scale_and_weighted_grads_in_one_process():
    assert hetero.loss_scale(3, 8, 2) == 2 / 8
    assert hetero.loss_scale(3, 8, 2, average=False) == 1 / 8
    for bad in [(9, 8, 2), (-1, 8, 2), (3, 0, 2), (3, 8, 0)]:
        with pytest.raises(LabError):
            hetero.loss_scale(*bad)
    # a world of one: the weighted all-reduce leaves the mean-loss gradient as it is
    lin = torch.nn.Linear(3, 1)
    x = torch.randn(5, 3)
    torch.nn.functional.mse_loss(lin(x), torch.zeros(5, 1)).backward()
    before = lin.weight.grad.clone()
    assert hetero.weighted_allreduce_grads(lin.parameters(), 5) == 5
    assert torch.equal(lin.weight.grad, before)
    assert hetero.global_count(4) == 4
