"""Top-k sparsification with error feedback, as a DDP communication hook.

Stich, Cordonnier & Jaggi, "Sparsified SGD with Memory", NeurIPS 2018; Lin et al., "Deep Gradient
Compression", ICLR 2018. Each rank adds its *residual* (what it did not send so far) to the gradient,
keeps the ``k`` entries of largest magnitude and sends their values **and** indices. The ranks pick
different indices, so a sparse gradient cannot be all-reduced (:func:`topk_allreduce_indices_WRONG`
shows the garbage): values and indices travel by all-gather (``k`` fixed, so every rank sends the
same size) and every rank scatter-adds the ``p·k`` pairs into a dense tensor. The residual becomes
input − sent. See :mod:`dtrain_lab.parallel.compression` for the overview.
"""
# No ``from __future__ import annotations``: PyTorch DDP compares a hook's return annotation with
# torch.futures.Future[torch.Tensor] and refuses a string.

import math

import torch

from dtrain_lab.comm.groups import Group
from dtrain_lab.i18n import LabError
from dtrain_lab.parallel.compress_hooks import CommState, bucket_layout, done_future, flat_memory, store_memory

__all__ = ["TopKState", "topk_hook", "topk_select", "topk_sparse_allreduce", "topk_allreduce_indices_WRONG"]


def _check_ratio(ratio) -> float:
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 < ratio <= 1:
        raise LabError("compression_bad_ratio", value=ratio)
    return float(ratio)


def _check_k(k, n: int) -> int:
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= max(n, 1):
        raise LabError("compression_bad_k", value=k, numel=n)
    return k


def _check_index_dtype(index_dtype) -> torch.dtype:
    if index_dtype not in (torch.int32, torch.int64):
        raise LabError("compression_bad_index_dtype", value=index_dtype)
    return index_dtype


def topk_select(tensor: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Indices (int64) and values of the ``k`` entries of largest magnitude of a flat ``tensor``."""
    idx = torch.topk(tensor.abs(), k, sorted=False).indices
    return idx, tensor[idx]


def topk_sparse_allreduce(tensor: torch.Tensor, k: int, state: CommState, *,
                          index_dtype: torch.dtype = torch.int32) -> tuple[torch.Tensor, torch.Tensor]:
    """The correct sparse all-reduce of each rank's top-k of a flat ``tensor``.

    Every rank sends its ``k`` values and ``k`` indices with two all-gathers (``k`` is the same on
    every rank, as all-gather needs); every rank then scatter-adds the ``p·k`` pairs, rank by rank,
    into zeros, and divides by ``p``. Returns ``(average, sent)``: the dense average, and the dense
    tensor of what *this* rank sent (for the residual). Bytes: ``k × (element size + index size)``.
    """
    n = tensor.numel()
    _check_k(k, n)
    idx, vals = topk_select(tensor, k)
    all_vals = state.all_gather(vals)
    all_idx = state.all_gather(idx.to(_check_index_dtype(index_dtype)))
    dense = torch.zeros_like(tensor)
    for v, i in zip(all_vals, all_idx):  # rank order: the same sum on every rank
        dense.index_add_(0, i.to(torch.int64), v)
    dense.div_(len(all_vals))
    sent = torch.zeros_like(tensor)
    sent[idx] = vals
    return dense, sent


def topk_allreduce_indices_WRONG(tensor: torch.Tensor, k: int, state: CommState) -> torch.Tensor:
    """**Wrong on purpose** (for the lesson): "all-reduce the sparse gradient" by all-reducing its
    value tensor and its index tensor as if they were dense.

    The values are summed position by position of the *k-lists*, not of the gradient, and the
    indices are **added** (rank 0's index 3 plus rank 1's index 5 becomes index 8): the result puts
    sums of unrelated entries at positions nobody chose. Indices ≥ numel are wrapped with ``% numel``
    only so that the demonstration does not crash in ``index_add_``. Compare with
    :func:`topk_sparse_allreduce`.
    """
    n = tensor.numel()
    _check_k(k, n)
    idx, vals = topk_select(tensor, k)
    vals = vals.clone()
    state.all_reduce(vals)
    state.all_reduce(idx)                 # the bug: a sum of positions is not a position
    dense = torch.zeros_like(tensor)
    dense.index_add_(0, idx % n, vals)
    return dense.div_(state.world_size)


class TopKState(CommState):
    """State of :func:`topk_hook`.

    * ``ratio`` in (0, 1]: each bucket sends ``k = ceil(ratio × numel)`` entries (at least 1);
      ``ratio=1`` sends everything (then the result equals a plain all-reduce).
    * ``error_feedback``: keep the residual (what was not sent) per parameter and add it to the next
      gradient (True, the default). False: the unsent entries are dropped.
    * ``index_dtype``: ``torch.int32`` (4 bytes per index, enough below 2³¹ entries per bucket) or
      ``torch.int64``.

    Per step a bucket of ``n`` float32 entries costs ``k × (4 + index size)`` bytes instead of ``4n``.
    """

    def __init__(self, process_group: Group = None, ratio: float = 0.01, error_feedback: bool = True,
                 index_dtype: torch.dtype = torch.int32):
        super().__init__(process_group)
        self.ratio_k = _check_ratio(ratio)
        self.error_feedback = bool(error_feedback)
        self.index_dtype = _check_index_dtype(index_dtype)
        self.residuals: dict[int, torch.Tensor] = {}

    def k_for(self, numel: int) -> int:
        return max(1, min(numel, math.ceil(self.ratio_k * numel - 1e-9)))

    def residual_norm(self) -> float:
        return float(math.sqrt(sum(float(r.double().pow(2).sum()) for r in self.residuals.values())))


def topk_hook(state: TopKState, bucket) -> torch.futures.Future[torch.Tensor]:
    """Top-k sparsification with error feedback, values and indices exchanged by all-gather."""
    buf = bucket.buffer()
    params, numels = bucket_layout(bucket)
    if state.error_feedback:
        buf.add_(flat_memory(state.residuals, params, numels, buf))   # gradient + what was not sent yet
    dense, sent = topk_sparse_allreduce(buf, state.k_for(buf.numel()), state, index_dtype=state.index_dtype)
    if state.error_feedback:
        store_memory(state.residuals, params, numels, buf - sent)     # residual = input − sent
    buf.copy_(dense)
    state.bucket_done(bucket)
    return done_future(buf)
