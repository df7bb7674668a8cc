"""Lesson 07: Megatron tensor parallelism checked against the unsplit layers and PyTorch's DTensor.

    torchrun --standalone --nproc-per-node 2 -m dtrain_lab.demos.tp_run

Every rank builds the same full layers from the same seed (``nn.Linear``, ``dtrain_lab.models.Block``
with d=32, 2 heads), keeps its shard (:mod:`dtrain_lab.parallel.tensor`), runs forward and backward on
the same input, and compares with the full layer run locally: the output, the input's gradient and
every parameter's gradient (shards All-Gathered back). Collectives are counted with PyTorch's
``CommDebugMode``, separately for forward and backward. Then the same MLP through PyTorch's
``parallelize_module(ColwiseParallel, RowwiseParallel)`` on a 1-D CPU device mesh. :func:`facts` also
runs in a single process (world of one: nothing to split, no collective).

Besides its own comparisons (printed by the lesson), every layer reports its raw numbers under ``raw``:
this rank's output, input gradient and parameter gradients (its shards, not gathered), as lists of
floats. ``tests/test_tensor_parallel.py`` builds its own unsplit reference from :func:`inputs` and
checks those, so the test does not depend on the comparisons made here.
"""
from __future__ import annotations

import copy

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from dtrain_lab import caps
from dtrain_lab.jobs import runtime
from dtrain_lab.i18n import LabError
from dtrain_lab.models import Block, seeded
from dtrain_lab.parallel.tensor import (ColumnParallelLinear, RowParallelLinear, TensorParallelAttention,
                                        TensorParallelMLP, count_collectives, gather_shards, parallelize_block,
                                        parallelize_mlp_torch)

D, HEADS, BATCH, SEQ = 32, 2, 2, 5


class MLP2(nn.Module):
    """The transformer MLP of :class:`~dtrain_lab.models.Block`, alone: ``fc2(gelu(fc1(x)))``."""

    def __init__(self, d: int = D, hidden: int = 4 * D):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(d, hidden), nn.Linear(hidden, d)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


def _cmp(a: torch.Tensor, b: torch.Tensor) -> dict:
    a, b = a.detach().float(), b.detach().float()
    same_shape = tuple(a.shape) == tuple(b.shape)
    diff = (a - b).abs().max().item() if same_shape and a.numel() else float("inf")
    return {"equal": same_shape and torch.equal(a, b), "max_abs_diff": diff, "shape": list(a.shape)}


def _raw(t: torch.Tensor) -> list:
    """The numbers themselves, for tests/test_tensor_parallel.py (which computes its own reference)."""
    return t.detach().float().cpu().tolist()


def _raw_layer(out: torch.Tensor, grad_input: torch.Tensor, module: nn.Module) -> dict:
    """This rank's output, input gradient and every parameter's gradient, as this rank holds them."""
    return {"out": _raw(out), "grad_input": _raw(grad_input),
            "grads": {n: _raw(p.grad) for n, p in module.named_parameters()}}


def _run(module, x, probe):
    """Forward + backward with a fixed random projection of the output (so every gradient is non-trivial);
    collectives counted separately in each direction."""
    x = x.detach().clone().requires_grad_(True)
    out, fwd = count_collectives(module, x)
    _, bwd = count_collectives(lambda: (out * probe).sum().backward())
    return out, x.grad, fwd, bwd


def _full_grad(p: torch.Tensor, dim: int | None, group) -> torch.Tensor:
    return p.grad if dim is None else gather_shards(p.grad, dim, group)


def _compare_module(full: nn.Module, tp: nn.Module, x, probe, shard_dims: dict, group, x_slice=None,
                    out_slice=None) -> dict:
    """Run both; compare outputs, input gradients and every parameter gradient (``shard_dims[name]``:
    the dimension the shard was cut on, ``None`` for a replicated parameter). ``x_slice``: the TP layer
    takes only these input features; ``out_slice``: it gives only these output features."""
    out_f, gx_f, _, _ = _run(full, x, probe)
    x_in = x if x_slice is None else x[..., x_slice[0]:x_slice[1]]
    probe_t = probe if out_slice is None else probe[..., out_slice[0]:out_slice[1]]
    out_t, gx_t, fwd, bwd = _run(tp, x_in, probe_t)
    raw = _raw_layer(out_t, gx_t, tp)
    if out_slice is not None:
        out_f = out_f[..., out_slice[0]:out_slice[1]]
    if x_slice is not None:
        gx_f = gx_f[..., x_slice[0]:x_slice[1]]
    tp_params = dict(tp.named_parameters())
    grads = {name: _cmp(_full_grad(tp_params[name], shard_dims[name], group), p.grad)
             for name, p in full.named_parameters()}
    return {"out": _cmp(out_t, out_f), "grad_input": _cmp(gx_t, gx_f), "grads": grads,
            "forward": fwd, "backward": bwd, "raw": raw}


