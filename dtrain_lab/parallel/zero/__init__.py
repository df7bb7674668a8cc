"""ZeRO stages 1, 2 and 3 written out, after Rajbhandari et al., *ZeRO: Memory Optimizations Toward
Training Trillion Parameter Models* (SC 2020).

Plain data parallelism keeps on every one of the N ranks a full copy of the three *model states*:
parameters, gradients and optimizer state. ZeRO cuts them into N pieces, one piece per rank:

========  ================================  ========================================================
stage     sharded (1/N per rank)            collectives per step (per rank, ring volumes)
========  ================================  ========================================================
1         optimizer state (+ fp32 master)   all-reduce grads 2(N-1)/N·Ψ, all-gather params (N-1)/N·Ψ
2         + gradients                       reduce-scatter grads (N-1)/N·Ψ, all-gather params (N-1)/N·Ψ
3         + parameters                      all-gather (fwd) + all-gather (bwd) + reduce-scatter: 3·(N-1)/N·Ψ
========  ================================  ========================================================

(Ψ is the bytes of one full copy of the parameters / gradients. The paper counts stage 1 *and* 2 as
2Ψ because it lets stage 1 reduce-scatter too; :class:`ShardedOptimizer` stage 1 follows PyTorch's
``ZeroRedundancyOptimizer`` and DDP instead: an all-reduce gives every rank the full averaged gradient
(2Ψ) — that full gradient is precisely what stage 1 keeps in memory — then the parameters are
all-gathered, 3·(N-1)/N·Ψ in all. ``comm_bytes`` counts what this module really sends.)

**Flat partitioning** (as DeepSpeed does): all parameters, in order, are laid end to end in one flat
buffer, padded with zeros to a multiple of N; rank r owns the contiguous slice
``[r·S, (r+1)·S)`` with ``S = ceil(P / N)``. The module's parameters become views into the flat
buffer, so "all-gather the parameters" is one ``all_gather_single`` into that buffer. The optimizer
sees this rank's slice cut at parameter boundaries, one tensor per parameter it overlaps, so that a
parameter without a gradient (frozen, or unused in a step) is skipped exactly as ``torch.optim`` skips
it (:mod:`~dtrain_lab.parallel.zero.flat`); the padding gets no optimizer state.

**Precision.** With fp32 parameters the optimizer works directly on this rank's slice of the flat
buffer — no extra copy: params 4Ψ, grads 4Ψ, optimizer 8Ψ (Adam's m and v). With bf16/fp16
parameters each rank keeps an fp32 *master* copy of its slice and the optimizer updates that; the new
values are cast back into the bf16 flat buffer before the all-gather: params 2Ψ, grads 2Ψ, optimizer
4Ψ (master) + 8Ψ (m, v) = 12Ψ, the paper's K = 12. Gradients are reduced in the parameters' dtype.

**What a GPU changes.** With ``nccl`` the same calls run on CUDA tensors; NCCL implements
``reduce_scatter_single`` / ``all_gather_single`` natively (gloo on the CPU does too in torch 2.13, which
is what the tests use). Real implementations (DeepSpeed, FSDP) additionally cut the gradients into
buckets that are reduced on a separate CUDA stream *during* backward, and FSDP prefetches the next
unit's all-gather while the current one computes; this file keeps every collective synchronous so
that each step is easy to follow, and does no overlap.

Modules: :mod:`~dtrain_lab.parallel.zero.flat` (the flat buffer, its pieces, counting),
:mod:`~dtrain_lab.parallel.zero.sharded` (:class:`ShardedOptimizer`, stages 1 and 2),
:mod:`~dtrain_lab.parallel.zero.buckets` (stage 2 reduced during backward),
:mod:`~dtrain_lab.parallel.zero.stage3` (:class:`ZeroStage3`). Collectives go through
:class:`dtrain_lab.comm.counted.Comm`, which counts the ring bytes each one sends (``comm_bytes``).
"""
from dtrain_lab.parallel.zero.sharded import ShardedOptimizer, clip_grad_norm_per_shard_WRONG
from dtrain_lab.parallel.zero.stage3 import ZeroStage3, default_units

__all__ = ["ShardedOptimizer", "ZeroStage3", "clip_grad_norm_per_shard_WRONG", "default_units"]
