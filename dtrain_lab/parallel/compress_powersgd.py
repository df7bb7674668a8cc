"""PowerSGD as a DDP communication hook, operation for operation like PyTorch's ``powerSGD_hook``.

Vogels, Karimireddy & Jaggi, "PowerSGD: Practical Low-Rank Gradient Compression for Distributed
Optimization", NeurIPS 2019: each gradient matrix ``M`` (n×m) is approximated by ``P Qᵀ`` of rank
``r``, one step of power iteration per training step: ``P = M Q``, all-reduce P, orthogonalise P,
``Q = Mᵀ P``, all-reduce Q (then /p), ``M̂ = P Qᵀ``, with error feedback and warm start. Vectors and
matrices too small to gain ``min_compression_rate`` are all-reduced uncompressed, in one flat tensor.
See :mod:`dtrain_lab.parallel.compression` for the overview and the design notes.
"""
# No ``from __future__ import annotations``: PyTorch DDP compares a hook's return annotation with
# torch.futures.Future[torch.Tensor] and refuses a string.

import math
from collections import defaultdict
from typing import Sequence

import torch

from dtrain_lab.comm.groups import Group
from dtrain_lab.i18n import LabError
from dtrain_lab.parallel.compress_hooks import (CommState, allreduce_hook, bucket_layout, done_future, flat_memory,
                                                store_memory)

__all__ = ["PowerSGDState", "powersgd_hook", "orthogonalize_", "should_compress"]


def _check_rank(rank) -> int:
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise LabError("compression_bad_rank", value=rank)
    return rank


