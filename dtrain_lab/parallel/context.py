"""Context parallelism from scratch: ring attention over a sequence sharded across ranks.

A sequence of ``S`` tokens is cut into shards, one per rank of the context-parallel (CP) group. Each
rank keeps its own queries and sends its keys and values around a ring: in step ``s`` rank ``r``
holds the K/V block of rank ``r - s`` and computes the attention of its queries to that block, while
the next block is already on its way (Liu, Zaharia & Abbeel 2023, *Ring Attention with Blockwise
Transformers for Near-Infinite Context*, arXiv:2310.01889). No rank ever holds the whole ``S × S``
score matrix, nor the whole sequence.

The partial results are merged with the *online softmax* (Milakov & Gimelshein 2018, *Online
normalizer calculation for softmax*; the merge of FlashAttention, Dao et al. 2022): a block gives its
output ``o_b`` (already normalised over the block) and the log-sum-exp ``lse_b`` of its scores; two
partial results combine exactly as

    lse = log(exp(lse_1) + exp(lse_2))
    o   = exp(lse_1 - lse) · o_1 + exp(lse_2 - lse) · o_2

so the order of the blocks does not matter. Backward runs a second ring: K/V travel again, and the
gradients ``dK``/``dV`` of each block travel with them, every rank adding its share, until they reach
the block's owner (the saved ``lse`` lets each block's probabilities be recomputed; nothing ``S × S``
is saved).

**Causal load imbalance.** With a causal mask, token ``i`` attends to tokens ``≤ i``. Cut the
sequence into ``p`` contiguous shards and rank ``p-1`` has ``2p-1`` times the work of rank 0 (which
sees only its own diagonal block). *Zig-zag* sharding cuts the sequence into ``2p`` chunks and gives
rank ``r`` chunks ``r`` and ``2p-1-r`` — one early, one late — so every rank has exactly the same
number of query-key pairs, and every off-diagonal ring step costs half a block (Brandon et al. 2023,
*Striped Attention* discusses the same imbalance; zig-zag is the layout of Megatron-LM's context
parallelism and of PyTorch's ``_HeadTailLoadBalancer``).

Every function takes ``group`` (``None``: the world) and runs as plain attention on one process.
Shapes are ``(batch, heads, seq, head_dim)``.
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist

from dtrain_lab.comm import groups
from dtrain_lab.i18n import LabError

__all__ = ["LAYOUTS", "chunk_ids", "shard_positions", "shard_sequence", "unshard_sequence", "zigzag_order",
           "causal_work", "attention_reference", "online_softmax_merge", "block_attention", "ring_attention",
           "ring_comm_bytes"]

LAYOUTS = ("contiguous", "zigzag")


# ------------------------------------------------------------------------------------ sharding
def _check_layout(seq_len: int, p: int, layout: str) -> int:
    """Number of chunks the sequence is cut into (p or 2p); raises a clear error otherwise."""
    if layout not in LAYOUTS:
        raise LabError("cp_bad_layout", layout=layout, choices=", ".join(LAYOUTS))
    n_chunks = p if layout == "contiguous" else 2 * p
    if seq_len % n_chunks:
        raise LabError("cp_uneven_seq", seq=seq_len, chunks=n_chunks, cp=p, layout=layout)
    return n_chunks


def chunk_ids(rank: int, p: int, layout: str = "zigzag") -> list[int]:
    """Which of the ``p`` (contiguous) or ``2p`` (zig-zag) equal chunks rank ``rank`` holds, in order."""
    return [rank] if layout == "contiguous" else [rank, 2 * p - 1 - rank]


def shard_positions(seq_len: int, rank: int, p: int, layout: str = "zigzag") -> torch.Tensor:
    """Global token positions of rank ``rank``'s shard (what its rotary embedding must be given)."""
    n = seq_len // _check_layout(seq_len, p, layout)
    return torch.cat([torch.arange(c * n, (c + 1) * n) for c in chunk_ids(rank, p, layout)])


def shard_sequence(x: torch.Tensor, rank: int, p: int, layout: str = "zigzag", dim: int = 2) -> torch.Tensor:
    """Rank ``rank``'s shard of the full tensor ``x`` along ``dim`` (a copy)."""
    return x.index_select(dim, shard_positions(x.shape[dim], rank, p, layout).to(x.device))


