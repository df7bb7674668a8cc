"""Tensor parallelism from scratch: Megatron-LM's column- and row-parallel layers.

Shoeybi et al. 2019, "Megatron-LM: Training Multi-Billion Parameter Language Models Using Model
Parallelism", section 3. A transformer MLP ``Y = GeLU(X A)``, ``Z = Y B`` is split over ``tp`` ranks:

* ``A`` by **columns** (its output features): rank r holds ``A_r`` and computes ``Y_r = GeLU(X A_r)``
  with no communication, since GeLU acts element by element on its own columns;
* ``B`` by **rows** (its input features): rank r computes the partial sum ``Z_r = Y_r B_r`` and
  ``Z = Σ_r Z_r`` is one All-Reduce.

Two conjugate operators carry the communication (the paper's Figure 3):

* ``f`` (:class:`CopyToTP`): identity forward, All-Reduce of the gradient backward — placed where a
  replicated ``X`` enters the parallel region (every rank's partial ``∂L/∂X`` must be summed);
* ``g`` (:class:`ReduceFromTP`): All-Reduce forward, identity backward — where the region ends.

So one MLP costs one All-Reduce forward and one backward; attention the same, with heads split across
ranks (``q/k/v`` column-parallel, ``o`` row-parallel). In PyTorch the same plan is
``parallelize_module(mlp, mesh, {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()})`` on DTensors
(:func:`parallelize_mlp_torch`).

Every layer is built from a full ``nn.Linear`` (:meth:`ColumnParallelLinear.from_linear`), so the
tests can compare it with the unsplit layer. Functions take their process group (``None``: the
world); with one rank there is nothing to split and no collective runs.
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from dtrain_lab.comm import groups
from dtrain_lab.comm.groups import Group
from dtrain_lab.i18n import LabError
from dtrain_lab.perfmodel import ring_bytes_sent

__all__ = ["CopyToTP", "ReduceFromTP", "GatherFromTP", "ScatterToTP", "f", "g",
           "ColumnParallelLinear", "RowParallelLinear", "TensorParallelMLP", "TensorParallelAttention",
           "TensorParallelBlock", "shard_range", "gather_shards", "parallelize_block",
           "parallelize_mlp_torch", "count_collectives", "tp_comm_bytes", "dp_comm_bytes"]


# ------------------------------------------------------------------------------------- helpers
def shard_range(n: int, tp: int, rank: int, what: str = "features") -> tuple[int, int]:
    """``[start, stop)`` of rank ``rank``'s equal share of ``n`` items; an uneven split is refused."""
    if tp < 1 or not 0 <= rank < tp:
        raise LabError("tp_bad_rank", rank=rank, tp=tp)
    if n % tp:
        raise LabError("tp_uneven", what=what, n=n, tp=tp)
    size = n // tp
    return rank * size, (rank + 1) * size


def _all_gather_last(x: torch.Tensor, group: Group) -> torch.Tensor:
    tp = groups.size(group)
    parts = [torch.empty_like(x) for _ in range(tp)]
    dist.all_gather(parts, x.contiguous(), group=group)
    return torch.cat(parts, dim=-1)


def _my_chunk_last(x: torch.Tensor, group: Group) -> torch.Tensor:
    rank, tp = groups.rank_size(group)
    lo, hi = shard_range(x.shape[-1], tp, rank, "last dimension")
    return x[..., lo:hi].contiguous()


def gather_shards(t: torch.Tensor, dim: int, group: Group = None) -> torch.Tensor:
    """All-Gather every rank's shard of ``t`` and concatenate along ``dim`` (no autograd; for checks)."""
    tp = groups.size(group)
    if tp == 1:
        return t.detach().clone()
    parts = [torch.empty_like(t) for _ in range(tp)]
    dist.all_gather(parts, t.detach().contiguous(), group=group)
    return torch.cat(parts, dim=dim)


