"""Lesson 02b §3: batch normalisation with the statistics of the *global* batch, what
``torch.nn.SyncBatchNorm`` computes, written out with an all-reduce so that it also runs on CPU/gloo.

    torchrun --standalone --nproc-per-node 2 -m dtrain_lab.demos.dp_practices sync_bn

In training mode, ``nn.SyncBatchNorm`` in torch 2.13 accepts only CUDA (or XPU, HPU, PrivateUse1)
inputs once a process group of more than one rank exists; a CPU input raises ``ValueError``
(``torch/nn/modules/batchnorm.py``). On a GPU job the real module runs too and is compared.
"""
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from dtrain_lab.jobs import runtime
from dtrain_lab.data import shard


class AllReduceSum(torch.autograd.Function):
    """``y = Σ_ranks x`` on every rank. Backward: every rank's loss depends on ``y``, so the gradient
    of ``x`` is the sum over ranks of ``dL_k/dy``: an all-reduce again (SyncBatchNorm's backward
    all-reduces its two gradient sums the same way)."""

    @staticmethod
    def forward(ctx, x, group=None):
        ctx.group = group
        y = x.clone()
        dist.all_reduce(y, group=group)
        return y

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


def sync_batch_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float = 1e-5,
                    group=None) -> torch.Tensor:
    """Batch norm of ``x`` (N, C) with the mean and biased variance of the global batch (every rank's
    N rows): one all-reduce of the per-channel ``[Σx, Σx², count]``. Sums add up across ranks whatever
    their batch sizes. (PyTorch all-gathers each rank's mean, 1/std and count instead, and combines
    them, which is numerically safer than ``E[x²] - E[x]²``.) A world of one is plain batch norm."""
    count = torch.full((1, x.shape[1]), float(x.shape[0]), dtype=x.dtype, device=x.device)
    stats = torch.cat([x.sum(0, keepdim=True), (x * x).sum(0, keepdim=True), count])   # (3, C)
    if dist.is_initialized() and dist.get_world_size(group) > 1:
        stats = AllReduceSum.apply(stats, group)
    total, total_sq, n = stats
    mean = total / n
    var = total_sq / n - mean * mean                                  # biased, as batch norm normalises
    return (x - mean) / torch.sqrt(var + eps) * weight + bias


def sync_bn() -> None:
    """Our sync_batch_norm and per-rank BatchNorm against single-process BatchNorm on the global batch."""
    rt = runtime.current()
    g = torch.Generator().manual_seed(0)
    n, c = 8 * rt.world_size, 3
    x_global = torch.randn(n, c, generator=g)
    x_global[n // 2:] += 3.0          # the second half of the batch comes from a shifted distribution
    w_loss = torch.randn(n, c, generator=g)      # a fixed weighting, so that the loss has a gradient
    weight, bias = torch.ones(c), torch.zeros(c)

    # the reference: one process, the whole global batch
    xg = x_global.clone().requires_grad_(True)
    y_ref = F.batch_norm(xg, None, None, weight, bias, training=True)
    (y_ref * w_loss).sum().backward()
    y_ref_mine = shard(y_ref.detach(), rt.rank, rt.world_size)
    grad_ref_mine = shard(xg.grad, rt.rank, rt.world_size)

    x_mine = shard(x_global, rt.rank, rt.world_size).to(rt.device)
    w_mine = shard(w_loss, rt.rank, rt.world_size).to(rt.device)
    out = {}
    # 1. plain BatchNorm on each rank: statistics of the local shard only
    y_local = F.batch_norm(x_mine, None, None, weight.to(rt.device), bias.to(rt.device), training=True)
    out["local_bn_max_diff"] = (y_local.cpu() - y_ref_mine).abs().max().item()
    # 2. ours: global statistics through one all-reduce, forward and backward
    xm = x_mine.clone().requires_grad_(True)
    y_sync = sync_batch_norm(xm, weight.to(rt.device), bias.to(rt.device))
    (y_sync * w_mine).sum().backward()
    out["ours_max_diff"] = (y_sync.detach().cpu() - y_ref_mine).abs().max().item()
    out["ours_grad_max_diff"] = (xm.grad.cpu() - grad_ref_mine).abs().max().item()
    # 3. PyTorch's SyncBatchNorm, where this device allows it
    bn = nn.SyncBatchNorm(c, affine=False).to(rt.device)
    try:
        y_torch = bn(x_mine)
        out["torch_max_diff"] = (y_torch.detach().cpu() - y_ref_mine).abs().max().item()
        out["torch_error"] = None
    except ValueError as e:
        out["torch_max_diff"], out["torch_error"] = None, f"{type(e).__name__}: {e}"
    out["device"] = str(rt.device)
    runtime.report(sync_bn=out)
