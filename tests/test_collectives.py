"""Ring all-reduce from send/recv equals dist.all_reduce; runtime behaves under torchrun.

One launch per world size (2, 3, 4) runs every check (tests/workers/dist_checks.py)."""
import pytest

from conftest import WORKERS

from dtrain_lab.jobs.runtime import gpu_count

WORLD_SIZES = [2, 3, 4]
GPUS = gpu_count()


@pytest.fixture(scope="module")
def results():
    import uuid

    import dtrain_lab

    out = {}
    for n in WORLD_SIZES:
        out[n] = dtrain_lab.launch(str(WORKERS / "dist_checks.py"), nproc=n, timeout=120, quiet=True,
                                   env={"DTRAIN_TEST_TAG": uuid.uuid4().hex})
    return out


@pytest.mark.timeout(400)
@pytest.mark.parametrize("n", WORLD_SIZES)
def test_job_ok(results, n):
    r = results[n]
    assert r.ok, r.summary() + "\n" + "\n".join(x.output for x in r.ranks)
    assert [x.rank for x in r.ranks] == list(range(n))
    assert all(m["last"] is True for m in r.metrics.values())


@pytest.mark.timeout(400)
@pytest.mark.parametrize("n", WORLD_SIZES)
def test_runtime_under_torchrun(results, n):
    r = results[n]
    for rank, m in r.metrics.items():
        assert m["rank"] == rank and m["env_rank"] == str(rank)
        assert m["world_size"] == n and m["local_rank"] == rank
        if GPUS >= n:   # one GPU per rank: NCCL on cuda:LOCAL_RANK
            assert m["backend"] == "nccl" and m["device"] == f"cuda:{rank}"
        else:           # otherwise gloo on the CPU
            assert m["backend"] == "gloo" and m["device"] == "cpu"
        assert m["timeout_s"] == 30.0                             # the course's short default
        assert m["same_init"] is True                             # same seed on every rank
        assert m["data_differs"] is True                          # rank-offset data seeds
        assert m["tensor"] == [1.5, 2.5]                          # tensors become JSON lists


@pytest.mark.timeout(400)
def test_report_channel_cannot_be_forged(results):
    r = results[2]
    for rank, m in r.metrics.items():
        assert "forged" not in m and m["rank"] == rank
        assert '{"forged": true}' in r.output[rank]           # it was printed, but is not a metric
        assert f"[rank{rank}] prefixed" in r.output[rank]
    assert "only on rank 0" in r.output[0] and "only on rank 0" not in r.output[1]
    assert len(r.ranks[0].reports) == 3                       # three report() calls, in order


@pytest.mark.timeout(400)
@pytest.mark.parametrize("n", WORLD_SIZES)
def test_ring_all_reduce_equals_dist_all_reduce(results, n):
    for rank, m in results[n].metrics.items():
        ring = m["ring"]
        for key, value in ring.items():
            if key.endswith("-agree"):
                assert value is True, f"rank {rank}: ranks disagree for {key}"
            else:
                # summation order differs from gloo's: equal within float tolerance, not bitwise
                tol = 1e-5 if "float32" in key or key in ("noncontiguous-avg", "naive", "subgroup") else 1e-12
                assert value <= tol, f"rank {rank} {key}: max abs diff {value}"
        assert len([k for k in ring if k.endswith("-agree")]) == 20
        if rank in (0, n - 1):
            assert "subgroup" in ring