def unshard_sequence(shards: list[torch.Tensor], layout: str = "zigzag", dim: int = 2) -> torch.Tensor:
    """Inverse of :func:`shard_sequence`: the full tensor from every rank's shard, in rank order."""
    p = len(shards)
    full = torch.cat(shards, dim)
    order = zigzag_order(full.shape[dim], p) if layout == "zigzag" else torch.arange(full.shape[dim])
    return full.index_select(dim, torch.argsort(order).to(full.device))


def zigzag_order(seq_len: int, p: int) -> torch.Tensor:
    """The positions of the concatenated zig-zag shards: ``x[order]`` is rank 0's shard, then rank 1's…
    PyTorch's ``_HeadTailLoadBalancer(seq_len, p, "cpu")._generate_indices()`` returns the same order."""
    return torch.cat([shard_positions(seq_len, r, p, "zigzag") for r in range(p)])


def causal_work(seq_len: int, p: int, layout: str = "zigzag") -> list[int]:
    """Query-key pairs each rank computes under a causal mask: ``Σ`` over its queries of ``position + 1``.
    Contiguous: rank r does about ``(2r+1)/p²`` of the ``S²/2`` total; zig-zag: all equal."""
    return [int((shard_positions(seq_len, r, p, layout) + 1).sum()) for r in range(p)]


# ------------------------------------------------------------------------------------ one block
def attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True) -> torch.Tensor:
    """Plain attention on one process: ``softmax(q kᵀ / √d) v`` with an optional causal mask."""
    k, v = _repeat_kv(k, q.shape[1]), _repeat_kv(v, q.shape[1])
    s = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    if causal:
        t = q.shape[-2]
        s = s.masked_fill(~torch.ones(t, t, dtype=torch.bool, device=q.device).tril(), float("-inf"))
    return s.softmax(-1) @ v


