"""Lab 13 — context and expert parallelism: the contract (what a submission may import).

Two exercises, written by the learner in the lab notebook (``solutions/_source/lab_13_context_expert.md``):

1. ``ring_attention(q, k, v)`` with its ``merge(o1, lse1, o2, lse2)``: causal attention of this
   rank's queries to the whole sequence, whose contiguous shards (queries, keys, values) are spread
   over the ranks; K/V blocks travel around the ring while each rank computes, and the partial
   results are merged with the online softmax (lesson 13, sections 2–3). 2 and 3 ranks.
2. ``moe_layer(x, dest, first, weights)``: this rank's tokens go to the ranks holding their experts
   (one ``all_to_all_single`` with uneven splits, after one of the counts), the local experts run on
   what arrived, and a second ``all_to_all_single`` brings the results home (lesson 13, section 7).
   2 and 3 ranks.

Every rank's inputs are private to it and drawn for every grade (:func:`make_inputs`): a rank sees
only its own queries/keys/values (exercise 1), its own tokens and the weights of its own experts
(exercise 2). An answer computed without the communication is wrong. The checks and references live
outside the sandbox (``dtrain_lab.grading.checks.lab13``).
"""
from __future__ import annotations

import math

import torch

from dtrain_lab.grading import contract

LAB = "lab_13"
BATCH, HEADS, TOKENS, HEAD_DIM = 1, 2, 4, 8     # exercise 1: each rank's shard (batch, heads, tokens, head_dim)
EXPERTS_PER_RANK, D = 2, 256                    # exercise 2


# ------------------------------------------------------------------ private inputs
def _tokens_of(seed: int, rank: int) -> int:
    return contract.rng(seed, "tokens", rank).randint(5, 9)


def _route(seed: int, rank: int, tokens: int, n_experts: int, attempt: int) -> list[int]:
    """The expert each of this rank's tokens goes to (-1: dropped by the capacity). Uneven on
    purpose: each rank favours two experts, others get few rows or none from it."""
    pick = contract.rng(seed, f"route{attempt}" if attempt else "route", rank)
    favourite = [pick.randrange(n_experts) for _ in range(2)]
    dest = []
    for _ in range(tokens):
        u = pick.random()
        if u < 0.15:
            dest.append(-1)
        elif u < 0.8:
            dest.append(favourite[0] if pick.random() < 0.6 else favourite[1])
        else:
            dest.append(pick.randrange(n_experts))
    return dest


def sends(dests: list, world: int) -> list[list[int]]:
    """``sends[i][j]``: how many rows rank ``i`` sends to rank ``j`` (the owner of their expert)."""
    return [[sum(1 for e in d if e >= 0 and e // EXPERTS_PER_RANK == j) for j in range(world)] for d in dests]


def _telling(dests: list, world: int) -> bool:
    """Whether a routing catches the usual mistakes, which pass by luck otherwise: some rank sends
    another a number of rows different from what it gets back (else never exchanging the counts
    works); some token is dropped (else leaving dropped rows unset or unzeroed works); some rank's
    kept tokens are not already in expert order (else not undoing the sort works)."""
    c = sends(dests, world)
    kept = [[e for e in d if e >= 0] for d in dests]
    return (any(c[i][j] != c[j][i] for i in range(world) for j in range(i))
            and any(e < 0 for d in dests for e in d)
            and any(a > b for k in kept for a, b in zip(k, k[1:])))


def routing(seed: int, world: int) -> tuple[list[int], list[list[int]]]:
    """``(tokens, dests)``: each rank's token count and the expert of each of its tokens (-1: dropped),
    redrawn until the routing tells the usual mistakes from the right answer (:func:`_telling`)."""
    n_experts = EXPERTS_PER_RANK * world
    tokens = [_tokens_of(seed, r) for r in range(world)]
    for attempt in range(64):
        dests = [_route(seed, r, tokens[r], n_experts, attempt) for r in range(world)]
        if _telling(dests, world):
            break
    return tokens, dests


def make_inputs(seed: int, world: int) -> list[dict]:
    """Per rank: its shard of q, k, v (exercise 1); its tokens, the expert each goes to (-1: dropped,
    by the capacity) and the weights of its own experts only (exercise 2).

    The routing is redrawn (deterministically in the seed) until it tells the usual mistakes from the
    right answer (:func:`_telling`)."""
    tokens, dests = routing(seed, world)
    out = []
    for r in range(world):
        g = contract.torch_generator(seed, "attention", r)
        q, k, v = (torch.randn(BATCH, HEADS, TOKENS, HEAD_DIM, generator=g, dtype=torch.float64) for _ in range(3))
        gx = contract.torch_generator(seed, "tokens", r)
        x = torch.randn(tokens[r], D, generator=gx, dtype=torch.float64)
        gw = contract.torch_generator(seed, "experts", r)
        weights = torch.randn(EXPERTS_PER_RANK, D, D, generator=gw, dtype=torch.float64) / math.sqrt(D)
        out.append({"q": q, "k": k, "v": v, "x": x, "dest": torch.tensor(dests[r], dtype=torch.long),
                    "first_expert": r * EXPERTS_PER_RANK, "weights": weights})
    return out


# ------------------------------------------------------------------ 1. ring attention
def block_attention(q, k, v, q_start: int, k_start: int):
    """Causal attention of the queries ``q`` (global positions ``q_start …``) to one K/V block (positions
    ``k_start …``): ``(o, lse)`` with ``o`` normalised over this block and ``lse`` (``(b, h, rows)``)
    the log-sum-exp of the block's scores; a query attends to keys at positions ≤ its own. Returns
    ``None`` when every key of the block comes after every query (nothing to attend to)."""
    n, m = q.shape[-2], k.shape[-2]
    if k_start > q_start + n - 1:
        return None
    s = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    qpos = torch.arange(q_start, q_start + n).unsqueeze(1)
    kpos = torch.arange(k_start, k_start + m).unsqueeze(0)
    s = s.masked_fill(kpos > qpos, float("-inf"))
    lse = torch.logsumexp(s, -1)
    return torch.exp(s - lse.unsqueeze(-1)) @ v, lse


def attend(ring_attention, merge) -> dict:
    """Driver of exercise 1: ``merge`` on two halves of this rank's own keys, every key visible to
    every query (no communication needed), then ``ring_attention`` on this rank's shard."""
    rank, _ = contract.rank_and_world()
    mine = contract.mine(make_inputs)
    q, k, v = mine["q"], mine["k"], mine["v"]
    later = (rank + 1) * TOKENS            # place the queries after the keys: nothing is masked
    first = block_attention(q, k[..., :2, :], v[..., :2, :], later, rank * TOKENS)
    second = block_attention(q, k[..., 2:, :], v[..., 2:, :], later, rank * TOKENS + 2)
    merged = merge(first[0], first[1], second[0], second[1])
    out = ring_attention(q, k, v)
    return {"merge": list(merged) if isinstance(merged, (tuple, list)) else merged, "out": out}


# ------------------------------------------------------------------ 2. dispatch and combine
def apply_expert(weight, rows):
    """Expert ``e``'s computation on its rows: ``tanh(rows @ W_e)``."""
    return torch.tanh(rows @ weight)


def moe(moe_layer) -> dict:
    """Driver of exercise 2: ``moe_layer(x, dest, first, weights)`` on this rank's private tokens."""
    mine = contract.mine(make_inputs)
    y = moe_layer(mine["x"], mine["dest"], mine["first_expert"], mine["weights"])
    return {"y": y}