# ------------------------------------------------------------------------ the paper's operators
class CopyToTP(torch.autograd.Function):
    """Megatron's ``f``: identity in forward, All-Reduce (sum) of the gradient in backward.

    Put where a replicated activation enters a tensor-parallel region: each rank uses the same ``X``
    with its own weight shard, so each holds only part of ``∂L/∂X``; the sum is the full gradient.
    """

    @staticmethod
    def forward(ctx, x, group: Group):
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx, grad):
        if groups.size(ctx.group) == 1:
            return grad, None
        grad = grad.contiguous().clone()      # never reduce in place into a buffer autograd shares
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class ReduceFromTP(torch.autograd.Function):
    """Megatron's ``g``: All-Reduce (sum) in forward, identity in backward.

    Put where a tensor-parallel region ends: every rank holds a partial sum ``Y_r B_r`` of the output;
    the gradient of a sum with respect to each term is the output's gradient itself.
    """

    @staticmethod
    def forward(ctx, x, group: Group):
        if groups.size(group) == 1:
            return x
        x = x.contiguous().clone()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class GatherFromTP(torch.autograd.Function):
    """All-Gather along the last dimension forward; keep this rank's slice of the gradient backward
    (``ColumnParallelLinear(gather_output=True)``)."""

    @staticmethod
    def forward(ctx, x, group: Group):
        ctx.group = group
        return x if groups.size(group) == 1 else _all_gather_last(x, group)

    @staticmethod
    def backward(ctx, grad):
        return (grad if groups.size(ctx.group) == 1 else _my_chunk_last(grad, ctx.group)), None


class ScatterToTP(torch.autograd.Function):
    """Keep this rank's slice of the last dimension forward; All-Gather the gradient backward
    (``RowParallelLinear(input_is_parallel=False)``)."""

    @staticmethod
    def forward(ctx, x, group: Group):
        ctx.group = group
        return x if groups.size(group) == 1 else _my_chunk_last(x, group)

    @staticmethod
    def backward(ctx, grad):
        return (grad if groups.size(ctx.group) == 1 else _all_gather_last(grad, ctx.group)), None


def f(x: torch.Tensor, group: Group = None) -> torch.Tensor:
    """Megatron's ``f`` (:class:`CopyToTP`)."""
    return CopyToTP.apply(x, group)


def g(x: torch.Tensor, group: Group = None) -> torch.Tensor:
    """Megatron's ``g`` (:class:`ReduceFromTP`)."""
    return ReduceFromTP.apply(x, group)


# ----------------------------------------------------------------------------------- the layers
class ColumnParallelLinear(nn.Module):
    """``Y = X Aᵀ + b`` with ``A`` (out, in) split on its **output** dimension: this rank holds
    ``out/tp`` rows of the weight and the matching bias entries.

    Input: replicated ``(…, in)``; output: ``(…, out/tp)`` (this rank's columns), or the full
    ``(…, out)`` with ``gather_output=True`` (one All-Gather forward).
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *, gather_output: bool = False,
                 group: Group = None, dtype=None, device=None):
        super().__init__()
        rank, tp = groups.rank_size(group)
        lo, hi = shard_range(out_features, tp, rank, "out_features")
        self.in_features, self.out_features, self.group = in_features, out_features, group
        self.gather_output, self.shard = gather_output, (lo, hi)
        self.weight = nn.Parameter(torch.empty(hi - lo, in_features, dtype=dtype, device=device))
        self.bias = nn.Parameter(torch.empty(hi - lo, dtype=dtype, device=device)) if bias else None

    @classmethod
    def from_linear(cls, linear: nn.Linear, group: Group = None, *, gather_output: bool = False) -> "ColumnParallelLinear":
        """This rank's share of a full ``nn.Linear`` (every rank built it with the same seed)."""
        layer = cls(linear.in_features, linear.out_features, linear.bias is not None, gather_output=gather_output,
                    group=group, dtype=linear.weight.dtype, device=linear.weight.device)
        lo, hi = layer.shard
        with torch.no_grad():
            layer.weight.copy_(linear.weight[lo:hi])
            if layer.bias is not None:
                layer.bias.copy_(linear.bias[lo:hi])
        return layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = f(x, self.group)                        # replicated input; its gradient is summed backward
        y = self.local(x)
        return GatherFromTP.apply(y, self.group) if self.gather_output else y

    def local(self, x: torch.Tensor) -> torch.Tensor:
        """The matmul alone, without ``f``: for several column layers reading one input after a
        single ``f`` (q, k and v in attention: one All-Reduce of ``∂L/∂x`` backward instead of three)."""
        return F.linear(x, self.weight, self.bias)  # (…, in) @ (in, out/tp) -> (…, out/tp)

    def extra_repr(self) -> str:
        return (f"in={self.in_features}, out={self.out_features}, shard=rows {self.shard[0]}:{self.shard[1]}, "
                f"gather_output={self.gather_output}")