def inputs() -> dict:
    """The data and the full layers, drawn from seed 0 on the CPU, so every rank and device starts from the
    same numbers (``probe_*``: the fixed projections of the outputs that make the losses)."""
    with seeded(0):
        x = torch.randn(BATCH, SEQ, D)
        lin_col, lin_row = nn.Linear(D, 4 * D), nn.Linear(4 * D, D)
        probe_col, probe_d = torch.randn(BATCH, SEQ, 4 * D), torch.randn(BATCH, SEQ, D)
        h = torch.randn(BATCH, SEQ, 4 * D)
        mlp = MLP2()
        block = Block(D, HEADS)
    return {"x": x, "lin_col": lin_col, "lin_row": lin_row, "probe_col": probe_col, "probe_d": probe_d,
            "h": h, "mlp": mlp, "block": block}


def facts(group=None, device="cpu") -> dict:
    """Every comparison on this rank; ``device`` is where the layers run (``cuda:<local_rank>`` with nccl)."""
    tp, rank = (dist.get_world_size(group), dist.get_rank(group)) if dist.is_initialized() else (1, 0)
    data = {k: v.to(device) for k, v in inputs().items()}
    x, probe_col, probe_d, h = data["x"], data["probe_col"], data["probe_d"], data["h"]
    lin_col, lin_row, mlp, block = data["lin_col"], data["lin_row"], data["mlp"], data["block"]
    out: dict = {"tp": tp, "rank": rank}

    # column-parallel, without and with gather_output
    col = ColumnParallelLinear.from_linear(copy.deepcopy(lin_col), group)
    lo, hi = col.shard
    # its output is this rank's columns: compared with those columns of the full output
    c = _compare_module(copy.deepcopy(lin_col), col, x, probe_col, {"weight": 0, "bias": 0}, group, out_slice=(lo, hi))
    c["shard"], c["weight_shape"] = [lo, hi], list(col.weight.shape)
    out["column"] = c
    colg = ColumnParallelLinear.from_linear(copy.deepcopy(lin_col), group, gather_output=True)
    out["column_gather"] = _compare_module(copy.deepcopy(lin_col), colg, x, probe_col, {"weight": 0, "bias": 0}, group)

    # row-parallel, input already split (what a column layer gives) and input full
    row = RowParallelLinear.from_linear(copy.deepcopy(lin_row), group)
    r = _compare_module(copy.deepcopy(lin_row), row, h, probe_d, {"weight": 1, "bias": None}, group, x_slice=row.shard)
    r["shard"], r["weight_shape"] = list(row.shard), list(row.weight.shape)
    out["row"] = r
    rowf = RowParallelLinear.from_linear(copy.deepcopy(lin_row), group, input_is_parallel=False)
    out["row_full_input"] = _compare_module(copy.deepcopy(lin_row), rowf, h, probe_d,
                                            {"weight": 1, "bias": None}, group)

    # MLP, attention, whole block
    dims_mlp = {"fc1.weight": 0, "fc1.bias": 0, "fc2.weight": 1, "fc2.bias": None}
    full_mlp = copy.deepcopy(mlp)
    tp_mlp = TensorParallelMLP.from_linears(mlp.fc1, mlp.fc2, group)
    out["mlp"] = _compare_module(full_mlp, tp_mlp, x, probe_d, dims_mlp, group)
    # what this rank holds, for lesson 07's figure: each parameter's shape and the slice it was cut from
    out["mlp"]["held"] = {"shapes": {n: list(q.shape) for n, q in tp_mlp.named_parameters()},
                          "fc1_rows": list(tp_mlp.fc1.shard), "fc2_cols": list(tp_mlp.fc2.shard),
                          "x_shape": list(x.shape), "full": {"fc1.weight": list(mlp.fc1.weight.shape),
                                                             "fc2.weight": list(mlp.fc2.weight.shape)}}

    class Attn(nn.Module):          # the Block's attention alone, as a module of its own
        def __init__(self, b):
            super().__init__()
            self.q_proj, self.k_proj, self.v_proj, self.o_proj = b.q_proj, b.k_proj, b.v_proj, b.o_proj
            self.b = [b]

        def forward(self, y):
            return self.b[0].attention(y)

    dims_attn = {f"{p}_proj.{w}": 0 for p in "qkv" for w in ("weight", "bias")}
    dims_attn.update({"o_proj.weight": 1, "o_proj.bias": None})
    b_attn = copy.deepcopy(block)
    tp_attn = TensorParallelAttention.from_block(block, group)
    out["attention"] = _compare_module(Attn(b_attn), tp_attn, x, probe_d, dims_attn, group)
    out["attention"]["local_heads"] = tp_attn.local_heads

    dims_block = {"ln1.weight": None, "ln1.bias": None, "ln2.weight": None, "ln2.bias": None}
    dims_block.update({f"attn.{k}": v for k, v in dims_attn.items()})
    dims_block.update({f"mlp.{k}": v for k, v in dims_mlp.items()})
    tp_block = parallelize_block(block, group)
    full_block = copy.deepcopy(block)
    rename = {"q_proj": "attn.q_proj", "k_proj": "attn.k_proj", "v_proj": "attn.v_proj", "o_proj": "attn.o_proj",
              "fc1": "mlp.fc1", "fc2": "mlp.fc2", "ln1": "ln1", "ln2": "ln2"}   # Block name -> TP block name
    out_f, gx_f, _, _ = _run(full_block, x, probe_d)
    out_t, gx_t, fwd, bwd = _run(tp_block, x, probe_d)
    tp_params = dict(tp_block.named_parameters())
    grads = {}
    for name, p in full_block.named_parameters():
        mod, w = name.split(".")
        tp_name = f"{rename[mod]}.{w}"
        grads[name] = _cmp(_full_grad(tp_params[tp_name], dims_block[tp_name], group), p.grad)
    out["block"] = {"out": _cmp(out_t, out_f), "grad_input": _cmp(gx_t, gx_f), "grads": grads,
                    "forward": fwd, "backward": bwd, "raw": _raw_layer(out_t, gx_t, tp_block),
                    "param_bytes_full": sum(p.numel() * p.element_size() for p in full_block.parameters()),
                    "param_bytes_rank": sum(p.numel() * p.element_size() for p in tp_block.parameters())}

    # uneven splits are refused with a bilingual error (before any weight is sliced)
    errors = {}
    for label, make in (("out_features", lambda: ColumnParallelLinear.from_linear(nn.Linear(D, 4 * D + 1), group)),
                        ("in_features", lambda: RowParallelLinear.from_linear(nn.Linear(4 * D + 1, D), group)),
                        ("heads", lambda: TensorParallelAttention.from_block(Block(36, 3), group))):
        try:
            make()
            errors[label] = None
        except LabError as e:
            errors[label] = {"key": e.key, "message": str(e)}
    out["uneven"] = errors

    out["torch"] = _torch_dtensor(mlp, x, probe_d, out, group) if tp > 1 else None
    return out


