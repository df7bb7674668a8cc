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
Every hook's state (a :class:`CommState`) counts what this rank **passes into collectives**: for
each collective call, the *logical payload* ``numel × element_size`` of the tensor this rank
contributes (all-reduce: the tensor; all-gather: its own chunk, not the gathered list). That is
what a test checks against the traced ``torch.distributed`` calls. ``baseline_bytes`` counts the
bytes the uncompressed all-reduce of the same buckets would pass (the bucket buffers), so
``state.ratio()`` is the compression ratio. The bytes a rank actually puts on the wire depend on the
algorithm: a ring all-reduce sends ``2(p−1)/p × payload``, a ring all-gather ``(p−1)/p × (p ×
chunk) = (p−1) × chunk`` — it grows with ``p``, which is why sparse all-gather stops paying off on many
ranks. :func:`wire_bytes` converts (with :mod:`dtrain_lab.perfmodel`); ``state.wire_bytes_sent()``
applies it to everything counted.

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

:func:`train_with_compression` trains a tiny model with one method inside a launched job
(``dtrain_lab.demos.compression_run``) and returns per-step loss and cumulative bytes.
"""
import math
from collections import defaultdict
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist

from dtrain_lab.i18n import LabError
from dtrain_lab.perfmodel import busbw_factor, ring_bytes_sent

__all__ = [
    "CommState", "TopKState", "PowerSGDState", "payload_bytes", "wire_bytes",
    "allreduce_hook", "fp16_hook", "bf16_hook", "topk_hook", "powersgd_hook",
    "cast_allreduce", "topk_select", "topk_sparse_allreduce", "topk_allreduce_indices_WRONG",
    "orthogonalize_", "should_compress", "make_hook", "train_with_compression", "METHODS",
]

Hook = Callable[[Any, Any], torch.futures.Future]


# ------------------------------------------------------------------------------------ bytes
def payload_bytes(t: torch.Tensor) -> int:
    """Logical payload of one tensor passed to a collective: ``numel × element_size``."""
    return t.numel() * t.element_size()


def wire_bytes(op: str, payload: float, p: int) -> float:
    """Bytes one rank sends on the wire in a **ring** implementation of ``op`` ("all_reduce" or
    "all_gather"), given the logical payload it passed in (for all-gather: its own chunk).

    all-reduce: ``2(p−1)/p × payload`` (reduce-scatter then all-gather, :func:`perfmodel.ring_bytes_sent`);
    all-gather: ``(p−1)/p × (p × chunk)`` = ``(p−1) × chunk`` (nccl-tests' bus factor times the gathered size).
    """
    if op == "all_reduce":
        return ring_bytes_sent(payload, p)
    if op == "all_gather":
        return 0.0 if p == 1 else busbw_factor("all_gather", p) * p * payload
    raise ValueError(f"op must be 'all_reduce' or 'all_gather', got {op!r} / "
                     f"op 只能是 'all_reduce' 或 'all_gather'")


class CommState:
    """State of a communication hook: the process group and the byte counters.

    * ``bytes_sent`` — logical payload this rank passed into collectives (see the module docstring);
    * ``baseline_bytes`` — what the uncompressed all-reduce of the same buckets would have passed;
    * ``bytes_by_op`` — ``bytes_sent`` split by collective; ``collectives`` — calls issued;
    * ``steps`` — steps completed (a step ends with the bucket whose ``is_last()`` is true);
      ``step_bytes`` — ``bytes_sent`` of each completed step, in order.

    :meth:`reset` zeroes the counters only (a compressor's own memory — residuals, ``Q`` — stays).
    """

    def __init__(self, process_group=None):
        self.process_group = process_group
        self.reset()

    def reset(self) -> None:
        self.bytes_sent = 0
        self.baseline_bytes = 0
        self.bytes_by_op: dict[str, int] = {"all_reduce": 0, "all_gather": 0}
        self.collectives = 0
        self.steps = 0
        self.step_bytes: list[int] = []
        self._current = 0

    @property
    def world_size(self) -> int:
        return dist.get_world_size(self.process_group)

    def ratio(self) -> float:
        """``bytes_sent / baseline_bytes`` (payload), NaN before any bucket."""
        return self.bytes_sent / self.baseline_bytes if self.baseline_bytes else math.nan

    def wire_bytes_sent(self) -> float:
        """Bytes this rank put on the wire, assuming ring algorithms (see :func:`wire_bytes`)."""
        p = self.world_size
        return sum(wire_bytes(op, n, p) for op, n in self.bytes_by_op.items())

    def baseline_wire_bytes(self) -> float:
        return wire_bytes("all_reduce", self.baseline_bytes, self.world_size)

    def summary(self) -> dict:
        return {"bytes_sent": self.bytes_sent, "baseline_bytes": self.baseline_bytes, "ratio": self.ratio(),
                "bytes_by_op": dict(self.bytes_by_op), "collectives": self.collectives, "steps": self.steps,
                "wire_bytes": self.wire_bytes_sent(), "baseline_wire_bytes": self.baseline_wire_bytes()}

    # -- the only two places where this module talks to the network
    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        """Blocking sum all-reduce of ``t`` in place, counted."""
        self._add("all_reduce", payload_bytes(t))
        dist.all_reduce(t, group=self.process_group)
        return t

    def all_gather(self, t: torch.Tensor) -> list[torch.Tensor]:
        """Blocking all-gather of ``t`` (same shape on every rank), counted as ``t``'s bytes."""
        self._add("all_gather", payload_bytes(t))
        out = [torch.empty_like(t) for _ in range(self.world_size)]
        dist.all_gather(out, t.contiguous(), group=self.process_group)
        return out

    def _add(self, op: str, n: int) -> None:
        self.bytes_sent += n
        self.bytes_by_op[op] += n
        self.collectives += 1
        self._current += n

    def bucket_done(self, bucket) -> None:
        """Account one bucket handed to a hook (baseline bytes, end of step)."""
        self.baseline_bytes += payload_bytes(bucket.buffer())
        if bucket.is_last():
            self.steps += 1
            self.step_bytes.append(self._current)
            self._current = 0


def _done(t: torch.Tensor) -> torch.futures.Future[torch.Tensor]:
    """A future already holding ``t``: our hooks use blocking collectives (simple to read; no
    overlap of the compression with backward)."""
    fut: torch.futures.Future = torch.futures.Future()
    fut.set_result(t)
    return fut


# ------------------------------------------------------------------------------------ baseline, fp16, bf16
def allreduce_hook(state: CommState, bucket) -> torch.futures.Future[torch.Tensor]:
    """No compression: divide by the world size, all-reduce (PyTorch's ``default_hooks.allreduce_hook``)."""
    buf = bucket.buffer()
    buf.div_(state.world_size)
    state.all_reduce(buf)
    state.bucket_done(bucket)
    return _done(buf)


def cast_allreduce(tensor: torch.Tensor, dtype: torch.dtype, state: CommState) -> torch.Tensor:
    """Average ``tensor`` over the ranks through ``dtype``: cast, divide by the world size (before the
    sum, so that fp16's range — max 65504 — is not exceeded by the sum), all-reduce, cast back into
    ``tensor`` in place. PyTorch's ``_compress_hook`` does the same operations in the same order."""
    low = tensor.to(dtype).div_(state.world_size)
    state.all_reduce(low)
    return tensor.copy_(low)


def fp16_hook(state: CommState, bucket) -> torch.futures.Future[torch.Tensor]:
    """All-reduce the bucket in ``float16``: half the bytes of float32 (10-bit mantissa, max 65504)."""
    out = cast_allreduce(bucket.buffer(), torch.float16, state)
    state.bucket_done(bucket)
    return _done(out)


def bf16_hook(state: CommState, bucket) -> torch.futures.Future[torch.Tensor]:
    """All-reduce the bucket in ``bfloat16``: half the bytes, float32's range, 7-bit mantissa."""
    out = cast_allreduce(bucket.buffer(), torch.bfloat16, state)
    state.bucket_done(bucket)
    return _done(out)


# ------------------------------------------------------------------------------------ per-parameter memory
def _layout(bucket) -> tuple[list[torch.Tensor], list[int]]:
    params = list(bucket.parameters())
    return params, [p.numel() for p in params]


def _flat_memory(store: dict[int, torch.Tensor], params, numels, like: torch.Tensor) -> torch.Tensor:
    """The bucket-shaped flat view of per-parameter memories (zeros where none yet)."""
    parts = [store[id(p)].reshape(-1) if id(p) in store else torch.zeros(n, dtype=like.dtype, device=like.device)
             for p, n in zip(params, numels)]
    return torch.cat(parts) if parts else like.new_zeros(0)


def _store_memory(store: dict[int, torch.Tensor], params, numels, flat: torch.Tensor) -> None:
    offset = 0
    for p, n in zip(params, numels):
        store[id(p)] = flat[offset:offset + n].clone()
        offset += n


# ------------------------------------------------------------------------------------ top-k
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

    def __init__(self, process_group=None, ratio: float = 0.01, error_feedback: bool = True,
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
    params, numels = _layout(bucket)
    if state.error_feedback:
        buf.add_(_flat_memory(state.residuals, params, numels, buf))   # gradient + what was not sent yet
    dense, sent = topk_sparse_allreduce(buf, state.k_for(buf.numel()), state, index_dtype=state.index_dtype)
    if state.error_feedback:
        _store_memory(state.residuals, params, numels, buf - sent)     # residual = input − sent
    buf.copy_(dense)
    state.bucket_done(bucket)
    return _done(buf)


# ------------------------------------------------------------------------------------ PowerSGD
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

    def __init__(self, process_group=None, matrix_approximation_rank: int = 1, start_iter: int = 1000,
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

    params, numels = _layout(bucket)
    if state.use_error_feedback:                           # 1. add the error of the previous steps
        buf.add_(_flat_memory(state.errors, params, numels, buf))
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
        _store_memory(state.errors, params, numels, before - buf)
    if state.warm_start:
        for q, (_, param, _) in zip(qs, ordered):
            state.qs[id(param)] = q.clone()
    state.bucket_done(bucket)
    state.iter += int(last)
    return _done(buf)


# ------------------------------------------------------------------------------------ training helper
METHODS = ("none", "fp16", "bf16", "topk", "topk_noef", "powersgd", "powersgd_noef")


def make_hook(method: str, process_group=None, *, ratio: float = 0.01, rank: int = 1, start_iter: int = 10,
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


def train_with_compression(method: str, steps: int = 200, *, ratio: float = 0.01, rank: int = 1,
                           start_iter: int = 10, lr: float = 0.05, momentum: float = 0.0,
                           per_rank_batch: int = 16, d_hidden: int = 64, n_samples: int = 512, seed: int = 0,
                           ddp: str = "ours") -> dict:
    """Train ``MLP(16, d_hidden, 4)`` on the synthetic regression task with one compression method,
    inside a launched job (call it on every rank; see ``dtrain_lab.demos.compression_run``).

    Every step: each rank takes its shard (``per_rank_batch`` samples) of the global batch, backward runs the
    hook through ``ddp`` ("ours": :class:`dtrain_lab.parallel.ddp.DDP`, "torch": PyTorch's
    ``DistributedDataParallel``), then SGD. After each step the loss on the whole data set is
    evaluated locally (every replica holds the same parameters, so no communication is needed).

    Returns ``{"method", "loss": [per step], "bytes": [cumulative payload], "baseline_bytes": [...],
    "wire_bytes": [...], "baseline_wire_bytes": [...], "ratio", "params", "world_size"}`` — the
    loss after step ``i`` against the bytes sent up to step ``i``.
    """
    import torch.nn.functional as F

    from dtrain_lab.data import global_batch, regression_dataset, shard
    from dtrain_lab.models import MLP, count_params

    if method not in METHODS:
        raise LabError("compression_bad_method", value=method, choices=", ".join(METHODS))
    if ddp not in ("ours", "torch"):
        raise LabError("compression_bad_method", value=ddp, choices="ours, torch")
    world, me = dist.get_world_size(), dist.get_rank()
    model = MLP(16, d_hidden, 4, depth=2, seed=seed)
    state, hook = make_hook(method, ratio=ratio, rank=rank, start_iter=start_iter, seed=seed)
    if ddp == "ours":
        from dtrain_lab.parallel.ddp import DDP

        net = DDP(model)
    else:
        from torch.nn.parallel import DistributedDataParallel

        net = DistributedDataParallel(model)
    net.register_comm_hook(state, hook)
    data = regression_dataset(n_samples, 16, 4, seed=seed + 1)
    x_all, y_all = data.tensors
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    out: dict[str, Any] = {"method": method, "loss": [], "bytes": [], "baseline_bytes": [], "wire_bytes": [],
                           "baseline_wire_bytes": [], "params": count_params(model), "world_size": world}
    for step in range(steps):
        x, y = shard(global_batch(data, step, per_rank_batch * world), me, world)
        opt.zero_grad(set_to_none=True)
        F.mse_loss(net(x), y).backward()
        opt.step()
        with torch.no_grad():
            out["loss"].append(float(F.mse_loss(model(x_all), y_all)))
        out["bytes"].append(state.bytes_sent)
        out["baseline_bytes"].append(state.baseline_bytes)
        out["wire_bytes"].append(state.wire_bytes_sent())
        out["baseline_wire_bytes"].append(state.baseline_wire_bytes())
    out["ratio"] = state.ratio()
    if ddp == "ours":
        net.remove_hooks()
    return out
