"""Hierarchical all-reduce (dtrain_lab.comm.hierarchical): equal to dist.all_reduce and to a sum computed
here from the ranks' seeds, for even, uneven (3+1, 1+3, 2+1) and degenerate layouts at world sizes 2,
3 and 4 (one launch per world size, tests/workers/hierarchical_checks.py); only the leaders issue the
all-reduce between nodes; world size 1 is plain code; the α-β prediction is perfmodel's formulas."""
import pytest
import torch

from conftest import WORKERS

from dtrain_lab import perfmodel
from dtrain_lab.comm.hierarchical import hierarchical_all_reduce, hierarchical_groups, node_layout, predict
from dtrain_lab.i18n import LabError
from forkjob import fork_launch

WORLD_SIZES = [2, 3, 4]


def test_node_layout():
    assert node_layout(4, 2) == [[0, 1], [2, 3]]
    assert node_layout(4, [3, 1]) == [[0, 1, 2], [3]]
    assert node_layout(3, 1) == [[0], [1], [2]]
    assert node_layout(1, 1) == [[0]]


@pytest.mark.parametrize("world, per_node", [(4, 3), (4, [2, 1]), (4, [4, 0]), (0, 1), (4, 0), (4, True),
                                             (4, []), (2, "2")])
def test_bad_layouts_get_a_bilingual_error(world, per_node):
    with pytest.raises(LabError) as err:
        node_layout(world, per_node)
    text = str(err.value)
    assert "layout" in text and "节点布局" in text


def test_world_of_one_is_plain_code():
    hg = hierarchical_groups([[0]])
    assert hg.node is None and hg.leaders is None and hg.leader == 0 and hg.is_leader
    x = torch.arange(5.0)
    assert hierarchical_all_reduce(x, hg) is x and torch.equal(x, torch.arange(5.0))
    assert torch.equal(hierarchical_all_reduce(x, hg, op="avg"), torch.arange(5.0))
    with pytest.raises(LabError):
        hierarchical_all_reduce(x, hg, op="max")
    with pytest.raises(LabError):
        hierarchical_groups([[0], [1]])          # two ranks named in a world of one


def test_prediction_is_perfmodels_formulas():
    n, a_in, b_in, a_out, b_out = 2**26, 2e-6, 1 / 150e9, 10e-6, 1 / 25e9
    got = predict(n, 8, 4, (a_in, b_in), (a_out, b_out))
    assert got["reduce"] == pytest.approx(7 * a_in + n * b_in)
    assert got["broadcast"] == pytest.approx(7 * a_in + n * b_in)
    assert got["leaders_all_reduce"] == pytest.approx(2 * 3 * a_out + 2 * 3 / 4 * n * b_out)
    assert got["hierarchical"] == pytest.approx(got["reduce"] + got["leaders_all_reduce"] + got["broadcast"])
    assert got["flat_ring"] == pytest.approx(perfmodel.collective_time("all_reduce", n, 32, a_out, b_out))
    assert got["hierarchical"] < got["flat_ring"]            # slow links between nodes: fewer slow steps
    same = predict(n, 2, 2, (a_out, b_out), (a_out, b_out))  # one kind of link (one machine)
    assert same["hierarchical"] > same["flat_ring"]          # for a large message: 3nβ against 1.5nβ


@pytest.fixture(scope="module")
def results():
    import uuid


    return {n: fork_launch(str(WORKERS / "hierarchical_checks.py"), nproc=n, timeout=240, quiet=True,
                           env={"DTRAIN_TEST_TAG": uuid.uuid4().hex}) for n in WORLD_SIZES}


def seeds_sum(p: int) -> torch.Tensor:
    """The single-process baseline: every rank's data regenerated from its seed, summed here."""
    from workers.hierarchical_checks import data

    return sum(data(r) for r in range(p))


@pytest.mark.timeout(600)
@pytest.mark.parametrize("p", WORLD_SIZES)
def test_equal_to_all_reduce_for_every_layout(results, p):
    r = results[p]
    assert r.ok, r.summary() + "\n" + "\n".join(x.output for x in r.ranks)
    expected = seeds_sum(p)
    names = r.metrics[0]["layouts"].keys()
    assert ("2x2" in names and "3+1" in names) if p == 4 else len(names) >= 2
    for name in names:
        for rank in range(p):
            m = r.metrics[rank]["layouts"][name]
            result = torch.tensor(m["result"], dtype=torch.float64)
            reference = torch.tensor(m["reference"], dtype=torch.float64)
            torch.testing.assert_close(result, reference, rtol=0, atol=1e-12)
            torch.testing.assert_close(result, expected, rtol=0, atol=1e-12)
            torch.testing.assert_close(torch.tensor(m["avg"], dtype=torch.float64), expected / p, rtol=0, atol=1e-13)
            full = sum(torch.arange(12, dtype=torch.float32).reshape(3, 4) * (k + 1) for k in range(p))
            assert torch.equal(torch.tensor(m["view"]), full)           # the non-contiguous view, in place


@pytest.mark.timeout(600)
@pytest.mark.parametrize("p", WORLD_SIZES)
def test_only_leaders_talk_between_nodes(results, p):
    r = results[p]
    assert r.ok, r.summary()
    for name in r.metrics[0]["layouts"]:
        layout = r.metrics[0]["layouts"][name]["layout"]
        leaders = [node[0] for node in layout]
        for rank in range(p):
            m = r.metrics[rank]["layouts"][name]
            node = next(n for n in layout if rank in n)
            assert m["leader"] == node[0] and m["is_leader"] == (rank in leaders)
            expected = {}
            if len(node) > 1:
                expected.update(reduce=1, broadcast=1)
            if rank in leaders and len(layout) > 1:
                expected["all_reduce"] = 1
            assert m["counts"] == expected, (name, rank, m["counts"])
        assert r.metrics[0]["refused"] and "节点布局" in r.metrics[0]["refused"]
