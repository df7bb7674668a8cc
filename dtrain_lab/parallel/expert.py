"""Expert parallelism from scratch: a mixture-of-experts layer whose experts live on different ranks.

A mixture-of-experts (MoE) layer replaces one MLP by ``E`` expert MLPs and a *router* (Shazeer et al.
2017, *Outrageously Large Neural Networks*; GShard, Lepikhin et al. 2020; Switch Transformer, Fedus,
Zoph & Shazeer 2021). For each token the router's softmax picks the ``top_k`` experts; the token's
output is the gate-weighted sum of those experts' outputs. Each expert sees only some tokens, so the
parameters grow ``E``-fold while the compute per token grows ``top_k``-fold.

* **Capacity.** An expert processes at most ``C = ceil(capacity_factor · T · top_k / E)`` of the
  ``T`` tokens of a batch (GShard section 2.2; Switch section 2.2). Assignments are served first
  choices first, then by token order; the rest are *dropped*: that expert contributes nothing and
  the token keeps only its other experts (and the residual connection around the layer).
* **Load balancing.** Switch Transformer's auxiliary loss (its equation 4, generalised to top-k):
  ``L_aux = E · Σ_i f_i · P_i`` with ``f_i`` the fraction of assignments routed to expert ``i`` and
  ``P_i`` the mean router probability of ``i``. It is 1 when routing is uniform and grows as the
  router favours few experts; add ``α · L_aux`` (α ≈ 0.01) to the loss.
* **Expert parallelism (EP).** The ``E`` experts are split over the ``ep`` ranks of ``group``
  (``E/ep`` each); every rank routes its own tokens, then one ``all_to_all_single`` *dispatches* each
  token to the rank of its expert and a second one *combines* the results back (GShard section 3.2).
  The splits are uneven — they depend on the router — so the ranks first exchange how many tokens
  each sends to each expert (a small All-to-All of counts). Backward sends the gradients the same
  two ways in reverse.

Bytes each rank hands to the All-to-Alls per step and layer: ``2 · (N_sent + N_received) · d · b``
(dispatch and combine, forward and backward), of which the rows for its own experts stay local;
plus ``E`` counts (see :func:`moe_comm_bytes`); balanced routing makes it ``4 · T · k · d · b``.
With one rank (``group`` of size 1 or none) the layer is plain code: the same routing, no
communication.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from dtrain_lab.comm import groups
from dtrain_lab.i18n import LabError
from dtrain_lab.models import seeded

__all__ = ["Routing", "route", "load_balancing_loss", "all_to_all", "MoE", "moe_comm_bytes"]


@dataclass
class Routing:
    """The router's decision for ``T`` tokens: ``expert``, ``gate`` and ``keep`` are ``(T, top_k)``."""

    expert: torch.Tensor      # int64: which expert each of a token's top_k slots goes to
    gate: torch.Tensor        # the weight of that expert's output in the token's output
    keep: torch.Tensor        # bool: False where the expert was full (the assignment is dropped)
    probs: torch.Tensor       # (T, E) router softmax, for the load-balancing loss
    capacity: int

    @property
    def dropped(self) -> int:
        return int((~self.keep).sum())

    def counts(self, n_experts: int) -> torch.Tensor:
        """Kept assignments per expert: ``(E,)``."""
        return torch.bincount(self.expert[self.keep], minlength=n_experts)


def route(logits: torch.Tensor, top_k: int, capacity_factor: float | None) -> Routing:
    """Top-k routing with a capacity. ``logits``: ``(T, E)``. Gates are the softmax probabilities of
    the chosen experts, renormalised to sum to 1 when ``top_k > 1`` (GShard's top-2, Mixtral).
    ``capacity_factor=None``: no capacity, nothing is dropped."""
    t, e = logits.shape
    if not 1 <= top_k <= e:
        raise LabError("ep_bad_topk", k=top_k, experts=e)
    probs = logits.softmax(-1)
    gate, expert = probs.topk(top_k, dim=-1)
    if top_k > 1:
        gate = gate / gate.sum(-1, keepdim=True)
    capacity = t * top_k if capacity_factor is None else math.ceil(capacity_factor * t * top_k / e)
    # position of each assignment in its expert's queue: slot-major (first choices first), then token order
    order = expert.t().reshape(-1)                                   # (k·T,) slot 0 of all tokens, then slot 1…
    onehot = F.one_hot(order, e)
    position = ((onehot.cumsum(0) - 1) * onehot).sum(-1)             # how many came before, same expert
    keep = (position < capacity).reshape(top_k, t).t()
    return Routing(expert, gate, keep, probs, capacity)


