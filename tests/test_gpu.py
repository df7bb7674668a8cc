"""GPU paths, for instructors on a GPU machine: `pytest -m gpu`. Skipped where GPUs are missing.

On CPU machines the same library code takes the gloo path (tested everywhere else); these tests
check that with GPUs the backend becomes NCCL, each rank gets its own device, and the from-scratch
collectives match NCCL's."""
import pytest

import dtrain_lab
from conftest import WORKERS
from dtrain_lab.jobs.runtime import choose_backend, gpu_count

GPUS = gpu_count()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(GPUS < 2, reason=f"needs 2 CUDA GPUs, found {GPUS}")]


def test_nccl_is_chosen_with_one_gpu_per_rank(monkeypatch):
    monkeypatch.delenv("DTRAIN_BACKEND", raising=False)
    assert choose_backend(2) == "nccl"
    assert choose_backend(GPUS + 1) == "gloo"   # more ranks than GPUs: NCCL would share devices


@pytest.mark.timeout(300)
def test_hello_on_gpus():
    r = dtrain_lab.launch("dtrain_lab.demos.hello", nproc=2, timeout=120, quiet=True)
    assert r.ok, r.summary()
    assert [m["device"] for m in r.metrics.values()] == ["cuda:0", "cuda:1"]
    assert r.gathered("backend") == ["nccl", "nccl"] and r.gathered("all_reduce_sum") == [3.0, 3.0]


@pytest.mark.timeout(300)
def test_ring_all_reduce_on_nccl():
    r = dtrain_lab.launch(str(WORKERS / "dist_checks.py"), nproc=2, timeout=200, quiet=True)
    assert r.ok, r.summary()
    for m in r.metrics.values():
        assert m["backend"] == "nccl"
        for key, value in m["ring"].items():
            assert value is True if key.endswith("-agree") else value <= 1e-5, key


@pytest.mark.timeout(300)
def test_bandwidth_demo_on_gpus():
    r = dtrain_lab.launch("dtrain_lab.demos.bandwidth", nproc=2, args=[1 << 24, "all_reduce"], timeout=200,
                          quiet=True)
    assert r.ok and all(row["busbw"] > 0 for row in r.metrics[0]["rows"])
