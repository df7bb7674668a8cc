"""dtrain_lab.parallel.tensor: Megatron column/row layers, MLP, attention and Block equal the unsplit
layers (outputs and every gradient), PyTorch's DTensor ``parallelize_module`` gives the same numbers,
and the collectives are counted by ``CommDebugMode``, not assumed.

One launch at world size 2 (dtrain_lab.demos.tp_run reports every comparison); the in-process tests
at the end run the same comparisons in a world of one, and check splits and errors.

Exact or close? Splitting a matmul's reduction over ranks (row-parallel, and ``∂L/∂x`` summed by
``f``) adds the same numbers in a different order, so those comparisons are to float32 rounding.
"""
import pytest
import torch
import torch.nn as nn
from forkjob import fork_launch
from dtrain_lab.i18n import tr

TOL = 1e-5
D, HEADS = 32, 2


@pytest.fixture(scope="module")
def result():
    import uuid


    return fork_launch("dtrain_lab.demos.tp_run", nproc=2, timeout=180, quiet=True,
                       env={"DTRAIN_TEST_TAG": uuid.uuid4().hex})


@pytest.fixture(scope="module")
def ranks(result):
    assert result.ok, result.summary() + "\n" + "\n".join(x.output[-3000:] for x in result.ranks)
    assert sorted(result.metrics) == [0, 1]
    return result.metrics


def close(c: dict, what: str) -> None:
    assert c["max_abs_diff"] < TOL, f"{what}: max abs diff {c['max_abs_diff']}"


def check_layer(c: dict, params: list[str], what: str) -> None:
    close(c["out"], f"{what} output")
    close(c["grad_input"], f"{what} input gradient")
    assert sorted(c["grads"]) == sorted(params), what
    for name, g in c["grads"].items():
        close(g, f"{what} grad {name}")


LINEAR = ["weight", "bias"]
MLP = ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]
ATTN = [f"{p}_proj.{w}" for p in "qkvo" for w in LINEAR]
BLOCK = [f"{m}.{w}" for m in ("ln1", "q_proj", "k_proj", "v_proj", "o_proj", "ln2", "fc1", "fc2") for w in LINEAR]


@pytest.mark.timeout(240)
def test_job_ok(ranks):
    for r, m in ranks.items():
        assert m["rank"] == r and m["tp"] == 2 and m["backend"] in ("gloo", "nccl")


@pytest.mark.timeout(240)
def test_column_parallel_equals_linear(ranks):
    for r, m in ranks.items():
        c = m["column"]
        assert c["shard"] == [64 * r, 64 * (r + 1)] and c["weight_shape"] == [64, D]   # 128 outputs / 2
        assert c["out"]["shape"] == [2, 5, 64]
        check_layer(c, LINEAR, f"rank {r} column")
        check_layer(m["column_gather"], LINEAR, f"rank {r} column gather_output")
        assert m["column_gather"]["out"]["shape"] == [2, 5, 128]


@pytest.mark.timeout(240)
def test_row_parallel_equals_linear(ranks):
    for r, m in ranks.items():
        c = m["row"]
        assert c["shard"] == [64 * r, 64 * (r + 1)] and c["weight_shape"] == [D, 64]
        assert c["grad_input"]["shape"] == [2, 5, 64]        # this rank's slice of the input
        check_layer(c, LINEAR, f"rank {r} row")
        check_layer(m["row_full_input"], LINEAR, f"rank {r} row input_is_parallel=False")
        assert m["row_full_input"]["grad_input"]["shape"] == [2, 5, 128]


@pytest.mark.timeout(240)
def test_mlp_attention_block_equal_unsplit(ranks):
    for r, m in ranks.items():
        check_layer(m["mlp"], MLP, f"rank {r} MLP")
        check_layer(m["attention"], ATTN, f"rank {r} attention")
        assert m["attention"]["local_heads"] == 1                     # 2 heads over 2 ranks
        check_layer(m["block"], BLOCK, f"rank {r} Block")


@pytest.mark.timeout(240)
def test_collectives_counted(ranks):
    for m in ranks.values():
        # (forward, backward), as CommDebugMode saw them
        assert (m["column"]["forward"], m["column"]["backward"]) == ({}, {"all_reduce": 1})         # f
        assert (m["column_gather"]["forward"], m["column_gather"]["backward"]) == ({"all_gather": 1}, {"all_reduce": 1})
        assert (m["row"]["forward"], m["row"]["backward"]) == ({"all_reduce": 1}, {})               # g
        assert (m["row_full_input"]["forward"], m["row_full_input"]["backward"]) == ({"all_reduce": 1}, {"all_gather": 1})
        for layer in ("mlp", "attention"):
            assert (m[layer]["forward"], m[layer]["backward"]) == ({"all_reduce": 1}, {"all_reduce": 1}), layer
        assert (m["block"]["forward"], m["block"]["backward"]) == ({"all_reduce": 2}, {"all_reduce": 2})


@pytest.mark.timeout(240)
def test_memory_per_rank(ranks):
    full = sum(p.numel() for p in _block().parameters()) * 4
    replicated = 4 * (4 * D + 2 * D)        # two LayerNorms (weight, bias) + o_proj.bias + fc2.bias
    for m in ranks.values():
        assert m["block"]["param_bytes_full"] == full
        assert m["block"]["param_bytes_rank"] == (full - replicated) // 2 + replicated


