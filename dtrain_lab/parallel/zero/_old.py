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
``[r·S, (r+1)·S)`` with ``S = ceil(P / N)``. Every rank then holds optimizer state for exactly S
elements (the padding is real memory and is counted; its gradient is always 0, so Adam, AdamW and
SGD leave it at 0). The module's parameters become views into the flat buffer, so "all-gather the
parameters" is one ``all_gather_into_tensor`` into that buffer.

**Precision.** With fp32 parameters the optimizer works directly on this rank's slice of the flat
buffer — no extra copy: params 4Ψ, grads 4Ψ, optimizer 8Ψ (Adam's m and v). With bf16/fp16
parameters each rank keeps an fp32 *master* copy of its slice and the optimizer updates that; the new
values are cast back into the bf16 flat buffer before the all-gather: params 2Ψ, grads 2Ψ, optimizer
4Ψ (master) + 8Ψ (m, v) = 12Ψ, the paper's K = 12. Gradients are reduced in the parameters' dtype.

**What a GPU changes.** With ``nccl`` the same calls run on CUDA tensors; NCCL implements
``reduce_scatter`` / ``all_gather_into_tensor`` natively (gloo on the CPU does too in torch 2.13, which
is what the tests use). Real implementations (DeepSpeed, FSDP) additionally cut the gradients into
buckets that are reduced on a separate CUDA stream *during* backward, and FSDP prefetches the next
unit's all-gather while the current one computes; this file keeps every collective synchronous so
that each step is easy to follow, and does no overlap.
"""
from __future__ import annotations

import math
from typing import Iterable

import torch
import torch.distributed as dist
import torch.nn as nn

from dtrain_lab.i18n import LabError

__all__ = ["ShardedOptimizer", "ZeroStage3", "clip_grad_norm_per_shard_WRONG", "default_units",
           "ring_bytes"]

LOW_PRECISION = (torch.bfloat16, torch.float16)


# ----------------------------------------------------------------------------------- helpers
def _group_info(process_group) -> tuple[int, int]:
    """(rank, world size) in ``process_group``; (0, 1) when torch.distributed is not initialised."""
    if not dist.is_available() or not dist.is_initialized():
        if process_group is not None:
            raise LabError("zero_opt_no_process_group")
        return 0, 1
    return dist.get_rank(process_group), dist.get_world_size(process_group)


def ring_bytes(op: str, buffer_bytes: int, world_size: int) -> int:
    """Bytes one rank sends for ``op`` on a buffer of ``buffer_bytes`` with a ring algorithm.

    reduce-scatter and all-gather: (N-1)/N of the (full) buffer; all-reduce = both: 2(N-1)/N.
    (``reduce``, used by stage 2 with ``reduce_in_backward=True``, is counted in ``_Comm.reduce_sum``.)
    """
    n = world_size
    if op == "all_reduce":
        return 2 * (n - 1) * buffer_bytes // n
    if op in ("reduce_scatter", "all_gather"):
        return (n - 1) * buffer_bytes // n
    raise ValueError(op)


def _nbytes(t: torch.Tensor | None) -> int:
    return 0 if t is None else t.numel() * t.element_size()


class _Comm:
    """Issue the three collectives and count the bytes each one moves (``ring_bytes``)."""

    def __init__(self, process_group, rank: int, world_size: int):
        self.group, self.rank, self.world_size = process_group, rank, world_size
        self.bytes = {"all_reduce": 0, "reduce_scatter": 0, "all_gather": 0, "reduce": 0}
        self.calls = {"all_reduce": 0, "reduce_scatter": 0, "all_gather": 0, "reduce": 0}

    def _count(self, op: str, t: torch.Tensor) -> None:
        self.bytes[op] += ring_bytes(op, _nbytes(t), self.world_size)
        self.calls[op] += 1

    def all_reduce_mean(self, flat: torch.Tensor) -> None:
        if self.world_size > 1:
            flat.div_(self.world_size)   # divide first (no overflow in fp16), as DDP does
            dist.all_reduce(flat, group=self.group)
            self._count("all_reduce", flat)

    def reduce_scatter_mean(self, out: torch.Tensor, flat: torch.Tensor) -> None:
        if self.world_size > 1:
            flat.div_(self.world_size)
            dist.reduce_scatter_tensor(out, flat, group=self.group)
            self._count("reduce_scatter", flat)
        else:
            out.copy_(flat)

    def reduce_sum(self, t: torch.Tensor, dst: int) -> None:
        """Sum ``t`` over the ranks into rank ``dst`` (group rank) of the group. Counted as a chain
        (pipelined) reduce: every rank but ``dst`` sends the whole buffer once, ``dst`` sends nothing."""
        if self.world_size > 1:
            root = dst if self.group is None else dist.get_global_rank(self.group, dst)
            dist.reduce(t, dst=root, group=self.group)
            self.bytes["reduce"] += 0 if dst == self.rank else _nbytes(t)
            self.calls["reduce"] += 1

    def all_gather(self, out: torch.Tensor, shard: torch.Tensor) -> None:
        if self.world_size > 1:
            dist.all_gather_into_tensor(out, shard, group=self.group)
            self._count("all_gather", out)
        else:
            out.copy_(shard)


def _check_params(params, what: str) -> list[torch.Tensor]:
    params = list(params)
    if not params or any(isinstance(p, dict) for p in params):
        raise LabError("zero_opt_bad_params", what=what)
    if len({id(p) for p in params}) != len(params):
        raise LabError("zero_opt_shared_params", what=what)
    dtypes = {p.dtype for p in params}
    devices = {p.device for p in params}
    if len(dtypes) > 1 or len(devices) > 1:
        raise LabError("zero_opt_mixed_dtypes", dtypes=sorted(map(str, dtypes | devices)))
    return params


class _FlatShard:
    """One flat, padded buffer over ``params`` and this rank's slice of it.

    * ``full``: ``N·S`` elements in the params' dtype; the params are views into it.
    * ``shard``: ``full[r·S:(r+1)·S]`` (stages 1/2) or a separate persistent tensor (stage 3).
    * ``master``: the tensor the optimizer updates — ``shard`` itself for fp32, an fp32 copy otherwise.
    """

    def __init__(self, params: list[torch.Tensor], rank: int, world_size: int, *, keep_full: bool):
        self.params = params
        self.dtype, self.device = params[0].dtype, params[0].device
        self.numel = sum(p.numel() for p in params)
        self.shard_numel = math.ceil(self.numel / world_size)
        self.padded_numel = self.shard_numel * world_size
        self.rank, self.world_size = rank, world_size
        self.offsets = []
        full = torch.zeros(self.padded_numel, dtype=self.dtype, device=self.device)
        offset = 0
        with torch.no_grad():
            for p in params:
                full[offset:offset + p.numel()].copy_(p.reshape(-1))
                self.offsets.append(offset)
                offset += p.numel()
        lo, hi = rank * self.shard_numel, (rank + 1) * self.shard_numel
        if keep_full:                       # stages 1/2: full buffer persists, shard is a view of it
            self.full = full
            self.shard = full[lo:hi]
        else:                               # stage 3: only the shard persists
            self.shard = full[lo:hi].clone()
            self.full = full
        for p, off in zip(params, self.offsets):
            p.data = self.full[off:off + p.numel()].view_as(p)
        if self.dtype in LOW_PRECISION:
            self.master = nn.Parameter(self.shard.detach().float().clone())
        else:
            self.master = nn.Parameter(self.shard)   # shares storage: the optimizer updates it in place
        self.grad: torch.Tensor | None = None     # this rank's averaged gradient shard, params' dtype

    def flat_grads(self) -> torch.Tensor:
        """The params' gradients laid end to end in a new padded flat buffer (zeros for None)."""
        flat = torch.zeros(self.padded_numel, dtype=self.dtype, device=self.device)
        for p, off in zip(self.params, self.offsets):
            if p.grad is not None:
                flat[off:off + p.numel()].copy_(p.grad.reshape(-1))
        return flat

    def add_grad_shard(self, g: torch.Tensor) -> None:
        self.grad = g if self.grad is None else self.grad.add_(g)

    def load_master_grad(self) -> None:
        g = self.grad if self.grad is not None else torch.zeros_like(self.shard)
        self.master.grad = g.float() if self.master.dtype != g.dtype else g

    def copy_master_to_shard(self) -> None:
        if self.master.data_ptr() != self.shard.data_ptr():
            with torch.no_grad():
                self.shard.copy_(self.master)


def _optimizer_bytes(masters: list[nn.Parameter], shards: list[torch.Tensor], optimizer) -> int:
    """Master copies that are not the shard itself + every per-element optimizer state tensor.

    Zero-dimensional state (Adam's ``step`` counter) is left out: it does not scale with Ψ.
    """
    total = sum(_nbytes(m) for m, s in zip(masters, shards) if m.data_ptr() != s.data_ptr())
    for m in masters:
        for value in optimizer.state.get(m, {}).values():
            if torch.is_tensor(value) and value.dim() > 0 and value.numel() == m.numel():
                total += _nbytes(value)
    return total


def _global_norm(comm: _Comm, shard_grads: list[torch.Tensor]) -> torch.Tensor:
    """sqrt of the sum over ranks of the squared norms of the shards: the norm of the full gradient."""
    local = torch.zeros((), dtype=torch.float32, device=shard_grads[0].device)
    for g in shard_grads:
        local += g.float().pow(2).sum()
    if comm.world_size > 1:
        dist.all_reduce(local, group=comm.group)   # one number: not counted in comm_bytes
    return local.sqrt()


def _clip_(grads: list[torch.Tensor], total_norm: torch.Tensor, max_norm: float) -> None:
    coef = torch.clamp(max_norm / (total_norm + 1e-6), max=1.0)   # as torch.nn.utils.clip_grad_norm_
    for g in grads:
        g.mul_(coef.to(g.dtype))


# ------------------------------------------------------------------------------ stages 1 and 2
class ShardedOptimizer:
    """ZeRO stage 1 or 2 around any ``torch.optim`` optimizer (Adam, AdamW, SGD, …).

    ``ShardedOptimizer(model.parameters(), torch.optim.AdamW, stage=2, lr=1e-3)``; then per step
    ``loss.backward(); opt.clip_grad_norm_(1.0)`` (optional) ``; opt.step(); opt.zero_grad()``. Do not
    wrap the model in DDP: this class averages the gradients itself. Every rank must start from the same
    parameters (same seed).

    ``step()``:

    1. **reduce** (:meth:`reduce_gradients`, also called by :meth:`clip_grad_norm_`). Stage 1:
       ``all_reduce`` the flat gradient (every rank gets the full average) and keep the full ``p.grad``,
       as PyTorch's DDP + ``ZeroRedundancyOptimizer`` do: 2(N-1)/N·Ψ. ``grad_reduce="reduce_scatter"``
       gives the paper's stage 1 instead: a reduce-scatter ((N-1)/N·Ψ) averages only this rank's slice,
       the full local gradient buffer is kept all the same (``p.grad`` then holds the *local*, not the
       averaged, gradient); stages 1 and 2 then send the same 2(N-1)/N·Ψ per step.
       Stage 2: ``reduce_scatter_tensor`` — each rank receives only the average of *its* slice — then
       ``p.grad = None`` frees the full gradients. By default this happens in ``step()``, after
       backward, so the *peak* still holds every full gradient (plus the flat copy being reduced) for
       a moment; what stage 2 saves is the gradient memory kept from then on (the update, the next
       forward). With ``reduce_in_backward=True`` (stage 2 only) the gradients are reduced *during*
       backward instead, as DeepSpeed does: the parameters are grouped, last first, into buckets of
       ``bucket_numel`` elements; a ``register_post_accumulate_grad_hook`` on every parameter counts
       the gradients that are ready, and once a bucket is complete its gradients are copied into one
       buffer, freed, and each piece of the buffer is ``reduce``-d (summed) to the rank that owns it
       (a bucket rarely splits evenly over the ranks, so one reduce-scatter cannot do it). Then at
       most about one bucket of full gradients is alive at a time (``peak_grad_numel``). A reduce is
       counted as a chain: every rank but the owner sends the piece once, so per step a rank sends
       Ψ minus its own slice, the same (N-1)/N·Ψ as a reduce-scatter. Every rank must run the same
       backward graph (the buckets are reduced in the order their gradients become ready).
    2. **update**: the wrapped optimizer, built over this rank's slice only, updates it (fp32 master for
       bf16/fp16 parameters, cast back afterwards).
    3. **all-gather** the flat parameter buffer (``all_gather_into_tensor``) so that every rank has every
       parameter again. PyTorch's ``ZeroRedundancyOptimizer`` instead gives each rank whole
       parameters (greedily: largest first, to the least-loaded rank — so its shards are uneven) and
       lets each owner ``broadcast`` its updated parameters; same result, no flat buffer needed.

    ``peak_grad_numel`` — the most ``p.grad`` elements alive at once (the temporary flat copy not
    counted): all P without ``reduce_in_backward``, about one bucket with it.

    ``state_bytes()`` — bytes of the tensors this rank keeps for the step (padding included):
    ``params`` the flat buffer (full, stages 1/2); ``grads`` the gradients alive when the update runs
    (stage 1: the full ``p.grad``; stage 2: this rank's shard); ``optimizer`` the fp32 master slice
    (only for bf16/fp16 params) plus every per-element state tensor (Adam: m and v).
    """

    def __init__(self, params: Iterable[torch.Tensor], optimizer_class, *, stage: int = 1,
                 process_group=None, grad_reduce: str | None = None, reduce_in_backward: bool = False,
                 bucket_numel: int = 2 ** 20, **optimizer_kwargs):
        if stage not in (1, 2):
            raise LabError("zero_opt_bad_stage", stage=stage)
        grad_reduce = grad_reduce or ("all_reduce" if stage == 1 else "reduce_scatter")
        if grad_reduce not in ("all_reduce", "reduce_scatter") or (stage == 2 and grad_reduce != "reduce_scatter"):
            raise LabError("zero_opt_bad_grad_reduce", value=grad_reduce, stage=stage)
        self.grad_reduce = grad_reduce
        if reduce_in_backward and stage != 2:
            raise LabError("zero_opt_backward_stage2")
        if not isinstance(bucket_numel, int) or bucket_numel < 1:
            raise LabError("zero_opt_bad_bucket", value=bucket_numel)
        self.stage = stage
        self.params = _check_params(params, "ShardedOptimizer")
        rank, world_size = _group_info(process_group)
        self.rank, self.world_size = rank, world_size
        self._comm = _Comm(process_group, rank, world_size)
        self.flat = _FlatShard(self.params, rank, world_size, keep_full=True)
        self.optimizer = optimizer_class([self.flat.master], **optimizer_kwargs)
        self._reduced = False
        self._grad_bytes = 0
        self._full_grad: torch.Tensor | None = None
        self.live_grad_numel = 0       # elements of p.grad not yet reduced (reduce_in_backward)
        self.peak_grad_numel = 0       # the most p.grad elements alive at once
        self.reduce_in_backward = reduce_in_backward
        self._hooks = []
        if reduce_in_backward:
            self._setup_buckets(bucket_numel)

    # -- stage 2, reduced bucket by bucket during backward
    def _setup_buckets(self, bucket_numel: int) -> None:
        """Group the parameters, last first (backward produces their gradients first), into buckets
        of at least ``bucket_numel`` elements; each bucket is a contiguous range of the flat buffer."""
        buckets, current = [], []
        for i in reversed(range(len(self.params))):
            current.append(i)
            if sum(self.params[j].numel() for j in current) >= bucket_numel:
                buckets.append(sorted(current))
                current = []
        if current:
            buckets.append(sorted(current))
        self._buckets = buckets
        self._bucket_need = [sum(self.params[i].requires_grad for i in b) for b in buckets]
        self._bucket_ready = [0] * len(buckets)
        self._bucket_done = [False] * len(buckets)
        self._callback_queued = False
        bucket_of = {i: k for k, b in enumerate(buckets) for i in b}
        for i, p in enumerate(self.params):
            if p.requires_grad:
                self._hooks.append(p.register_post_accumulate_grad_hook(self._make_hook(bucket_of[i])))

    def _make_hook(self, k: int):
        def hook(param):
            if not self._callback_queued:
                self._callback_queued = True
                torch.autograd.Variable._execution_engine.queue_callback(self._end_of_backward)
            self.live_grad_numel += param.numel()
            self.peak_grad_numel = max(self.peak_grad_numel, self.live_grad_numel)
            self._bucket_ready[k] += 1
            if self._bucket_ready[k] == self._bucket_need[k]:
                self._reduce_bucket(k)
        return hook

    @torch.no_grad()
    def _reduce_bucket(self, k: int) -> None:
        """Copy the bucket's gradients into one buffer, free them, then for every rank whose slice
        the bucket overlaps ``reduce`` (sum) that piece to its owner, who adds it to its gradient shard.
        This is how DeepSpeed's stage 2 ``average_tensor`` reduces a bucket with ``reduce_scatter``
        enabled: one reduce per owner (a bucket rarely splits evenly, so one reduce_scatter cannot do it).
        """
        flat, idx = self.flat, self._buckets[k]
        a = flat.offsets[idx[0]]
        b = flat.offsets[idx[-1]] + self.params[idx[-1]].numel()
        buf = torch.zeros(b - a, dtype=flat.dtype, device=flat.device)
        for i in idx:
            p = self.params[i]
            if p.grad is not None:
                off = flat.offsets[i] - a
                buf[off:off + p.numel()].copy_(p.grad.reshape(-1))
                self.live_grad_numel -= p.numel()
                p.grad = None
        if flat.grad is None:
            flat.grad = torch.zeros(flat.shard_numel, dtype=flat.dtype, device=flat.device)
        if self.world_size > 1:
            buf.div_(self.world_size)
        size = flat.shard_numel
        for r in range(a // size, (b - 1) // size + 1):
            lo, hi = max(a, r * size), min(b, (r + 1) * size)
            piece = buf[lo - a:hi - a]
            self._comm.reduce_sum(piece, r)
            if r == self.rank:
                flat.grad[lo - r * size:hi - r * size] += piece
        self._bucket_done[k] = True

    def _end_of_backward(self) -> None:
        """Buckets some parameter of which got no gradient are reduced here, in the same order on every
        rank; then the counters are reset for the next backward."""
        self._callback_queued = False
        for k in range(len(self._buckets)):
            if not self._bucket_done[k] and self._bucket_need[k]:
                self._reduce_bucket(k)
        self._bucket_ready = [0] * len(self._buckets)
        self._bucket_done = [False] * len(self._buckets)

    # -- properties the lessons read
    @property
    def comm_bytes(self) -> dict[str, int]:
        """Bytes this rank has sent so far per collective (ring volumes, see :func:`ring_bytes`)."""
        return dict(self._comm.bytes)

    @property
    def comm_calls(self) -> dict[str, int]:
        return dict(self._comm.calls)

    @property
    def shard_numel(self) -> int:
        return self.flat.shard_numel

    @property
    def master(self) -> torch.Tensor:
        """The tensor the wrapped optimizer updates (this rank's slice, fp32 for bf16/fp16 params)."""
        return self.flat.master

    @property
    def param_groups(self):
        return self.optimizer.param_groups

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()
        self.flat.grad = None
        self.flat.master.grad = None
        self._full_grad = None
        self._reduced = False

    def reduce_gradients(self) -> None:
        """Average the gradients across ranks (once per step; see the class docstring)."""
        if self._reduced:
            return
        flat = self.flat
        if self.reduce_in_backward:           # done bucket by bucket during backward already
            if flat.grad is None:
                flat.grad = torch.zeros(flat.shard_numel, dtype=flat.dtype, device=flat.device)
            self._grad_bytes = _nbytes(flat.grad)
            self._reduced = True
            return
        live = sum(p.grad.numel() for p in self.params if p.grad is not None)
        self.peak_grad_numel = max(self.peak_grad_numel, live)
        grads = flat.flat_grads()
        lo, hi = self.rank * flat.shard_numel, (self.rank + 1) * flat.shard_numel
        if self.stage == 1 and self.grad_reduce == "reduce_scatter":
            # the paper's P_os: only this rank's slice is averaged; the full (local) gradient buffer
            # is kept all the same: that memory is what stage 2 gives up
            shard = torch.empty(flat.shard_numel, dtype=flat.dtype, device=flat.device)
            self._comm.reduce_scatter_mean(shard, grads.clone() if self.world_size > 1 else grads)
            self._full_grad = grads
            flat.grad = shard
            for p, off in zip(self.params, flat.offsets):
                if p.grad is not None:
                    p.grad = grads[off:off + p.numel()].view_as(p)
            self._grad_bytes = _nbytes(grads)
        elif self.stage == 1:
            self._comm.all_reduce_mean(grads)
            self._full_grad = grads           # the full averaged gradient stays alive (stage 1)
            flat.grad = grads[lo:hi]          # this rank's slice of it: a view
            for p, off in zip(self.params, flat.offsets):   # p.grad: views of the averaged gradient
                if p.grad is not None:
                    p.grad = grads[off:off + p.numel()].view_as(p)
            self._grad_bytes = _nbytes(grads)
        else:
            shard = torch.empty(flat.shard_numel, dtype=flat.dtype, device=flat.device)
            self._comm.reduce_scatter_mean(shard, grads)
            del grads
            for p in self.params:
                p.grad = None                 # stage 2: the full gradients are freed
            flat.grad = shard
            self._grad_bytes = _nbytes(shard)
        self._reduced = True

    def clip_grad_norm_(self, max_norm: float) -> torch.Tensor:
        """Clip by the norm of the *whole* averaged gradient; returns that norm (same as
        ``torch.nn.utils.clip_grad_norm_`` on the full gradient). Each rank squares and sums its shard,
        one all-reduce adds the N partial sums, the square root is the global norm."""
        self.reduce_gradients()
        total = _global_norm(self._comm, [self.flat.grad])
        _clip_([self._full_grad if self.stage == 1 else self.flat.grad], total, max_norm)
        return total

    @torch.no_grad()
    def step(self, closure=None):
        if closure is not None:
            raise LabError("zero_opt_no_closure")
        self.reduce_gradients()
        self.flat.load_master_grad()
        self.optimizer.step()
        self.flat.copy_master_to_shard()
        flat = self.flat
        self._comm.all_gather(flat.full, flat.shard.clone())   # shard is a view of full: send a copy
        self._reduced = False

    def state_bytes(self) -> dict[str, int]:
        return {"params": _nbytes(self.flat.full), "grads": self._grad_bytes,
                "optimizer": _optimizer_bytes([self.flat.master], [self.flat.shard], self.optimizer)}

    def optimizer_state_numel(self) -> int:
        """Elements of per-element optimizer state on this rank (Adam: 2·S; SGD without momentum: 0)."""
        return sum(v.numel() for v in self.optimizer.state.get(self.flat.master, {}).values()
                   if torch.is_tensor(v) and v.dim() > 0)

    def state_dict(self) -> dict:
        """This rank's shard only: the wrapped optimizer's state dict plus the master slice."""
        return {"optimizer": self.optimizer.state_dict(), "master": self.flat.master.detach().clone(),
                "rank": self.rank, "world_size": self.world_size, "stage": self.stage}

    def load_state_dict(self, state: dict) -> None:
        if state.get("world_size") != self.world_size or state.get("rank") != self.rank:
            raise LabError("zero_opt_state_mismatch", saved=(state.get("rank"), state.get("world_size")),
                           now=(self.rank, self.world_size))
        with torch.no_grad():
            self.flat.master.copy_(state["master"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.flat.copy_master_to_shard()
        self._comm.all_gather(self.flat.full, self.flat.shard.clone())


def clip_grad_norm_per_shard_WRONG(optimizer: ShardedOptimizer, max_norm: float) -> torch.Tensor:
    """The classic ZeRO bug: clip each rank's gradient shard by *its own* norm. Every shard ends up
    with norm <= max_norm, so the whole gradient can have norm up to sqrt(N)·max_norm, and the
    direction changes (shards are scaled by different factors). Returns this rank's local norm."""
    optimizer.reduce_gradients()
    g = optimizer.flat.grad
    local = g.float().norm()
    _clip_([g], local, max_norm)
    return local


# ------------------------------------------------------------------------------------- stage 3
def default_units(module: nn.Module) -> list[nn.Module]:
    """The units ZeroStage3 gathers one at a time: every direct child that has parameters, looking
    through containers (``ModuleList``, ``ModuleDict``, ``Sequential``: their children are units). For
    :class:`dtrain_lab.models.TinyTransformer`: ``tok_emb, pos_emb, blocks.0 … blocks.L-1, ln_f, head``;
    for :class:`dtrain_lab.models.MLP`: each ``Linear`` of ``layers``.
    """
    units = []
    for child in module.children():
        if isinstance(child, (nn.ModuleList, nn.ModuleDict, nn.Sequential)):
            units.extend(default_units(child))
        elif any(True for _ in child.parameters()):
            units.append(child)
    return units


class _PreBackward(torch.autograd.Function):
    """Identity in forward; in backward, gathers the unit's parameters before its own backward runs
    (the gradient of the unit's output reaches this node before any node inside the unit)."""

    @staticmethod
    def forward(ctx, unit, engine, *outputs):
        ctx.unit, ctx.engine = unit, engine
        return outputs if len(outputs) > 1 else outputs[0]

    @staticmethod
    def backward(ctx, *grads):
        ctx.engine._pre_backward(ctx.unit)
        return (None, None) + grads


class _Unit:
    def __init__(self, index: int, name: str, module: nn.Module, params: list[nn.Parameter],
                 flat: _FlatShard):
        self.index, self.name, self.module, self.params, self.flat = index, name, module, params, flat
        self.gathered = False
        self.ready = 0        # params whose gradient has been accumulated in this backward
        self.reduced = True


class ZeroStage3:
    """ZeRO stage 3 (what FSDP calls FULL_SHARD): parameters, gradients and optimizer state sharded.

    ``z = ZeroStage3(model, torch.optim.Adam, lr=1e-3)``; then ``loss = f(z.module(x)); loss.backward();
    z.clip_grad_norm_(1.0)`` (optional) ``; z.step(); z.zero_grad()``.

    The parameters of each *unit* (:func:`default_units`, plus the root module's own parameters as one
    more unit) are laid end to end in one flat buffer; each rank keeps only its ``ceil(numel/N)`` slice
    of every unit. Between steps the full buffers have no storage (``untyped_storage().resize_(0)``,
    the trick torch's FSDP uses in ``torch/distributed/utils.py: _free_storage``); the module's
    parameters stay views into them, so autograd's saved references to them remain valid.

    * forward pre-hook of a unit: re-allocate the storage, ``all_gather_into_tensor`` the shards into it;
    * forward hook: free it again and wrap the unit's outputs in :class:`_PreBackward`, an identity
      autograd Function (``register_full_backward_pre_hook`` works the same way inside torch: it wraps
      the outputs in ``BackwardHookFunction``, torch/utils/hooks.py; the explicit Function shows it);
    * backward, when the gradient reaches the unit's output: gather again (the values the saved
      activations need for the weight's backward);
    * ``register_post_accumulate_grad_hook`` on every parameter: when all parameters of the unit have
      their ``.grad``, lay them out flat, ``reduce_scatter_tensor`` (average) into this rank's gradient
      shard, set ``p.grad = None`` and free the gathered parameters. A callback queued on the
      autograd engine does the same at the end of backward for units some parameters of which got no
      gradient.

    Per step and rank: all-gather Ψ (fwd) + all-gather Ψ (bwd) + reduce-scatter Ψ, each (N-1)/N of
    it sent: the paper's 3Ψ, 1.5 times plain DP's 2Ψ. No activation checkpointing is involved: the
    activations are kept as usual, only the *parameters* are dropped and fetched again.
    ``peak_gathered_numel`` records the most parameter elements ever gathered at once (lesson:
    about one unit, not the whole model). Prefetching the next unit while computing the current one
    (what FSDP does on GPUs with a separate CUDA stream) is left out: every collective is synchronous.
    Parameters shared between units (tied weights) are refused.
    """

    def __init__(self, module: nn.Module, optimizer_class, *, process_group=None, units=None,
                 **optimizer_kwargs):
        self.module = module
        rank, world_size = _group_info(process_group)
        self.rank, self.world_size = rank, world_size
        self._comm = _Comm(process_group, rank, world_size)
        unit_modules = list(units) if units is not None else default_units(module)
        names = {m: n for n, m in module.named_modules()}
        seen: dict[int, str] = {}
        self.units: list[_Unit] = []
        root_params = [p for p in module.parameters()]
        in_units = set()
        plan = []
        for m in unit_modules:
            if m not in names or m is module:
                raise LabError("zero_opt_bad_unit", unit=type(m).__name__)
            ps = [p for p in m.parameters() if p.requires_grad]
            plan.append((names[m], m, ps))
            in_units.update(id(p) for p in ps)
        own = [p for p in root_params if id(p) not in in_units and p.requires_grad]
        if own:
            plan.append(("<root>", module, own))
        for name, m, ps in plan:
            if not ps:
                continue
            for p in ps:
                if id(p) in seen:
                    raise LabError("zero_opt_shared_params", what=f"{seen[id(p)]} / {name}")
                seen[id(p)] = name
            _check_params(ps, name)
            flat = _FlatShard(ps, rank, world_size, keep_full=False)
            unit = _Unit(len(self.units), name, m, ps, flat)
            self.units.append(unit)
            self._free(unit)
        self._hooks = []
        for unit in self.units:
            self._hooks.append(unit.module.register_forward_pre_hook(self._make_pre_forward(unit)))
            self._hooks.append(unit.module.register_forward_hook(self._make_post_forward(unit)))
            for p in unit.params:
                self._hooks.append(p.register_post_accumulate_grad_hook(self._make_post_acc(unit)))
        self.optimizer = optimizer_class([u.flat.master for u in self.units], **optimizer_kwargs)
        self._callback_queued = False
        self._grad_bytes = 0
        self.gathered_numel = 0
        self.peak_gathered_numel = 0
        self.peak_gathered_units = 0

    # -- gather / free
    def _gather(self, unit: _Unit) -> None:
        if unit.gathered:
            return
        full = unit.flat.full
        full.untyped_storage().resize_(full.numel() * full.element_size())
        with torch.no_grad():
            self._comm.all_gather(full, unit.flat.shard)
        unit.gathered = True
        self.gathered_numel += full.numel()
        self.peak_gathered_numel = max(self.peak_gathered_numel, self.gathered_numel)
        self.peak_gathered_units = max(self.peak_gathered_units, sum(u.gathered for u in self.units))

    def _free(self, unit: _Unit) -> None:
        full = unit.flat.full
        if full.untyped_storage().size():
            full.untyped_storage().resize_(0)
        if unit.gathered:
            self.gathered_numel -= full.numel()
        unit.gathered = False

    def _make_pre_forward(self, unit):
        def hook(module, args):
            self._gather(unit)
        return hook

    def _make_post_forward(self, unit):
        def hook(module, args, output):
            self._free(unit)
            if not torch.is_grad_enabled():
                return None
            if torch.is_tensor(output) and output.requires_grad:
                unit.reduced = False
                return _PreBackward.apply(unit, self, output)
            if isinstance(output, tuple) and any(torch.is_tensor(o) and o.requires_grad for o in output):
                unit.reduced = False
                wrapped = _PreBackward.apply(unit, self, *output)
                return wrapped if isinstance(wrapped, tuple) else (wrapped,)
            raise LabError("zero_opt_unit_output", unit=unit.name)
        return hook

    def _pre_backward(self, unit: _Unit) -> None:
        if not self._callback_queued:
            self._callback_queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._end_of_backward)
        self._gather(unit)

    def _make_post_acc(self, unit):
        def hook(param):
            unit.ready += 1
            if unit.ready == len(unit.params):
                self._reduce_unit(unit)
        return hook

    def _reduce_unit(self, unit: _Unit) -> None:
        flat = unit.flat
        with torch.no_grad():
            grads = flat.flat_grads()
            for p in unit.params:
                p.grad = None
            shard = torch.empty(flat.shard_numel, dtype=flat.dtype, device=flat.device)
            self._comm.reduce_scatter_mean(shard, grads)
            del grads
            flat.add_grad_shard(shard)
        unit.ready = 0
        unit.reduced = True
        self._free(unit)

    def _end_of_backward(self) -> None:
        self._callback_queued = False
        for unit in self.units:      # same order on every rank: the collectives must match
            if not unit.reduced or unit.ready:
                self._reduce_unit(unit)
            self._free(unit)

    # -- optimizer-side API
    @property
    def comm_bytes(self) -> dict[str, int]:
        return dict(self._comm.bytes)

    @property
    def comm_calls(self) -> dict[str, int]:
        return dict(self._comm.calls)

    def zero_grad(self, set_to_none: bool = True) -> None:
        for unit in self.units:
            unit.flat.grad = None
            unit.flat.master.grad = None
            for p in unit.params:
                p.grad = None

    def clip_grad_norm_(self, max_norm: float) -> torch.Tensor:
        grads = [u.flat.grad for u in self.units if u.flat.grad is not None]
        if not grads:
            return torch.zeros(())
        total = _global_norm(self._comm, grads)
        _clip_(grads, total, max_norm)
        return total

    @torch.no_grad()
    def step(self, closure=None):
        if closure is not None:
            raise LabError("zero_opt_no_closure")
        self._grad_bytes = sum(_nbytes(u.flat.grad) for u in self.units)
        for unit in self.units:
            unit.flat.load_master_grad()
        self.optimizer.step()
        for unit in self.units:
            unit.flat.copy_master_to_shard()

    def state_bytes(self) -> dict[str, int]:
        """Bytes kept between steps: parameter shards, gradient shards (at the last step), optimizer
        state (fp32 masters if the params are bf16/fp16, plus per-element state). Padding included."""
        return {"params": sum(_nbytes(u.flat.shard) for u in self.units),
                "grads": self._grad_bytes,
                "optimizer": _optimizer_bytes([u.flat.master for u in self.units],
                                              [u.flat.shard for u in self.units], self.optimizer)}

    def optimizer_state_numel(self) -> int:
        return sum(v.numel() for u in self.units for v in self.optimizer.state.get(u.flat.master, {}).values()
                   if torch.is_tensor(v) and v.dim() > 0)

    def gather_full_state_dict(self) -> dict[str, torch.Tensor]:
        """The unsharded ``module.state_dict()`` (copies) on every rank: one unit at a time is
        all-gathered, copied and freed again. These all-gathers count in ``comm_bytes``."""
        names = {id(p): n for n, p in self.module.named_parameters()}
        values = {}
        with torch.no_grad():
            for unit in self.units:
                self._gather(unit)
                for p in unit.params:
                    values[names[id(p)]] = p.detach().clone()
                self._free(unit)
            state = {}
            for k, v in self.module.state_dict(keep_vars=True).items():
                state[k] = values[k] if k in values else v.detach().clone()
        return state