def _repeat_kv(t: torch.Tensor, heads: int) -> torch.Tensor:
    """Grouped-query attention (Ainslie et al. 2023): each K/V head serves ``heads / kv_heads`` query heads."""
    return t if t.shape[1] == heads else t.repeat_interleave(heads // t.shape[1], dim=1)


def block_attention(q, k, v, scale: float, diagonal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of the queries ``q`` to one K/V block: ``(o, lse)`` with ``o`` normalised over the
    block and ``lse`` (``(..., rows)``) the log-sum-exp of the block's scores. ``diagonal``: query
    and key chunks are the same positions, so the causal triangle applies inside the block.
    ``k``/``v`` may have fewer heads than ``q`` (grouped-query attention)."""
    k, v = _repeat_kv(k, q.shape[1]), _repeat_kv(v, q.shape[1])
    s = (q @ k.transpose(-2, -1)) * scale                   # (b, h, n, m)
    if diagonal:
        n = q.shape[-2]
        s = s.masked_fill(~torch.ones(n, n, dtype=torch.bool, device=q.device).tril(), float("-inf"))
    lse = torch.logsumexp(s, -1)                           # (b, h, n)
    return torch.exp(s - lse.unsqueeze(-1)) @ v, lse


def online_softmax_merge(o1, lse1, o2, lse2) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge two partial attention results of the same queries over disjoint key sets (exact)."""
    lse = torch.logaddexp(lse1, lse2)
    return torch.exp(lse1 - lse).unsqueeze(-1) * o1 + torch.exp(lse2 - lse).unsqueeze(-1) * o2, lse


def _pairs(my_chunks: list[int], kv_chunks: list[int], n: int, causal: bool):
    """(query rows, key rows, diagonal?) of every chunk pair that has visible query-key pairs.
    Chunks are aligned and of equal size, so a pair is fully visible, diagonal or fully masked."""
    out = []
    for i, qc in enumerate(my_chunks):
        for j, kc in enumerate(kv_chunks):
            if causal and kc > qc:
                continue                                   # every key is after every query
            out.append((slice(i * n, (i + 1) * n), slice(j * n, (j + 1) * n), causal and kc == qc))
    return out


def _block_backward(q, k, v, o, lse, do, delta, scale, diagonal):
    """Gradients of one block from the *final* ``o``/``lse``: FlashAttention's backward (Dao et al.
    2022, Algorithm 4): P = exp(S - lse), dV = Pᵀ dO, dS = P ∘ (dO Vᵀ - rowsum(dO ∘ O)).
    With grouped-query attention the gradients of a K/V head sum over the query heads it serves."""
    kv_heads = k.shape[1]
    k, v = _repeat_kv(k, q.shape[1]), _repeat_kv(v, q.shape[1])
    s = (q @ k.transpose(-2, -1)) * scale
    if diagonal:
        n = q.shape[-2]
        s = s.masked_fill(~torch.ones(n, n, dtype=torch.bool, device=q.device).tril(), float("-inf"))
    prob = torch.exp(s - lse.unsqueeze(-1))
    ds = prob * (do @ v.transpose(-2, -1) - delta.unsqueeze(-1))
    dk, dv = ds.transpose(-2, -1) @ q * scale, prob.transpose(-2, -1) @ do

    def fold(t):   # (b, heads, n, d) -> (b, kv_heads, n, d)
        return t if t.shape[1] == kv_heads else t.unflatten(1, (kv_heads, -1)).sum(2)

    return ds @ k * scale, fold(dk), fold(dv)


# ------------------------------------------------------------------------------------ the ring
class _Ring:
    """The ring of the group: neighbours as global ranks, exchanges posted with batch_isend_irecv
    (a send paired with a receive cannot deadlock, lesson 10), counted in ``stats``."""

    def __init__(self, group, stats: dict | None):
        self.group, self.stats = group, stats
        self.rank, self.p = groups.rank(group), groups.size(group)
        self.right = groups.global_rank(group, (self.rank + 1) % self.p)
        self.left = groups.global_rank(group, (self.rank - 1) % self.p)

    def start(self, send: torch.Tensor) -> tuple[torch.Tensor, list]:
        """Post ``send`` to the right neighbour and a receive from the left one; returns at once."""
        recv = torch.empty_like(send)
        with torch.profiler.record_function("dtrain:cp"):   # lets a profiler attribute the sends to CP
            reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, send, self.right, self.group),
                                           dist.P2POp(dist.irecv, recv, self.left, self.group)])
        if self.stats is not None:
            self.stats["sends"] = self.stats.get("sends", 0) + 1
            self.stats["send_bytes"] = self.stats.get("send_bytes", 0) + groups.nbytes(send)
        return recv, reqs

    @staticmethod
    def finish(pending: tuple[torch.Tensor, list]) -> torch.Tensor:
        recv, reqs = pending
        for r in reqs:
            r.wait()
        return recv


def _log_block(stats, phase: str, step: int, rank: int, owner: int) -> None:
    """Record, in ``stats["blocks"]``, whose K/V block (and in backward whose dK/dV accumulator)
    ``rank`` worked on at ``step``: what lesson 13 draws the two rings from."""
    if stats is not None:
        stats.setdefault("blocks", []).append({"phase": phase, "step": step, "rank": rank, "owner": owner})


