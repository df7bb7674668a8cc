"""dtrain_lab.parallel.dims: validation with every factor in the message, and the rank grid.

Lesson 08's three-dimensional calls (``ParallelDims(dp, tp, pp, world_size)``, a ``(pp, dp, tp)`` mesh)
are unchanged; the five-dimensional layout adds cp (a mesh dimension before tp) and ep (which borrows
the dp × cp ranks). An 8-rank 5-D layout is checked through PyTorch's fake process group in this
process: for every rank, the DeviceMesh, the expert mesh and ``process_groups()`` give the groups of
the grid. A 4-rank layout runs for real in tests/test_planner.py (``dtrain_lab.demos.plan_run``).

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
    for call in (lambda: d.coordinate(2), lambda: d.groups("xp"), lambda: d.group_of(-1, "dp")):
        with pytest.raises(LabError):
            call()
    assert d.groups("ep") == [[0], [1]] and d.groups("edp") == [[0, 1]]   # ep = 1: every rank its own experts


# ------------------------------------------------------------------------------------ five dimensions
def test_five_dims_grid():
    d = ParallelDims(dp=2, tp=2, pp=2, world_size=16, cp=2, ep=4)
    assert d.mesh_dims == ("pp", "dp", "cp", "tp") and d.shape == (2, 2, 2, 2) and d.edp == 1
    assert d.coordinate(5) == {"pp": 0, "dp": 1, "cp": 0, "tp": 1}
    assert d.groups("cp")[:2] == [[0, 2], [1, 3]] and d.groups("tp")[0] == [0, 1]
    assert d.groups("dp_cp")[:2] == [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert d.groups("ep")[:2] == [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert d.groups("edp")[:4] == [[0], [1], [2], [3]]
    d2 = ParallelDims(dp=4, tp=1, pp=1, world_size=8, cp=2, ep=2)
    # ep groups are consecutive among the dp × cp ranks (cp fastest), edp the ranks holding the same experts
    assert d2.groups("ep") == [[0, 1], [2, 3], [4, 5], [6, 7]] and d2.groups("edp") == [[0, 2, 4, 6], [1, 3, 5, 7]]
    for dim in ("pp", "dp", "cp", "tp", "dp_cp", "ep", "edp"):
        flat = sorted(r for g in d.groups(dim) for r in g)
        assert flat == list(range(16)), dim                        # every dim partitions the ranks


def test_five_dims_errors_say_what_to_change():
    with pytest.raises(LabError) as e:
        ParallelDims(dp=2, tp=2, pp=1, world_size=16, cp=2)
    assert "2 × 2 × 2 × 1 = 8" in str(e.value) and "world_size = 16" in str(e.value)
    with pytest.raises(LabError) as e:
        ParallelDims(dp=2, tp=2, pp=1, world_size=8, cp=2, ep=3)
    assert "ep = 3" in str(e.value) and "dp × cp = 2 × 2 = 4" in str(e.value)
    d = ParallelDims(dp=1, tp=4, pp=2, world_size=16, cp=2, ep=2)
    cases = [(dict(n_layers=8, n_heads=6), "6"), (dict(n_layers=8, n_heads=8, n_kv_heads=2), "2"),
             (dict(n_layers=1, n_heads=8, n_experts=4), "pp ≤ 1"), (dict(n_layers=8, n_heads=8, seq_len=10, n_experts=4), "10"),
             (dict(n_layers=8, n_heads=8, n_experts=0), "ep = 2"), (dict(n_layers=8, n_heads=8, n_experts=3), "3")]
    for kwargs, text in cases:
        with pytest.raises(LabError) as e:
            d.check_model(**kwargs)
        assert text in str(e.value), (kwargs, str(e.value))
    d.check_model(n_layers=8, n_heads=8, n_kv_heads=4, seq_len=16, n_experts=4)
    with pytest.raises(LabError) as e:
        d.check_model(n_layers=8, n_heads=8, seq_len=8, n_experts=4, sequence_parallel=True)
    assert "16" in str(e.value)


def test_eight_ranks_through_the_fake_process_group():
    """torch 2.13 ships FakeProcessGroup (torch._C._distributed_c10d) and FakeStore
    (torch.testing._internal.distributed.fake_pg, which registers the "fake" backend): one process can
    be any rank of any world size; collectives do nothing. Each rank's groups must be the grid's."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    d = ParallelDims(dp=2, tp=2, pp=1, world_size=8, cp=2, ep=2)
    assert not dist.is_initialized()
    for rank in range(8):
        dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=8)
        try:
            assert dist.get_backend() == "fake"
            mesh, emesh, pgs = d.build_mesh(), d.build_expert_mesh(), d.process_groups()
            assert list(mesh.get_coordinate()) == list(d.coordinate(rank).values())
            for dim in d.mesh_dims:
                assert dist.get_process_group_ranks(mesh[dim].get_group()) == d.group_of(rank, dim)
            for dim in ("ep", "edp"):
                assert dist.get_process_group_ranks(emesh[dim].get_group()) == d.group_of(rank, dim)
            assert sorted(pgs) == sorted(("pp", "dp", "cp", "tp", "dp_cp", "ep", "edp"))
            for dim, g in pgs.items():
                assert dist.get_process_group_ranks(g) == d.group_of(rank, dim), (rank, dim)
        finally:
            dist.destroy_process_group()
