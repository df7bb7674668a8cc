"""dtrain_lab.parallel.dims: validation with every factor in the message, and the rank grid.

The DeviceMesh that ``build_mesh`` makes with ``init_device_mesh`` on CPU/gloo at 4 ranks, and DP × PP
training on it, are checked in tests/test_pipeline.py (``test_device_mesh_matches_grid``,
``test_dp_times_pp_equals_one_process``), whose 4-rank launch of ``dtrain_lab.demos.pp_run`` runs the
``dims`` part too: one start-up of 4 processes instead of two."""
import pytest

from dtrain_lab.i18n import LabError
from dtrain_lab.parallel.dims import MESH_DIMS, ParallelDims


def test_valid_dims_and_grid():
    d = ParallelDims(dp=2, tp=2, pp=2, world_size=8)
    assert d.shape == (2, 2, 2) and MESH_DIMS == ("pp", "dp", "tp")
    assert [tuple(d.coordinate(r).values()) for r in range(8)] == [
        (a, b, c) for a in range(2) for b in range(2) for c in range(2)]   # tp varies fastest
    assert d.groups("tp") == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert d.groups("dp") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert d.groups("pp") == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert ParallelDims(1, 1, 1, 1).groups("pp") == [[0]]


def test_wrong_product_names_every_factor():
    with pytest.raises(LabError) as e:
        ParallelDims(dp=2, tp=4, pp=2, world_size=8)
    msg = str(e.value)
    assert "2 × 4 × 2 = 16" in msg and "world_size = 8" in msg
    assert "dp × tp × pp" in msg and "乘积" in msg and "multiply" in msg


@pytest.mark.parametrize("kwargs", [dict(dp=0, tp=1, pp=1, world_size=0), dict(dp=1, tp=-2, pp=1, world_size=1),
                                    dict(dp=1, tp=1, pp=1.0, world_size=1), dict(dp=True, tp=1, pp=1, world_size=1)])
def test_bad_factor(kwargs):
    with pytest.raises(LabError) as e:
        ParallelDims(**kwargs)
    assert "≥ 1" in str(e.value)


def test_bad_rank_and_dim():
    d = ParallelDims(2, 1, 1, 2)
    for call in (lambda: d.coordinate(2), lambda: d.groups("ep")):
        with pytest.raises(LabError):
            call()