def _check_start_iter(value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise LabError("compression_bad_start_iter", value=value)
    return value


def _matmul(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> None:
    """``out = a @ b``, computed as a batch of one matrix (``bmm``) like PyTorch's hook: ``mm`` may pick
    another kernel (matrix-vector for r = 1) and round differently in the last bit."""
    torch.bmm(a.unsqueeze(0), b.unsqueeze(0), out=out.unsqueeze(0))


def should_compress(n: int, m: int, rank: int, min_compression_rate: float) -> bool:
    """Is an n×m matrix worth compressing at this rank? ``(n + m)·rank·min_rate < n·m`` (PyTorch's rule)."""
    return (n + m) * rank * min_compression_rate < n * m


def orthogonalize_(m: torch.Tensor, epsilon: float = 0.0) -> torch.Tensor:
    """Make the columns of ``m`` (n×r, r ≤ n) orthonormal, in place.

    Gram-Schmidt for ``r ≤ 2`` or 16-bit dtypes (QR has no half-precision kernel), else QR — the same
    choice and the same operations as PyTorch's ``_orthogonalize``. ``epsilon`` guards against a
    zero column (0: none, so an all-zero column gives NaN, as PyTorch's does)."""
    r = m.shape[1]
    if r <= 2 or m.dtype in (torch.float16, torch.bfloat16):
        for i in range(r):
            col = m[:, i:i + 1]
            if epsilon == 0:
                col /= torch.norm(col, dim=0, keepdim=True)
            else:
                col /= torch.norm(col, dim=0, keepdim=True) + epsilon
            if i + 1 < r:                      # remove its component from the later columns
                rest = m[:, i + 1:]
                rest -= torch.sum(col * rest, dim=0, keepdim=True) * col
    else:
        m.copy_(torch.linalg.qr(m).Q)
    return m


class PowerSGDState(CommState):
    """State of :func:`powersgd_hook`; the parameters mean what they mean in PyTorch's
    ``PowerSGDState`` (``start_iter`` is its ``start_powerSGD_iter``, default 1000 like it: plain
    all-reduce for the first ``start_iter`` steps).

    Memory per parameter: ``errors`` (error feedback), ``qs`` (warm start). ``iter`` counts the steps
    seen (it drives ``start_iter`` and is not touched by :meth:`reset`). The random ``Q`` of a bucket
    is drawn from ``numpy.random.RandomState(random_seed)`` then ``torch.manual_seed`` in a forked RNG,
    as PyTorch does, so both draw the same ``Q`` and every rank draws the same.
    """

    def __init__(self, process_group: Group = None, matrix_approximation_rank: int = 1, start_iter: int = 1000,
                 min_compression_rate: float = 2, use_error_feedback: bool = True, warm_start: bool = True,
                 orthogonalization_epsilon: float = 0, random_seed: int = 0):
        import numpy as np

        super().__init__(process_group)
        self.matrix_approximation_rank = _check_rank(matrix_approximation_rank)
        self.start_iter = _check_start_iter(start_iter)
        self.min_compression_rate = min_compression_rate
        self.use_error_feedback = bool(use_error_feedback)
        self.warm_start = bool(warm_start)
        self.orthogonalization_epsilon = orthogonalization_epsilon
        self.rng = np.random.RandomState(random_seed)
        self.iter = 0
        self.errors: dict[int, torch.Tensor] = {}
        self.qs: dict[int, torch.Tensor] = {}
        self._seeded_buckets: set[int] = set()

    def compressed_elements(self, shapes: Sequence[torch.Size]) -> tuple[int, int]:
        """(elements before, elements sent) for one bucket of gradients of these shapes."""
        before = after = 0
        for s in shapes:
            n = s[0] if len(s) else 1
            m = math.prod(s) // n if n else 0
            r = min(n, m, self.matrix_approximation_rank)
            before += n * m
            after += (n + m) * r if should_compress(n, m, r, self.min_compression_rate) else n * m
        return before, after


def powersgd_hook(state: PowerSGDState, bucket) -> torch.futures.Future[torch.Tensor]:
    """PowerSGD, from scratch, operation for operation like PyTorch's ``powerSGD_hook``."""
    buf = bucket.buffer()
    p_world = state.world_size
    last = bucket.is_last()
    if state.iter < state.start_iter:                      # vanilla all-reduce for the first steps
        out = allreduce_hook(state, bucket)
        state.iter += int(last)
        return out

    params, numels = bucket_layout(bucket)
    if state.use_error_feedback:                           # 1. add the error of the previous steps
        buf.add_(flat_memory(state.errors, params, numels, buf))
        before = buf.clone()

    # 2. split: matrices worth compressing / the rest (biases, small matrices), sent uncompressed
    to_compress: list[tuple[torch.Tensor, torch.Tensor, int]] = []   # (matrix view, param, rank)
    uncompressed: list[torch.Tensor] = []
    for grad, param in zip(bucket.gradients(), params):
        matrix = grad.view(grad.shape[0], -1) if grad.dim() else grad.view(1, 1)
        n, m = matrix.shape
        r = min(n, m, state.matrix_approximation_rank)
        if should_compress(n, m, r, state.min_compression_rate):
            to_compress.append((matrix, param, r))
        else:
            uncompressed.append(grad)

    # 3. Q: warm start (last step's Q, re-orthogonalised) or random (same draw on every rank)
    by_shape: dict[torch.Size, list] = defaultdict(list)     # PyTorch's order: grouped by shape
    for item in to_compress:
        by_shape[item[0].shape].append(item)
    ordered = [item for group in by_shape.values() for item in group]
    p_mem = buf.new_empty(sum(mat.shape[0] * r for mat, _, r in ordered))
    q_mem = buf.new_empty(sum(mat.shape[1] * r for mat, _, r in ordered))
    ps, qs = [], []
    po = qo = 0
    for mat, _, r in ordered:
        n, m = mat.shape
        ps.append(p_mem[po:po + n * r].view(n, r))
        qs.append(q_mem[qo:qo + m * r].view(m, r))
        po, qo = po + n * r, qo + m * r
    randomize = (not state.warm_start or bucket.index() not in state._seeded_buckets
                 or any(id(param) not in state.qs for _, param, _ in ordered))
    if randomize:
        state._seeded_buckets.add(bucket.index())
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(state.rng.randint(1_000_000_000))
            for q in qs:
                q.copy_(torch.randn(*q.shape, device="cpu", dtype=buf.dtype))
                orthogonalize_(q, state.orthogonalization_epsilon)
    else:
        for q, (_, param, _) in zip(qs, ordered):
            q.copy_(state.qs[id(param)])
            orthogonalize_(q, state.orthogonalization_epsilon)

    # 4. P = M Q (local), the uncompressed part all-reduced and averaged
    for (mat, _, _), p, q in zip(ordered, ps, qs):
        _matmul(mat, q, out=p)
    flat = torch.cat([t.reshape(-1) for t in uncompressed]) if uncompressed else buf.new_empty(0)
    state.all_reduce(flat).div_(p_world)
    offset = 0
    for t in uncompressed:
        t.copy_(flat[offset:offset + t.numel()].view_as(t))
        offset += t.numel()

    # 5. all-reduce P (sum: it is orthogonalised next, its scale does not matter), orthogonalise
    state.all_reduce(p_mem)
    for p in ps:
        orthogonalize_(p, state.orthogonalization_epsilon)
    # 6. Q = Mᵀ P, all-reduce Q, average
    for (mat, _, _), p, q in zip(ordered, ps, qs):
        _matmul(mat.t(), p, out=q)
    state.all_reduce(q_mem).div_(p_world)
    # 7. M̂ = P Qᵀ written over the gradient; the same on every rank
    for (mat, _, _), p, q in zip(ordered, ps, qs):
        _matmul(p, q.t(), out=mat)

    if state.use_error_feedback:                           # 8. error = what we wanted − what we got
        store_memory(state.errors, params, numels, before - buf)
    if state.warm_start:
        for q, (_, param, _) in zip(qs, ordered):
            state.qs[id(param)] = q.clone()
    state.bucket_done(bucket)
    state.iter += int(last)
    return done_future(buf)
