"""dtrain_lab.parallel.model: a model cut into consecutive parts, one per rank, trains exactly like
the unsplit model; activations (not gradients) cross the ranks.

One launch at world size 2 (dtrain_lab.demos.mp_run); every rank also trains the unsplit model alone
on the same batches and compares its part with the same layers. In-process tests cover partitioning,
the multi-device version on the CPU and the errors.
"""
import pytest
import torch
import torch.nn as nn
from forkjob import fork_launch

STEPS, D_HIDDEN, BATCH = 5, 32, 16


@pytest.fixture(scope="module")
def ranks():
    import uuid


    r = fork_launch("dtrain_lab.demos.mp_run", nproc=2, args=[STEPS, D_HIDDEN, BATCH], timeout=180,
                    quiet=True, env={"DTRAIN_TEST_TAG": uuid.uuid4().hex})
    assert r.ok, r.summary() + "\n" + "\n".join(x.output[-3000:] for x in r.ranks)
    assert sorted(r.metrics) == [0, 1]
    return r.metrics


@pytest.mark.timeout(240)
def test_parts_and_training_equal_unsplit(ranks):
    m0, m1 = ranks[0], ranks[1]
    assert m0["part"] == ["Linear(16->32)", "ReLU", "Linear(32->32)", "ReLU"]
    assert m1["part"] == ["Linear(32->32)", "ReLU", "Linear(32->4)"]
    assert m0["part_params"] + m1["part_params"] == m0["full_params"]
    for r, m in ranks.items():
        c = m["params_vs_single"]
        assert c["count"] == 4 and c["equal"], f"rank {r}: max abs diff {c['max_abs_diff']}"
        md = m["multi_device"]
        assert md["params_vs_single"]["equal"] and md["losses"] == m["ref_losses"]
    assert m0["losses"] == [] and m1["losses"] == m1["ref_losses"] and len(m1["losses"]) == STEPS


@pytest.mark.timeout(240)
def test_activations_not_gradients_are_sent(ranks):
    # each step: rank 0 sends its output (BATCH, 32) forward, rank 1 sends ∂L/∂(its input) back, float32
    for m in ranks.values():
        assert m["sent_bytes"] == STEPS * BATCH * D_HIDDEN * 4


@pytest.mark.timeout(240)
def test_one_rank_works_at_a_time(ranks):
    for step in range(STEPS):
        (f0, fs0, fe0), (b0, bs0, be0) = ranks[0]["timeline"][step]
        (f1, fs1, fe1), (b1, bs1, be1) = ranks[1]["timeline"][step]
        assert (f0, b0, f1, b1) == ("forward", "backward", "forward", "backward")
        # rank 1 computes only after rank 0's forward, rank 0's backward only after rank 1's backward
        # (perf_counter: the machine's monotonic clock, shared by both processes)
        assert fs0 < fe0 < fs1 < fe1 <= bs1 < be1 < bs0 < be0


def test_partition():
    from dtrain_lab.parallel.model import partition
    from dtrain_lab.models import MLP

    m = MLP(16, 32, 4, depth=3, seed=0)
    x = torch.randn(5, 16)
    for parts in (1, 2, 3, 4):
        pieces = partition(m, parts)
        assert len(pieces) == parts and sum(len(p) for p in pieces) == len(m.layers)
        assert all(isinstance(p[0], nn.Linear) for p in pieces)
        y = x
        for p in pieces:
            y = p(y)
        assert torch.equal(y, m(x))
    assert partition(m, 1)[0][0].weight is not m.layers[0].weight     # copies


def test_partition_errors():
    from dtrain_lab.i18n import LabError
    from dtrain_lab.parallel.model import partition
    from dtrain_lab.models import MLP, BranchMLP

    with pytest.raises(LabError) as e:
        partition(MLP(depth=1), 3)
    assert e.value.key == "mp_bad_parts" and "3" in str(e.value) and "Linear" in str(e.value)
    with pytest.raises(LabError) as e:
        partition(BranchMLP(), 2)
    assert e.value.key == "mp_not_sequential" and "BranchMLP" in str(e.value)


def test_multi_device_model_on_cpu_and_missing_gpu():
    from dtrain_lab.i18n import LabError
    from dtrain_lab.parallel.model import MultiDeviceModel
    from dtrain_lab.models import MLP

    m = MLP(16, 32, 4, depth=3, seed=0)
    md = MultiDeviceModel(m, ["cpu", "cpu", "cpu"])
    x = torch.randn(4, 16)
    assert torch.equal(md(x), m(x))
    have = torch.cuda.device_count() if torch.cuda.is_available() else 0
    with pytest.raises(LabError) as e:
        MultiDeviceModel(m, [f"cuda:{have}"])
    assert e.value.key == "mp_missing_gpu"


def test_world_of_one_training():
    from dtrain_lab.demos.mp_run import facts

    f = facts(steps=3)
    assert f["world"] == 1 and f["params_vs_single"]["equal"] and f["losses"] == f["ref_losses"]
    assert f["sent_bytes"] == 0
