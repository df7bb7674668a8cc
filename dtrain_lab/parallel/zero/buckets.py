"""Stage 2 with the gradients reduced during backward, bucket by bucket, each piece to its owner.

The parameters are grouped, last first (backward produces their gradients first), into buckets of at
least ``bucket_numel`` elements; each bucket is a contiguous range of the flat buffer. A
``register_post_accumulate_grad_hook`` on every trainable parameter counts the gradients that are
ready; once a bucket is complete its gradients are copied into one buffer, freed, and each piece of the
buffer is ``reduce``-d (summed) to the rank that owns it (a bucket rarely splits evenly over the
ranks, so one reduce-scatter cannot do it). Then at most about one bucket of full gradients is alive at
a time. A reduce is counted as a chain: every rank but the owner sends the piece once, so per step a
rank sends Ψ minus its own slice, the same (N-1)/N·Ψ as a reduce-scatter. Every rank must run the same
backward graph (the buckets are reduced in the order their gradients become ready); buckets some
parameter of which got no gradient are reduced at the end of backward, in the same order everywhere.

DeepSpeed's stage 2 buckets the same way but, by default, does not reduce per owner: in DeepSpeed
0.19.8 ``use_multi_rank_bucket_allreduce: bool = True`` (``deepspeed/runtime/zero/config.py``), and
``average_tensor`` (``stage_1_and_2.py``) keys every slice ``("allreduce", process_group)`` when
``self.use_multi_rank_bucket_allreduce or len(copy_ranks) > 1``, so the whole bucket is all-reduced
(``allreduce_and_scatter``) and each rank keeps its own slices. Only with the flag off does it issue
one reduce per owner (``("reduce", dst, process_group)``, ``allreduce_no_retain(..., rank=dst)``), which
is what this module does.
"""
from __future__ import annotations

import torch


class BucketReducer:
    def __init__(self, opt, bucket_numel: int):
        self.opt = opt
        params = opt.params
        buckets, current = [], []
        for i in reversed(range(len(params))):
            current.append(i)
            if sum(params[j].numel() for j in current) >= bucket_numel:
                buckets.append(sorted(current))
                current = []
        if current:
            buckets.append(sorted(current))
        self.buckets = buckets
        self.need = [sum(params[i].requires_grad for i in b) for b in buckets]
        self.ready = [0] * len(buckets)
        self.done = [False] * len(buckets)
        self.live = 0                      # elements of p.grad not yet reduced
        self._callback_queued = False
        bucket_of = {i: k for k, b in enumerate(buckets) for i in b}
        self.hooks = [p.register_post_accumulate_grad_hook(self._make_hook(bucket_of[i]))
                      for i, p in enumerate(params) if p.requires_grad]

    def _make_hook(self, k: int):
        def hook(param):
            if not self._callback_queued:
                self._callback_queued = True
                torch.autograd.Variable._execution_engine.queue_callback(self._end_of_backward)
            self.live += param.numel()
            self.opt.peak_grad_numel = max(self.opt.peak_grad_numel, self.live)
            self.ready[k] += 1
            if self.ready[k] == self.need[k]:
                self._reduce(k)
        return hook

    @torch.no_grad()
    def _reduce(self, k: int) -> None:
        """Copy the bucket's gradients into one buffer, free them, then for every rank whose slice the
        bucket overlaps ``reduce`` (sum) that piece to its owner, who adds it to its gradient shard.
        DeepSpeed's stage 2 ``average_tensor`` does this only with ``use_multi_rank_bucket_allreduce``
        set to false; by default (true) it all-reduces the whole bucket instead (module docstring)."""
        opt, flat, idx = self.opt, self.opt.flat, self.buckets[k]
        a = flat.offsets[idx[0]]
        b = flat.offsets[idx[-1]] + opt.params[idx[-1]].numel()
        buf = torch.zeros(b - a, dtype=flat.dtype, device=flat.device)
        for i in idx:
            p = opt.params[i]
            if p.grad is not None:
                off = flat.offsets[i] - a
                buf[off:off + p.numel()].copy_(p.grad.reshape(-1))
                flat.had_grad[i] = True
                self.live -= p.numel()
                p.grad = None
        if flat.grad is None:
            flat.grad = torch.zeros(flat.shard_numel, dtype=flat.dtype, device=flat.device)
        if opt.world_size > 1:
            buf.div_(opt.world_size)
        size = flat.shard_numel
        for r in range(a // size, (b - 1) // size + 1):
            lo, hi = max(a, r * size), min(b, (r + 1) * size)
            piece = buf[lo - a:hi - a]
            opt._comm.reduce(piece, r)
            if r == opt.rank:
                flat.grad[lo - r * size:hi - r * size] += piece
        self.done[k] = True

    def _end_of_backward(self) -> None:
        self._callback_queued = False
        for k in range(len(self.buckets)):
            if not self.done[k] and self.need[k]:
                self._reduce(k)
        self.ready = [0] * len(self.buckets)
        self.done = [False] * len(self.buckets)