def _torch_dtensor(mlp: nn.Module, x, probe, ours: dict, group) -> dict:
    """The same MLP through PyTorch's parallelize_module; compared with ours and with the full MLP."""
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh(x.device.type, (dist.get_world_size(group),), mesh_dim_names=("tp",))
    full = copy.deepcopy(mlp)
    tmlp = parallelize_mlp_torch(copy.deepcopy(mlp), mesh["tp"])
    ours_mlp = TensorParallelMLP.from_linears(mlp.fc1, mlp.fc2, group)
    out_f, gx_f, _, _ = _run(full, x, probe)
    out_t, gx_t, fwd, bwd = _run(tmlp, x, probe)
    out_o, gx_o, _, _ = _run(ours_mlp, x, probe)
    local = {n: p.to_local() for n, p in tmlp.named_parameters()}
    ours_p = dict(ours_mlp.named_parameters())
    res = {"param_type": type(tmlp.fc1.weight).__name__,
           "placements": {n: str(p.placements) for n, p in tmlp.named_parameters()},
           "local_shapes": {n: list(t.shape) for n, t in local.items()},
           "out_vs_full": _cmp(out_t, out_f), "out_vs_ours": _cmp(out_t, out_o),
           "grad_input_vs_ours": _cmp(gx_t, gx_o), "grad_input_vs_full": _cmp(gx_t, gx_f),
           "local_grads_vs_ours": {n: _cmp(p.grad.to_local(), ours_p[n].grad) for n, p in tmlp.named_parameters()},
           "local_weights_vs_ours": {n: _cmp(local[n], ours_p[n]) for n in local},
           "forward": fwd, "backward": bwd,
           "raw": {"out": _raw(out_t), "grad_input": _raw(gx_t),
                   "grads": {n: _raw(p.grad.to_local()) for n, p in tmlp.named_parameters()},
                   "weights": {n: _raw(t) for n, t in local.items()}}}
    return res


def main() -> None:
    if not caps.have("cuda"):
        torch.set_num_threads(1)   # two CPU ranks share the machine's cores
    rt = runtime.current()
    runtime.report(backend=rt.backend, device=str(rt.device), **facts(device=rt.device))


if __name__ == "__main__":
    runtime.entrypoint(main)