def load_balancing_loss(routing: Routing) -> torch.Tensor:
    """Switch Transformer's auxiliary loss ``E · Σ_i f_i · P_i`` (f from all assignments, kept or not)."""
    e = routing.probs.shape[-1]
    f = F.one_hot(routing.expert.reshape(-1), e).sum(0).to(routing.probs.dtype) / routing.expert.numel()
    return e * (f * routing.probs.mean(0)).sum()


class _AllToAll(torch.autograd.Function):
    """``all_to_all_single`` with uneven splits; its gradient goes back with the splits swapped."""

    @staticmethod
    def forward(ctx, x, send_splits, recv_splits, group):
        ctx.splits, ctx.group = (send_splits, recv_splits), group
        out = x.new_empty((sum(recv_splits),) + tuple(x.shape[1:]))
        with torch.profiler.record_function("dtrain:ep"):   # lets a profiler attribute the call to EP
            dist.all_to_all_single(out, x.contiguous(), recv_splits, send_splits, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        send_splits, recv_splits = ctx.splits
        return _AllToAll.apply(grad.contiguous(), recv_splits, send_splits, ctx.group), None, None, None


def all_to_all(x: torch.Tensor, send_splits: list[int], recv_splits: list[int], group=None) -> torch.Tensor:
    """Rows ``x`` cut into ``send_splits`` (one piece per rank of ``group``) go to their ranks; returns
    what this rank receives, ``recv_splits`` rows from each rank in rank order. Differentiable.
    With one rank it is the identity."""
    if groups.size(group) == 1:
        return x
    return _AllToAll.apply(x, list(send_splits), list(recv_splits), group)


class MoE(nn.Module):
    """An MoE layer with ``n_experts`` SwiGLU MLPs (``silu(x W1) ∘ (x W3) → W2``, as in Mixtral), top-k
    routing and a capacity;
    this rank holds experts ``[rank · E/ep, (rank+1) · E/ep)`` of ``group`` (all of them with one rank).

    ``forward(x)`` takes ``(..., d)`` tokens and returns ``(y, aux_loss)``; ``last_stats`` then holds
    ``dropped``, ``sent`` (assignments this rank dispatched, per destination rank) and ``received``.
    """

    def __init__(self, d: int, hidden: int, n_experts: int, top_k: int = 2, capacity_factor: float | None = 1.25,
                 *, group: groups.Group = None, seed: int | None = 0):
        super().__init__()
        ep, rank = groups.size(group), groups.rank(group)
        if n_experts % ep:
            raise LabError("ep_uneven_experts", experts=n_experts, ep=ep)
        if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= n_experts:
            raise LabError("ep_bad_topk", k=top_k, experts=n_experts)
        self.d, self.n_experts, self.top_k, self.capacity_factor = d, n_experts, top_k, capacity_factor
        self.group, self.ep, self.local = group, ep, n_experts // ep
        self.first = rank * self.local
        with seeded(seed):        # the same full initialisation on every rank; each keeps its slice
            router = nn.Linear(d, n_experts, bias=False)
            w1 = torch.randn(n_experts, d, hidden) / math.sqrt(d)
            w3 = torch.randn(n_experts, d, hidden) / math.sqrt(d)
            w2 = torch.randn(n_experts, hidden, d) / math.sqrt(hidden)
        self.router = router
        mine = slice(self.first, self.first + self.local)
        self.w1 = nn.Parameter(w1[mine].clone())   # (E/ep, d, hidden)
        self.w3 = nn.Parameter(w3[mine].clone())   # (E/ep, d, hidden)
        self.w2 = nn.Parameter(w2[mine].clone())   # (E/ep, hidden, d)
        self.balanced = False
        self.last_stats: dict = {}

    def experts(self, x: torch.Tensor, counts: list[int]) -> torch.Tensor:
        """Local expert ``i`` on the next ``counts[i]`` rows of ``x`` (rows grouped by local expert)."""
        outs = [(F.silu(chunk @ self.w1[i]) * (chunk @ self.w3[i])) @ self.w2[i]
                for i, chunk in enumerate(torch.split(x, counts))]
        return torch.cat(outs) if outs else x

    def _learned(self, logits: torch.Tensor):
        """The router's top-k with capacity: kept assignments sorted by expert (token order inside one)."""
        r = route(logits, self.top_k, self.capacity_factor)
        tok = torch.arange(logits.shape[0], device=logits.device).unsqueeze(1).expand_as(r.expert)[r.keep]
        slot_expert, slot_gate = r.expert[r.keep], r.gate[r.keep]
        order = torch.sort(slot_expert, stable=True).indices
        per_expert = torch.bincount(slot_expert, minlength=self.n_experts).tolist()
        return tok[order], slot_gate[order], per_expert, load_balancing_loss(r), r.dropped, r.capacity

    def _balanced(self, logits: torch.Tensor):
        """Planning routing (``self.balanced = True``): the router runs as usual (its softmax, top-k and
        loss), but assignment ``i = t·k + j`` of token ``t`` goes to expert ``i mod E``, every expert
        getting its even share (up to the capacity), with the router's probability of that expert as
        gate. The assignment depends on no data, so it also runs on fake tensors: the planner's dry run
        uses it, as the balanced routing a plan assumes."""
        r = route(logits, self.top_k, self.capacity_factor)
        t, k, e = logits.shape[0], self.top_k, self.n_experts
        kept = [list(range(ex, t * k, e))[:r.capacity] for ex in range(e)]     # assignment ids, by expert
        ids = [i for ex in kept for i in ex]
        tok = torch.tensor([i // k for i in ids], dtype=torch.long, device=logits.device)
        expert = torch.tensor([i % e for i in ids], dtype=torch.long, device=logits.device)
        return tok, r.probs[tok, expert], [len(ex) for ex in kept], load_balancing_loss(r), t * k - len(ids), \
            r.capacity

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        shape = x.shape
        x = x.reshape(-1, self.d)                                         # (T, d)
        tok, slot_gate, per_expert, aux, dropped, cap = (self._balanced if self.balanced else self._learned)(
            self.router(x))
        ep, local = self.ep, self.local
        send = [sum(per_expert[i * local:(i + 1) * local]) for i in range(ep)]   # rows to each rank
        # 1) counts: rc[src][i] = rows rank src sends to my local expert i
        rc = [per_expert[self.first:self.first + local]]
        if ep > 1:
            counts = torch.tensor(per_expert, dtype=torch.long, device=x.device).view(ep, local)
            recv_counts = torch.empty_like(counts)
            with torch.profiler.record_function("dtrain:ep"):
                dist.all_to_all_single(recv_counts, counts, group=self.group)
            # balanced routing: every rank sends the same counts (a fake tensor has no values to read)
            rc = [rc[0]] * ep if self.balanced else recv_counts.tolist()
        recv = [sum(row) for row in rc]
        # 2) dispatch: token rows to the ranks of their experts
        got = all_to_all(x[tok], send, recv, self.group)                   # (Σ recv, d), source-major
        # regroup source-major → expert-major, run the experts, and back
        starts = [[0] * local for _ in range(ep)]
        pos = 0
        for src in range(ep):
            for i in range(local):
                starts[src][i], pos = pos, pos + rc[src][i]
        by_expert = torch.tensor([starts[src][i] + n for i in range(local) for src in range(ep)
                                  for n in range(rc[src][i])], dtype=torch.long, device=x.device)
        out = self.experts(got[by_expert], [sum(rc[src][i] for src in range(ep)) for i in range(local)])
        out = out[torch.argsort(by_expert)]
        # 3) combine: results back to the tokens' ranks, weighted by the gates, summed over slots
        back = all_to_all(out, recv, send, self.group)                      # (Σ send, d), my sorted order
        y = torch.zeros_like(x).index_add(0, tok, back * slot_gate.unsqueeze(1))
        self.last_stats = {"dropped": dropped, "capacity": cap, "sent": send, "received": recv,
                           "kept": sum(per_expert)}
        return y.reshape(shape), aux


def moe_comm_bytes(kept: int, d: int, ep: int, n_experts: int, bytes_per_elem: int = 4, *,
                   received: int | None = None, local: int | None = None, count_bytes: int = 8) -> dict:
    """Bytes one rank hands to the All-to-Alls of one MoE layer in one training step (GShard section
    3.2). Forward: the ``E`` int64 counts, the dispatch of its ``kept`` assignments and the combine of
    the ``received`` rows its experts computed; backward: the same two buffers again, in reverse
    (the combine's gradient is ``kept`` rows, the dispatch's ``received``). Five calls.

    ``payload_bytes`` is what the calls are given; ``wire_bytes`` leaves out the ``local`` rows that
    stay on the rank (its own experts' share). Without routing data: ``received = kept`` and
    ``local = kept / ep``, the balanced case (what a planner assumes)."""
    if ep == 1:
        return {"calls": 0, "payload_bytes": 0, "wire_bytes": 0}
    received = kept if received is None else received
    local = kept / ep if local is None else local
    row = d * bytes_per_elem
    counts = n_experts * count_bytes
    return {"calls": 5, "payload_bytes": 2 * (kept + received) * row + counts,
            "wire_bytes": 2 * (kept - local + received - local) * row + counts * (ep - 1) / ep}