@pytest.mark.timeout(240)
def test_dtensor_parallelize_module_equals_ours(ranks):
    for r, m in ranks.items():
        t = m["torch"]
        assert t["param_type"] == "DTensor"
        assert t["placements"] == {"fc1.weight": "(Shard(dim=0),)", "fc1.bias": "(Shard(dim=0),)",
                                   "fc2.weight": "(Shard(dim=1),)", "fc2.bias": "(Replicate(),)"}
        assert t["local_shapes"] == {"fc1.weight": [64, D], "fc1.bias": [64], "fc2.weight": [D, 64], "fc2.bias": [D]}
        for key in ("out_vs_full", "out_vs_ours", "grad_input_vs_ours", "grad_input_vs_full"):
            close(t[key], f"rank {r} DTensor {key}")
        for name in MLP:      # the same shards, the same local gradients
            assert t["local_weights_vs_ours"][name]["equal"], name
            close(t["local_grads_vs_ours"][name], f"rank {r} DTensor grad {name}")
        assert (t["forward"], t["backward"]) == (m["mlp"]["forward"], m["mlp"]["backward"])


@pytest.mark.timeout(240)
def test_uneven_split_refused_bilingually(ranks):
    for m in ranks.values():
        u = m["uneven"]
        assert u["out_features"]["key"] == u["in_features"]["key"] == "tp_uneven"
        assert u["heads"]["key"] == "tp_uneven_heads"
        # tp_run tries Linear(D, 4D + 1), Linear(4D + 1, D) and Block(36 dims, 3 heads) on 2 ranks
        tp, n, heads = 2, 4 * D + 1, 3
        fields = {"out_features": dict(what="out_features", n=n, tp=tp),
                  "in_features": dict(what="in_features", n=n, tp=tp),
                  "heads": dict(heads=heads, tp=tp)}
        for label, e in u.items():
            for lang in ("en", "zh"):         # both languages, each with the numbers of this refusal
                assert tr(u[label]["key"], lang, **fields[label]) in e["message"], (label, lang, e["message"])
        assert "129 is not divisible by the tensor-parallel size 2" in u["out_features"]["message"]
        assert "in_features evenly: 129" in u["in_features"]["message"]
        assert "3 heads cannot be shared evenly by 2 ranks" in u["heads"]["message"]
        assert "3 个头没法平均分给 2 个 rank" in u["heads"]["message"]


# ------------------------------------------------------------------------------ in process (world of 1)
def _block():
    from dtrain_lab.models import Block

    return Block(D, HEADS)


def test_world_of_one_same_comparisons_no_collectives():
    from dtrain_lab.demos.tp_run import facts

    m = facts()
    assert m["tp"] == 1 and m["torch"] is None
    for layer, params in (("column", LINEAR), ("column_gather", LINEAR), ("row", LINEAR),
                          ("row_full_input", LINEAR), ("mlp", MLP), ("attention", ATTN), ("block", BLOCK)):
        check_layer(m[layer], params, layer)
        assert m[layer]["out"]["equal"], layer           # nothing split: bit for bit
        assert m[layer]["forward"] == {} and m[layer]["backward"] == {}, layer
    assert m["block"]["param_bytes_rank"] == m["block"]["param_bytes_full"]
    assert all(v is None for v in m["uneven"].values())   # everything divides by 1


def test_shard_range_and_errors():
    from dtrain_lab.i18n import LabError
    from dtrain_lab.parallel.tensor import shard_range

    assert [shard_range(12, 3, r) for r in range(3)] == [(0, 4), (4, 8), (8, 12)]
    with pytest.raises(LabError) as e:
        shard_range(10, 4, 0, "out_features")
    assert e.value.key == "tp_uneven" and "10" in str(e.value) and "4" in str(e.value)
    assert "整除" in str(e.value) and "divisible" in str(e.value)
    for rank, tp in ((2, 2), (-1, 2), (0, 0)):
        with pytest.raises(LabError) as e:
            shard_range(8, tp, rank)
        assert e.value.key == "tp_bad_rank"


def test_operators_in_one_process_are_identities():
    from dtrain_lab.parallel.tensor import f, g

    x = torch.randn(3, 4, requires_grad=True)
    y = g(f(x)) * 2
    y.sum().backward()
    assert torch.equal(y, x * 2) and torch.equal(x.grad, torch.full_like(x, 2.0))


def test_from_linear_copies_the_weights():
    from dtrain_lab.parallel.tensor import ColumnParallelLinear, RowParallelLinear

    lin = nn.Linear(4, 6)
    col, row = ColumnParallelLinear.from_linear(lin), RowParallelLinear.from_linear(lin, input_is_parallel=False)
    x = torch.randn(5, 4)
    assert torch.equal(col(x), lin(x)) and torch.equal(row(x), lin(x))
    with torch.no_grad():
        lin.weight.zero_()                    # a copy, not a view of the full layer
    assert col.weight.abs().sum() > 0 and row.weight.abs().sum() > 0
    nobias = ColumnParallelLinear.from_linear(nn.Linear(4, 6, bias=False))
    assert nobias.bias is None and nobias(x).shape == (5, 6)


def test_comm_bytes_formulas():
    from dtrain_lab.parallel.tensor import dp_comm_bytes, tp_comm_bytes

    t = tp_comm_bytes(tokens=8, d=32, tp=2)
    assert t["payload_bytes"] == 8 * 32 * 4 and t["sent_per_rank"] == 2 * 1 * 8 * 32 * 4
    d = dp_comm_bytes(num_params=1000, dp=4)
    assert d["sent_per_rank"] == 2 * 3 / 4 * 4000
