"""dtrain_lab.parallel.tensor: Megatron column/row layers, MLP, attention and Block equal the unsplit
layers (outputs and every gradient), PyTorch's DTensor ``parallelize_module`` gives the same numbers,
and the collectives are counted by ``CommDebugMode``, not assumed.

One launch at world size 2 of dtrain_lab.demos.tp_run, which reports each rank's raw numbers (its
output, input gradient and gradient shards, under ``raw``), not only its own verdicts: the reference is
computed here (:func:`reference`: the unsplit layers from the demo's seed, forward and backward in this
process) and every shard is put back in place by the layout this file expects, so a lesson edit of the
demo's comparisons cannot weaken the test. The in-process tests at the end run the same layers in a
world of one, and check splits and errors.

Exact or close? Splitting a matmul's reduction over ranks (row-parallel, and ``∂L/∂x`` summed by
``f``) adds the same numbers in a different order, so those comparisons are to float32 rounding:
``atol=1e-5`` with float32's own ``rtol=1.3e-6``. The values compared are at most about 14 and the sums
are of at most 128 products, so reordering costs a few float32 ulps (measured: at most 1.2e-6); a
missing All-Reduce or a misplaced shard is off by the other rank's whole share, of order 0.1 or more.
"""
import pytest
import torch
import torch.nn as nn
from forkjob import fork_launch
from dtrain_lab.i18n import tr

D, HEADS = 32, 2
ATOL, RTOL = 1e-5, 1.3e-6      # see the module docstring


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


LINEAR = ["weight", "bias"]
MLP = ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]

# ---- the expected layout (Megatron's): the dimension each parameter's gradient is sharded on, None when
# replicated; a TP Block's names are the Block's with attn./mlp. in front
COL, ROW = {"weight": 0, "bias": 0}, {"weight": 1, "bias": None}
MLP_DIMS = {**{f"fc1.{k}": v for k, v in COL.items()}, **{f"fc2.{k}": v for k, v in ROW.items()}}
ATTN_DIMS = {f"{p}_proj.{k}": v for p in "qkv" for k, v in COL.items()} | {f"o_proj.{k}": v for k, v in ROW.items()}
BLOCK_DIMS = ({f"{ln}.{w}": None for ln in ("ln1", "ln2") for w in LINEAR}
              | {f"attn.{k}": v for k, v in ATTN_DIMS.items()} | {f"mlp.{k}": v for k, v in MLP_DIMS.items()})
# layer -> (full module, input, probe, params' shard dims, input sharded on its last dim, output sharded on it)
LAYERS = {"column": ("lin_col", "x", "probe_col", COL, False, True),
          "column_gather": ("lin_col", "x", "probe_col", COL, False, False),
          "row": ("lin_row", "h", "probe_d", ROW, True, False),
          "row_full_input": ("lin_row", "h", "probe_d", ROW, False, False),
          "mlp": ("mlp", "x", "probe_d", MLP_DIMS, False, False),
          "attention": ("attention", "x", "probe_d", ATTN_DIMS, False, False),
          "block": ("block", "x", "probe_d", BLOCK_DIMS, False, False)}
_REF: dict = {}


def reference(layer: str) -> dict:
    """The unsplit layer from the demo's seed (its ``inputs()``: the lesson's data, not its checks), forward
    and backward in this process with the demo's loss ``(out * probe).sum()``: ``out``, ``grad_input`` and
    ``grads`` (keyed by the TP layer's parameter names)."""
    if layer not in _REF:
        from dtrain_lab.demos.tp_run import inputs

        data = inputs()
        name, x_key, probe_key = LAYERS[layer][:3]
        if name == "attention":
            block = data["block"]
            fn = block.attention           # the Block's attention alone: q, k, v, o projections
            params = {n: p for n, p in block.named_parameters() if n.split(".")[0].endswith("_proj")}
        else:
            module = data[name]
            fn, params = module, dict(module.named_parameters())
        x = data[x_key].clone().requires_grad_(True)
        out = fn(x)
        (out * data[probe_key]).sum().backward()
        grads = {n: p.grad.detach().clone() for n, p in params.items()}
        if name == "block":       # TP Block names: attn.q_proj.weight, mlp.fc1.bias, ln1.weight, ...
            grads = {(f"attn.{n}" if n.split(".")[0].endswith("_proj") else f"mlp.{n}" if n.startswith("fc")
                      else n): g for n, g in grads.items()}
        # a reference that is not trivially zero (as a degenerate input would make it), except the key bias:
        # it adds the same number to every score of a query, which softmax ignores, so its gradient is 0
        for n, g in [("out", out), ("grad_input", x.grad), *grads.items()]:
            assert n.endswith("k_proj.bias") or g.abs().max() > 1e-3, (layer, n)
        _REF[layer] = {"out": out.detach(), "grad_input": x.grad.detach(), "grads": grads}
    return _REF[layer]


def close(actual, expected, what: str) -> None:
    torch.testing.assert_close(torch.as_tensor(actual, dtype=torch.float32), expected, atol=ATOL, rtol=RTOL,
                               msg=lambda m: f"{what}: {m}")