class RowParallelLinear(nn.Module):
    """``Z = Y Bᵀ + b`` with ``B`` (out, in) split on its **input** dimension: this rank holds
    ``in/tp`` columns of the weight; the bias is replicated and added once, after the sum.

    Input: this rank's slice ``(…, in/tp)`` (``input_is_parallel=True``, what a
    :class:`ColumnParallelLinear` gives), or the full ``(…, in)`` that the layer slices itself;
    output: the full ``(…, out)`` on every rank, after one All-Reduce (``g``).
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *, input_is_parallel: bool = True,
                 group: Group = None, dtype=None, device=None):
        super().__init__()
        rank, tp = groups.rank_size(group)
        lo, hi = shard_range(in_features, tp, rank, "in_features")
        self.in_features, self.out_features, self.group = in_features, out_features, group
        self.input_is_parallel, self.shard = input_is_parallel, (lo, hi)
        self.weight = nn.Parameter(torch.empty(out_features, hi - lo, dtype=dtype, device=device))
        self.bias = nn.Parameter(torch.empty(out_features, dtype=dtype, device=device)) if bias else None

    @classmethod
    def from_linear(cls, linear: nn.Linear, group: Group = None, *, input_is_parallel: bool = True) -> "RowParallelLinear":
        layer = cls(linear.in_features, linear.out_features, linear.bias is not None,
                    input_is_parallel=input_is_parallel, group=group, dtype=linear.weight.dtype,
                    device=linear.weight.device)
        lo, hi = layer.shard
        with torch.no_grad():
            layer.weight.copy_(linear.weight[:, lo:hi])
            if layer.bias is not None:
                layer.bias.copy_(linear.bias)
        return layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.input_is_parallel:
            x = ScatterToTP.apply(x, self.group)
        z = g(F.linear(x, self.weight), self.group)   # (…, in/tp) @ (in/tp, out): partial sums -> sum
        return z + self.bias if self.bias is not None else z   # bias once, not tp times

    def extra_repr(self) -> str:
        return (f"in={self.in_features}, out={self.out_features}, shard=cols {self.shard[0]}:{self.shard[1]}, "
                f"input_is_parallel={self.input_is_parallel}")


class TensorParallelMLP(nn.Module):
    """``fc2(act(fc1(x)))`` with ``fc1`` column-parallel and ``fc2`` row-parallel: one All-Reduce in
    forward (``g`` in ``fc2``) and one in backward (``f`` in ``fc1``) — when ``x`` needs a gradient."""

    def __init__(self, fc1: ColumnParallelLinear, fc2: RowParallelLinear, act=F.gelu):
        super().__init__()
        self.fc1, self.fc2, self.act = fc1, fc2, act

    @classmethod
    def from_linears(cls, fc1: nn.Linear, fc2: nn.Linear, group: Group = None, act=F.gelu) -> "TensorParallelMLP":
        return cls(ColumnParallelLinear.from_linear(fc1, group), RowParallelLinear.from_linear(fc2, group), act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))     # (…, d) -> (…, 4d/tp) -> (…, d)


class TensorParallelAttention(nn.Module):
    """Causal self-attention of :class:`dtrain_lab.models.Block` with its heads split across ranks:
    ``q/k/v`` column-parallel (rank r computes heads ``r·h/tp … (r+1)·h/tp - 1`` entirely on its own),
    ``o`` row-parallel: one All-Reduce forward (``g`` in ``o``), one backward (a single ``f`` shared
    by ``q``, ``k`` and ``v``; calling the three column layers one by one would apply ``f`` three
    times and All-Reduce ``∂L/∂x`` three times)."""

    def __init__(self, q, k, v, o, n_heads: int, group: Group = None):
        super().__init__()
        tp = groups.size(group)
        if n_heads % tp:
            raise LabError("tp_uneven_heads", heads=n_heads, tp=tp)
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = q, k, v, o
        self.n_heads, self.local_heads, self.group = n_heads, n_heads // tp, group

    @classmethod
    def from_block(cls, block, group: Group = None) -> "TensorParallelAttention":
        tp = groups.size(group)
        if block.n_heads % tp:   # checked before any weight is sliced, so this message comes first
            raise LabError("tp_uneven_heads", heads=block.n_heads, tp=tp)
        col = [ColumnParallelLinear.from_linear(m, group) for m in (block.q_proj, block.k_proj, block.v_proj)]
        return cls(*col, RowParallelLinear.from_linear(block.o_proj, group), block.n_heads, group)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        h = self.local_heads
        hd = self.q_proj.weight.shape[0] // h       # head dimension: d / n_heads, unchanged by TP

        def split(y):  # (B, T, d/tp) -> (B, heads/tp, T, head_dim)
            return y.view(b, t, h, hd).transpose(1, 2)

        x = f(x, self.group)   # one f for q, k and v (Megatron fuses them into one QKV matmul)
        q, k, v = (split(m.local(x)) for m in (self.q_proj, self.k_proj, self.v_proj))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hd)
        mask = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, h * hd)   # this rank's heads side by side
        return self.o_proj(y)


class TensorParallelBlock(nn.Module):
    """:class:`dtrain_lab.models.Block` with tensor-parallel attention and MLP; LayerNorms replicated.
    Two All-Reduces forward, two backward per block."""

    def __init__(self, ln1, attn: TensorParallelAttention, ln2, mlp: TensorParallelMLP):
        super().__init__()
        self.ln1, self.attn, self.ln2, self.mlp = ln1, attn, ln2, mlp

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


def parallelize_block(block, group: Group = None) -> TensorParallelBlock:
    """This rank's :class:`TensorParallelBlock` from a full :class:`dtrain_lab.models.Block`."""
    import copy

    return TensorParallelBlock(copy.deepcopy(block.ln1), TensorParallelAttention.from_block(block, group),
                               copy.deepcopy(block.ln2), TensorParallelMLP.from_linears(block.fc1, block.fc2, group))


