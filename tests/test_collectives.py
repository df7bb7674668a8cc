"""Ring all-reduce from send/recv equals dist.all_reduce; runtime behaves under torchrun.

One launch per world size (2, 3, 4) runs every check (tests/workers/dist_checks.py)."""
import pytest

from conftest import WORKERS

from dtrain_lab.jobs.runtime import gpu_count
from forkjob import fork_launch

WORLD_SIZES = [2, 3, 4]
GPUS = gpu_count()


@pytest.fixture(scope="module")
def results():
    import uuid


    out = {}
    for n in WORLD_SIZES:
        out[n] = fork_launch(str(WORKERS / "dist_checks.py"), nproc=n, timeout=120, quiet=True,
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


@pytest.mark.timeout(400)
@pytest.mark.parametrize("n", WORLD_SIZES)
def test_counted_collectives_match_the_trace(results, n):
    """Comm's results equal torch.distributed's; what it counts is what CommDebugMode's dispatch
    mode saw go through c10d (calls and bytes per collective); the ring all-reduce sends 2(p-1) chunks,
    2(p-1)/p of the tensor (perfmodel's formula)."""
    for rank, m in results[n].metrics.items():
        c = m["counted"]
        for op in ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce"):
            assert c[op] is True, (rank, op)
        assert c["comm_calls"] == {"all_reduce": 2, "reduce_scatter": 1, "all_gather": 2, "broadcast": 1,
                                   "reduce": 1}
        assert c["trace_counts"] == c["comm_calls"]
        chunk = 6 * 4
        assert c["trace_bytes"] == {"all_reduce": 2 * n * chunk, "reduce_scatter": n * chunk,
                                    "all_gather": 2 * chunk, "broadcast": n * chunk, "reduce": n * chunk}
        # Comm counts what a rank *sends*: the broadcast's source and the reduce's non-roots only
        assert c["comm_payload"]["broadcast"] == (n * chunk if rank == n - 1 else 0)
        assert c["comm_payload"]["reduce"] == (0 if rank == 0 else n * chunk)
        for op in ("all_reduce", "reduce_scatter", "all_gather"):
            assert c["comm_payload"][op] == c["trace_bytes"][op]
        assert c["comm_wire_all_reduce"] == pytest.approx(c["expected_wire_all_reduce"])
        assert c["all_gather_wire"][0] == pytest.approx(c["all_gather_wire"][1]) == c["all_gather_wire"][2]
        sends, recvs, expected = c["ring_sends"]
        assert sends == recvs == expected
        assert c["ring_bytes"][0] == pytest.approx(c["ring_bytes"][1])
        if rank in (0, n - 1):
            assert c["sub_broadcast"] is True and c["sub_size"] == 2


def test_counted_collectives_at_world_size_one():
    """No process group: Comm is plain local code that counts nothing."""
    import torch

    from dtrain_lab.comm.counted import Comm, wire_bytes
    from dtrain_lab.i18n import LabError

    comm = Comm()
    x = torch.arange(4.0)
    comm.all_reduce(x)
    out = torch.empty(4)
    comm.all_gather(out, x)
    assert torch.equal(out, x) and comm.all_gather_list(x)[0].equal(x)
    comm.reduce_scatter(out, x * 2)
    assert torch.equal(out, x * 2)
    assert comm.all_reduce(x, async_op=True).wait() is True
    assert comm.total("calls") == 0 and comm.total("payload") == 0 and comm.size == 1
    assert wire_bytes("all_reduce", 100, 1) == 0.0 and wire_bytes("all_reduce", 100, 4) == 150.0
    with pytest.raises(LabError):
        wire_bytes("allreduce", 1, 2)