def joined(per_rank: list, dim: int | None) -> dict:
    """``{label: tensor}`` to compare with the full tensor: every rank's shard put back in place along
    ``dim`` (rank order), or for a replicated tensor (``None``) each rank's own copy."""
    parts = [torch.as_tensor(p, dtype=torch.float32) for p in per_rank]
    if dim is None:
        return {f"rank {r}": p for r, p in enumerate(parts)}
    return {f"ranks 0..{len(parts) - 1} joined on dim {dim}": torch.cat(parts, dim=dim)}


def close_all(per_rank: list, dim: int | None, expected: torch.Tensor, what: str) -> None:
    for label, t in joined(per_rank, dim).items():
        close(t, expected, f"{what}, {label}")


def check_layer(ranks: dict, layer: str) -> None:
    """Every rank's raw output, input gradient and gradient shards, put in place, equal the reference."""
    ref, (_, _, _, dims, in_split, out_split) = reference(layer), LAYERS[layer]
    raws = [ranks[r][layer]["raw"] for r in sorted(ranks)]
    close_all([c["out"] for c in raws], -1 if out_split else None, ref["out"], f"{layer} output")
    close_all([c["grad_input"] for c in raws], -1 if in_split else None, ref["grad_input"], f"{layer} input gradient")
    for c in raws:
        assert sorted(c["grads"]) == sorted(dims) == sorted(ref["grads"]), layer
    for name, dim in dims.items():
        close_all([c["grads"][name] for c in raws], dim, ref["grads"][name], f"{layer} grad {name}")


@pytest.mark.timeout(240)
def test_job_ok(ranks):
    for r, m in ranks.items():
        assert m["rank"] == r and m["tp"] == 2 and m["backend"] in ("gloo", "nccl")


@pytest.mark.timeout(240)
def test_column_parallel_equals_linear(ranks):
    for r, m in ranks.items():
        c = m["column"]
        assert c["shard"] == [64 * r, 64 * (r + 1)] and c["weight_shape"] == [64, D]   # 128 outputs / 2
        assert torch.tensor(c["raw"]["out"]).shape == (2, 5, 64)
        assert torch.tensor(m["column_gather"]["raw"]["out"]).shape == (2, 5, 128)
    check_layer(ranks, "column")
    check_layer(ranks, "column_gather")


@pytest.mark.timeout(240)
def test_row_parallel_equals_linear(ranks):
    for r, m in ranks.items():
        c = m["row"]
        assert c["shard"] == [64 * r, 64 * (r + 1)] and c["weight_shape"] == [D, 64]
        assert torch.tensor(c["raw"]["grad_input"]).shape == (2, 5, 64)     # this rank's slice of the input
        assert torch.tensor(m["row_full_input"]["raw"]["grad_input"]).shape == (2, 5, 128)
    check_layer(ranks, "row")
    check_layer(ranks, "row_full_input")


@pytest.mark.timeout(240)
def test_mlp_attention_block_equal_unsplit(ranks):
    for layer in ("mlp", "attention", "block"):
        check_layer(ranks, layer)
    for m in ranks.values():
        assert m["attention"]["local_heads"] == 1                     # 2 heads over 2 ranks


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
        assert (t["forward"], t["backward"]) == (m["mlp"]["forward"], m["mlp"]["backward"])
        # the same numbers as ours on this rank: output, input gradient, every local gradient
        ours = m["mlp"]["raw"]
        close(t["raw"]["out"], torch.tensor(ours["out"]), f"rank {r} DTensor output vs ours")
        close(t["raw"]["grad_input"], torch.tensor(ours["grad_input"]), f"rank {r} DTensor input gradient vs ours")
        for name in MLP:
            close(t["raw"]["grads"][name], torch.tensor(ours["grads"][name]), f"rank {r} DTensor grad {name} vs ours")
    # and as the unsplit MLP: outputs, input gradients, the local shards of the weights (exactly the full
    # weights' slices) and of the gradients
    ref, full = reference("mlp"), {n: p.detach() for n, p in _mlp().named_parameters()}
    raws = [ranks[r]["torch"]["raw"] for r in sorted(ranks)]
    for key in ("out", "grad_input"):
        close_all([c[key] for c in raws], None, ref[key], f"DTensor {key} vs full")
    for name, dim in MLP_DIMS.items():
        for label, t in joined([c["weights"][name] for c in raws], dim).items():
            assert torch.equal(t, full[name]), (name, label)
        close_all([c["grads"][name] for c in raws], dim, ref["grads"][name], f"DTensor grad {name} vs full")


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


def _mlp():
    from dtrain_lab.demos.tp_run import inputs

    return inputs()["mlp"]


def test_world_of_one_same_numbers_no_collectives():
    from dtrain_lab.demos.tp_run import facts

    m = facts()
    assert m["tp"] == 1 and m["torch"] is None
    for layer in LAYERS:
        check_layer({0: m}, layer)
        # nothing split: bit for bit
        assert torch.equal(torch.tensor(m[layer]["raw"]["out"]), reference(layer)["out"]), layer
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