# ------------------------------------------------------------------------- PyTorch's own version
def parallelize_mlp_torch(mlp: nn.Module, mesh, fc1: str = "fc1", fc2: str = "fc2") -> nn.Module:
    """PyTorch's DTensor tensor parallelism on the same MLP: ``fc1`` colwise, ``fc2`` rowwise
    (``torch.distributed.tensor.parallel.parallelize_module``; shards ``mlp`` in place)."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    return parallelize_module(mlp, mesh, {fc1: ColwiseParallel(), fc2: RowwiseParallel()})


def count_collectives(fn, *args, **kwargs) -> tuple[object, dict[str, int]]:
    """Run ``fn(*args, **kwargs)`` under ``CommDebugMode`` and return ``(result, {op: count})``.

    ``CommDebugMode`` sees both our ``dist.all_reduce`` calls (the ``c10d.allreduce_`` op) and
    DTensor's functional collectives (``c10d_functional.all_reduce``); names are shortened to
    ``all_reduce``/``all_gather``/… so the two can be compared.
    """
    from torch.distributed.tensor.debug import CommDebugMode

    with CommDebugMode() as mode:
        out = fn(*args, **kwargs)
    counts: dict[str, int] = {}
    for op, n in mode.get_comm_counts().items():
        name = str(op).split(".")[-1].strip("_").replace("allreduce", "all_reduce")
        name = name.replace("allgather", "all_gather").replace("_into_tensor", "").replace("_base", "")
        counts[name] = counts.get(name, 0) + n
    return out, counts


# ------------------------------------------------------------------------------------ cost model
def tp_comm_bytes(tokens: int, d: int, tp: int, bytes_per_elem: int = 4, allreduces: int = 2) -> dict:
    """What one tensor-parallel layer communicates per step: ``allreduces`` All-Reduces (forward +
    backward) of an activation ``(tokens, d)``; each rank sends ``2(tp-1)/tp`` of it per ring All-Reduce."""
    payload = tokens * d * bytes_per_elem
    return {"payload_bytes": payload, "allreduces": allreduces,
            "sent_per_rank": allreduces * ring_bytes_sent(payload, tp)}


def dp_comm_bytes(num_params: int, dp: int, bytes_per_elem: int = 4) -> dict:
    """What data parallelism communicates for the same layer: one All-Reduce of its gradients."""
    payload = num_params * bytes_per_elem
    return {"payload_bytes": payload, "allreduces": 1, "sent_per_rank": ring_bytes_sent(payload, dp)}