def _add_work(stats, pairs, q, n) -> None:
    if stats is not None:
        b, h = q.shape[0], q.shape[1]
        stats["qk_pairs"] = stats.get("qk_pairs", 0) + b * h * sum(n * (n + 1) // 2 if d else n * n
                                                                      for _, _, d in pairs)


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype the ring accumulates in: float32, or the input's dtype where that is wider (float64
    stays float64). bf16 has 8 significant bits: a log-sum-exp near 3 is then rounded to 2⁻⁶, which
    rescales the merged output by up to 0.8 %, at every merge; FlashAttention, ring-flash-attention
    and picotron all merge in float32 and cast the output once at the end."""
    return torch.promote_types(dtype, torch.float32)


class _RingAttention(torch.autograd.Function):
    """Forward and backward rings. Everything that accumulates (the output, the log-sum-exp, ``dq``
    and the travelling ``dK/dV``) is in :func:`_acc_dtype` of the input; the K/V blocks travel in
    the input's dtype and each block is computed in the accumulation dtype (bf16 × bf16 products are
    exact in float32: what a GPU's bf16 matmul accumulating in float32 computes).

    Cost in ring bytes: with bf16 (or fp16) inputs the ``dK/dV`` blocks that travel in backward are
    float32, twice the bytes of the bf16 K/V blocks (:func:`ring_comm_bytes` counts them so). Sending
    them in bf16 would round the partial sums at every hop, the error this dtype choice removes."""

    @staticmethod
    def forward(ctx, q, k, v, causal, layout, group, overlap, stats, acc_dtype):
        ring = _Ring(group, stats)
        r, p = ring.rank, ring.p
        n_local = q.shape[-2]
        _check_layout(n_local * p, p, layout)
        mine = chunk_ids(r, p, layout)
        n = n_local // len(mine)
        scale = 1.0 / math.sqrt(q.shape[-1])
        acc = acc_dtype or _acc_dtype(q.dtype)
        qa = q.to(acc)
        o = torch.zeros(q.shape, dtype=acc, device=q.device)
        lse = torch.full(q.shape[:-1], float("-inf"), dtype=acc, device=q.device)
        kv = torch.stack([k, v]).contiguous()               # one message per step: K and V together (input dtype)
        for s in range(p):
            pending = ring.start(kv) if s < p - 1 and overlap else None   # posted before the compute
            owner = (r - s) % p
            _log_block(stats, "forward", s, r, owner)
            pairs = _pairs(mine, chunk_ids(owner, p, layout), n, causal)
            kva = kv.to(acc)
            for qs, ks, diag in pairs:
                ob, lb = block_attention(qa[..., qs, :], kva[0][..., ks, :], kva[1][..., ks, :], scale, diag)
                o[..., qs, :], lse[..., qs] = online_softmax_merge(o[..., qs, :], lse[..., qs], ob, lb)
            _add_work(stats, pairs, q, n)
            if s < p - 1:
                kv = ring.finish(pending if overlap else ring.start(kv))
        ctx.save_for_backward(q, k, v, o, lse)              # o and lse in the accumulation dtype
        ctx.args = (causal, layout, group, overlap, stats, acc)
        return o.to(q.dtype)

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        causal, layout, group, overlap, stats, acc = ctx.args
        ring = _Ring(group, stats)
        r, p = ring.rank, ring.p
        mine = chunk_ids(r, p, layout)
        n = q.shape[-2] // len(mine)
        scale = 1.0 / math.sqrt(q.shape[-1])
        qa, do = q.to(acc), do.to(acc).contiguous()
        delta = (do * o).sum(-1)                            # rowsum(dO ∘ O), once for every block
        dq = torch.zeros(q.shape, dtype=acc, device=q.device)
        kv = torch.stack([k, v]).contiguous()               # travels in the input dtype, as in forward
        dkv = torch.zeros(kv.shape, dtype=acc, device=kv.device)   # the accumulator of the block I hold
        dkv_pending = None
        # Two streams of the same shape go to the same right neighbour and come from the same left
        # one: K/V (input dtype) and dK/dV (accumulation dtype: the same dtype too when the input is
        # float32/64), with the same group and the same tag (0), so nothing in a message says which
        # stream it belongs to. They cannot be swapped because point-to-point messages between two
        # ranks are matched in the order they are posted (gloo: per pair and tag, in order over
        # one connection; NCCL: in order on the communicator's stream), and every rank posts the
        # same sequence: each step, K/V first (at the top when ``overlap``, after the dK/dV post
        # otherwise; ``overlap`` is the same on every rank), then dK/dV; none in the last step for K/V.
        # So the i-th receive I post from the left is the i-th send the left neighbour posts to me,
        # and both are the same stream. A rank that posted them in another order (e.g. a branch on
        # its rank) would silently receive K/V as gradients when the dtypes are equal.
        for s in range(p):
            kv_pending = ring.start(kv) if s < p - 1 and overlap else None
            owner = (r - s) % p
            _log_block(stats, "backward", s, r, owner)
            mine_dkv = torch.zeros(kv.shape, dtype=acc, device=kv.device)
            kva = kv.to(acc)
            for qs, ks, diag in _pairs(mine, chunk_ids(owner, p, layout), n, causal):
                gq, gk, gv = _block_backward(qa[..., qs, :], kva[0][..., ks, :], kva[1][..., ks, :], o[..., qs, :],
                                             lse[..., qs], do[..., qs, :], delta[..., qs], scale, diag)
                dq[..., qs, :] += gq
                mine_dkv[0][..., ks, :] += gk
                mine_dkv[1][..., ks, :] += gv
            if dkv_pending is not None:                     # the accumulator sent by the left neighbour
                dkv = ring.finish(dkv_pending)
            dkv = dkv + mine_dkv
            if p > 1:                                       # pass it on: after p hops it is home
                dkv_pending = ring.start(dkv)
            if s < p - 1:
                kv = ring.finish(kv_pending if overlap else ring.start(kv))
        if dkv_pending is not None:
            dkv = ring.finish(dkv_pending)
        return dq.to(q.dtype), dkv[0].to(k.dtype), dkv[1].to(v.dtype), None, None, None, None, None, None


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = True,
                   layout: str = "zigzag", group: groups.Group = None, overlap: bool = True,
                   stats: dict | None = None, _acc_dtype: torch.dtype | None = None) -> torch.Tensor:
    """Attention of this rank's queries to the whole sequence, whose shards are spread over ``group``.

    ``q, k, v``: this rank's shard ``(b, h, S/p, d)`` as :func:`shard_sequence` cuts it with
    ``layout``; ``k`` and ``v`` may have fewer heads, a divisor of ``h`` (grouped-query attention:
    the ring then carries only the K/V heads). Returns this rank's rows of the output; differentiable (backward is a second ring).
    ``overlap=False`` waits for each K/V block before computing (to measure what overlap hides).
    ``stats`` (a dict) accumulates ``sends``, ``send_bytes`` and ``qk_pairs`` (query-key products this
    rank computed, masked ones skipped), and lists in ``blocks`` whose K/V block each step used.

    The output, log-sum-exp and gradients accumulate in float32 (float64 for float64 input) and are
    cast to the input's dtype at the end; ``_acc_dtype`` forces another accumulation dtype (tests
    only: ``torch.bfloat16`` reproduces a ring that merges in bf16)."""
    if q.dim() != 4 or k.shape != v.shape or k.dim() != 4 or q.shape[::2] != k.shape[::2] \
            or q.shape[-1] != k.shape[-1] or q.shape[1] % k.shape[1]:
        raise LabError("cp_bad_shapes", q=tuple(q.shape), k=tuple(k.shape), v=tuple(v.shape))
    return _RingAttention.apply(q, k, v, causal, layout, group, overlap, stats, _acc_dtype)


def ring_comm_bytes(b: int, heads: int, seq_len: int, head_dim: int, p: int, bytes_per_elem: int = 4,
                    grad_bytes_per_elem: int | None = None) -> dict:
    """What one ring-attention layer sends per rank: forward ``p-1`` K/V blocks, backward ``p-1`` K/V
    blocks and ``p`` dK/dV blocks, each block ``2 · b · heads · (S/p) · head_dim`` elements
    (``heads``: the K/V heads this rank holds). K/V travel in the input's dtype (``bytes_per_elem``);
    dK/dV travel in the accumulation dtype, ``grad_bytes_per_elem``, by default that of
    :func:`ring_attention`: ``max(bytes_per_elem, 4)`` (bf16 K/V: the dK/dV blocks are twice as big)."""
    if grad_bytes_per_elem is None:
        grad_bytes_per_elem = max(bytes_per_elem, 4)
    elems = 2 * b * heads * (seq_len // p) * head_dim
    block, grad_block = elems * bytes_per_elem, elems * grad_bytes_per_elem
    fwd, bwd_kv, bwd_grad = (p - 1), (p - 1), (p if p > 1 else 0)
    fwd_bytes, bwd_bytes = fwd * block, bwd_kv * block + bwd_grad * grad_block
    return {"block_bytes": block, "grad_block_bytes": grad_block, "forward_sends": fwd,
            "backward_sends": bwd_kv + bwd_grad, "forward_bytes": fwd_bytes, "backward_bytes": bwd_bytes,
            "total_bytes": fwd_bytes + bwd_bytes}
