"""Gradient compression: send fewer bytes per step, and see what it costs the loss (lesson 04).

Data parallelism all-reduces the whole gradient every step (see :mod:`dtrain_lab.parallel.ddp`). When the
network is the bottleneck, the ranks can send a *compressed* gradient instead. This module writes
four compressors from scratch, each as a **DDP communication hook**::

    hook(state, bucket) -> torch.futures.Future[torch.Tensor]

the interface of PyTorch's ``DistributedDataParallel.register_comm_hook(state, hook)``. The same
hooks plug into our own :class:`dtrain_lab.parallel.ddp.DDP` (``ddp.register_comm_hook(state, hook)``).
A hook receives one bucket (``bucket.buffer()``: the flat gradient of some parameters, **not yet
divided by the world size**; ``bucket.gradients()``: per-parameter views of it) and returns a future
holding the bucket's averaged gradient.

* :func:`allreduce_hook` — no compression (the baseline), with byte accounting.
* :func:`fp16_hook`, :func:`bf16_hook` — cast to 16 bits, divide by the world size (before the
  all-reduce, so that fp16 cannot overflow), all-reduce, cast back. Half the bytes; same results as
  PyTorch's ``default_hooks.fp16_compress_hook`` / ``bf16_compress_hook``. (Not named like those on
  purpose: PyTorch's DDP refuses any hook *named* ``bf16_compress_hook`` unless CUDA/ROCm with NCCL ≥ 2.10,
  or XPU with XCCL, is present: a check by name.)
* :func:`topk_hook` — top-k sparsification **with error feedback** (Stich, Cordonnier & Jaggi,
  "Sparsified SGD with Memory", NeurIPS 2018; Lin et al., "Deep Gradient Compression", ICLR 2018).
  Each rank adds its *residual* (what it did not send so far) to the gradient, keeps the ``k``
  entries of largest magnitude, and sends their values **and** their indices. The ranks pick
  different indices, so a sparse gradient cannot be all-reduced: summing the index tensors adds
  positions, not values (:func:`topk_allreduce_indices_WRONG` shows the garbage). The values and
  indices are exchanged with **all-gather** (``k`` fixed, so every rank sends the same size) and every
  rank scatter-adds the ``p·k`` pairs into a dense tensor. The residual becomes input − sent.
  Without error feedback the small entries are never sent and training drifts (the lesson plots it).
* :func:`powersgd_hook` — PowerSGD (Vogels, Karimireddy & Jaggi, "PowerSGD: Practical Low-Rank
  Gradient Compression for Distributed Optimization", NeurIPS 2019): each gradient matrix ``M``
  (n×m) is approximated by ``P Qᵀ`` of rank ``r``, one step of power iteration per training step:
  ``P = M Q``, all-reduce P, orthogonalise P, ``Q = Mᵀ P``, all-reduce Q (then /p), ``M̂ = P Qᵀ``,
  with error feedback (the error ``M − M̂`` is added to the next step's gradient) and warm start
  (``Q`` of the previous step starts the next power iteration). Vectors (biases) and matrices too
  small to gain ``min_compression_rate`` are all-reduced uncompressed, in one flat tensor. It
  mirrors PyTorch's ``powerSGD_hook`` step for step (same random ``Q``, same orthogonalisation, same
  ``start_iter`` / ``start_powerSGD_iter`` schedule), so the two give the same results: a test
  checks it. **Watch out:** PyTorch's ``PowerSGDState`` defaults to ``start_powerSGD_iter=1000`` —
  plain all-reduce for the first 1000 steps; ours mirrors that default, pass ``start_iter``.

Bytes accounting
----------------
Every hook's state (a :class:`CommState`) issues its collectives through
:class:`dtrain_lab.comm.counted.Comm`, which counts what this rank **passes into collectives**: for
each collective call, the *logical payload* ``numel × element_size`` of the tensor this rank
contributes (all-reduce: the tensor; all-gather: its own chunk, not the gathered list). A test
checks it against what a ``CommDebugMode`` trace (:class:`dtrain_lab.comm.counted.CommTrace`) saw
go through ``torch.distributed``. ``baseline_bytes`` counts the
bytes the uncompressed all-reduce of the same buckets would pass (the bucket buffers), so
``state.ratio()`` is the compression ratio. The bytes a rank actually puts on the wire depend on the
algorithm: a ring all-reduce sends ``2(p−1)/p × payload``, a ring all-gather ``(p−1)/p × (p ×
chunk) = (p−1) × chunk`` — it grows with ``p``, which is why sparse all-gather stops paying off on many
ranks. :func:`wire_bytes` converts (with :mod:`dtrain_lab.perfmodel`); ``state.wire_bytes_sent()``
applies it to everything counted.

Where the code is
-----------------
This module is the overview and :func:`make_hook`; the hook interface, the byte accounting, the
baseline, fp16 and bf16 are in :mod:`dtrain_lab.parallel.compress_hooks`, top-k in
:mod:`dtrain_lab.parallel.compress_topk`, PowerSGD in :mod:`dtrain_lab.parallel.compress_powersgd`
(all importable from here).

Design notes
------------
* Memories (top-k residuals, PowerSGD's errors and warm-start ``Q``) are kept per parameter, not per
  bucket as PyTorch does: PyTorch's DDP rebuilds its buckets after the first iteration (another
  order), so a per-bucket memory would land on the wrong entries. That is why PyTorch requires
  ``start_powerSGD_iter ≥ 2`` with error feedback or warm start, and why ours accepts ``start_iter=0``.
* Our hooks are **blocking**: they run their collectives one after the other in the calling thread
  and return a future that is already done. Simple to read, and safe: the ranks issue the same
  collectives in the same order. PyTorch's ``powerSGD_hook`` chains its P and Q all-reduces in future
  callbacks, which on gloo run on the process group's worker threads in no fixed order; with more
  than one bucket the ranks can then issue them in different orders and deadlock (seen with torch
  2.13 on CPU, with PyTorch's own DDP too). The price of blocking: no overlap with backward.
* Top-k picks the ``k`` largest entries of the whole bucket (all its parameters together).
* "Same results as PyTorch" means bit-identical parameters when both hooks run on the same DDP
  wrapper. Across wrappers the first iteration's buckets are laid out differently, and with 3 or
  more ranks gloo's ring adds an element's values in an order that depends on its position: the
  last bit may differ.

Training a tiny model with one method inside a launched job, per-step loss against cumulative
bytes, is an experiment: :func:`dtrain_lab.demos.compression_run.train_with_compression`.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from dtrain_lab.comm.groups import Group
from dtrain_lab.i18n import LabError
from dtrain_lab.parallel.compress_hooks import (CommState, allreduce_hook, bf16_hook, cast_allreduce, fp16_hook,
                                                payload_bytes, wire_bytes)
from dtrain_lab.parallel.compress_powersgd import PowerSGDState, orthogonalize_, powersgd_hook, should_compress
from dtrain_lab.parallel.compress_topk import (TopKState, topk_allreduce_indices_WRONG, topk_hook, topk_select,
                                               topk_sparse_allreduce)

__all__ = [
    "CommState", "TopKState", "PowerSGDState", "payload_bytes", "wire_bytes",
    "allreduce_hook", "fp16_hook", "bf16_hook", "topk_hook", "powersgd_hook",
    "cast_allreduce", "topk_select", "topk_sparse_allreduce", "topk_allreduce_indices_WRONG",
    "orthogonalize_", "should_compress", "make_hook", "METHODS",
]

Hook = Callable[[Any, Any], torch.futures.Future]

METHODS = ("none", "fp16", "bf16", "topk", "topk_noef", "powersgd", "powersgd_noef")


def make_hook(method: str, process_group: Group = None, *, ratio: float = 0.01, rank: int = 1, start_iter: int = 10,
              seed: int = 0, index_dtype: torch.dtype = torch.int32) -> tuple[CommState, Hook]:
    """``(state, hook)`` for one of :data:`METHODS` (``*_noef``: without error feedback)."""
    if method == "none":
        return CommState(process_group), allreduce_hook
    if method == "fp16":
        return CommState(process_group), fp16_hook
    if method == "bf16":
        return CommState(process_group), bf16_hook
    if method in ("topk", "topk_noef"):
        return TopKState(process_group, ratio=ratio, error_feedback=method == "topk",
                         index_dtype=index_dtype), topk_hook
    if method in ("powersgd", "powersgd_noef"):
        return PowerSGDState(process_group, matrix_approximation_rank=rank, start_iter=start_iter,
                             use_error_feedback=method == "powersgd", random_seed=seed), powersgd_hook
    raise LabError("compression_bad_method", value=method, choices=", ".join(METHODS))
