"""All five parallelisms in one transformer block: what lesson 14's layouts and the planner run.

A Llama-style block (Touvron et al. 2023; Dubey et al. 2024, *The Llama 3 Herd of Models*): RMSNorm,
causal self-attention with grouped-query heads, residual; RMSNorm, SwiGLU MLP (Shazeer 2020) or an MoE
layer (:class:`dtrain_lab.parallel.expert.MoE`), residual. No positional encoding (the tokens come
in as vectors): the block then treats every position alike, so CP's zig-zag reordering needs no
position ids.

:class:`ParallelBlock` is the same block on one rank of a :class:`~dtrain_lab.parallel.dims.ParallelDims`
layout:

* **TP** (Megatron, lesson 07): q/k/v and the MLP's ``w1``/``w3`` split by output rows (heads, hidden
  units), ``o`` and ``w2`` by input columns; ``f`` before each region (All-Reduce of the gradient in
  backward), ``g`` after (All-Reduce forward): 2 All-Reduces forward and 2 backward per block.
* **CP**: attention is :func:`~dtrain_lab.parallel.context.ring_attention` over the cp group on the
  zig-zag shard of the sequence; everything else acts token by token and needs no communication.
* **EP**: an MoE block's experts are split over the ep group (MoE layers need ``tp = 1`` here:
  expert tensor parallelism is left to the planner's formulas).
* **PP** and **DP** act on whole blocks: a stage is a run of blocks (:mod:`dtrain_lab.parallel.pipeline`);
  gradients are averaged afterwards (:func:`sync_gradients`).

Blocks are cut from a full :class:`Block` built with the same seed on every rank, so a test can
compare the parallel layout with one process running the full blocks.
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
from dtrain_lab.parallel.context import attention_reference, ring_attention
from dtrain_lab.parallel.expert import MoE
from dtrain_lab.parallel.tensor import f, g

__all__ = ["ModelConfig", "Block", "ParallelBlock", "is_moe_layer", "sync_gradients"]


@dataclass(frozen=True)
class ModelConfig:
    """A decoder-only transformer. ``n_experts > 0``: every ``moe_every``-th layer (1: all) is MoE
    with ``top_k`` routing and ``capacity_factor`` (None: nothing dropped)."""

    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    ffn_hidden: int
    vocab: int = 0
    n_experts: int = 0
    top_k: int = 2
    capacity_factor: float | None = None
    moe_every: int = 1

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads


def is_moe_layer(cfg: ModelConfig, layer: int) -> bool:
    return cfg.n_experts > 0 and (layer + 1) % cfg.moe_every == 0


def _rms(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return F.rms_norm(x, (x.shape[-1],), w, eps=1e-5)


class Block(nn.Module):
    """The full block on one process (the reference). ``x``: ``(b, S, d)``. ``moe_group``: the group
    an MoE layer's experts are spread over (a group of one rank for a one-process reference)."""

    def __init__(self, cfg: ModelConfig, layer: int, *, seed: int = 0, moe_group: groups.Group = None):
        super().__init__()
        d, hd = cfg.d_model, cfg.head_dim
        self.cfg, self.moe = cfg, is_moe_layer(cfg, layer)
        with seeded(seed * 1000 + layer):
            self.norm1 = nn.Parameter(1 + 0.1 * torch.randn(d))
            self.wq = nn.Parameter(torch.randn(cfg.n_heads * hd, d) / math.sqrt(d))
            self.wk = nn.Parameter(torch.randn(cfg.n_kv_heads * hd, d) / math.sqrt(d))
            self.wv = nn.Parameter(torch.randn(cfg.n_kv_heads * hd, d) / math.sqrt(d))
            self.wo = nn.Parameter(torch.randn(d, cfg.n_heads * hd) / math.sqrt(cfg.n_heads * hd))
            self.norm2 = nn.Parameter(1 + 0.1 * torch.randn(d))
            if not self.moe:
                self.w1 = nn.Parameter(torch.randn(cfg.ffn_hidden, d) / math.sqrt(d))
                self.w3 = nn.Parameter(torch.randn(cfg.ffn_hidden, d) / math.sqrt(d))
                self.w2 = nn.Parameter(torch.randn(d, cfg.ffn_hidden) / math.sqrt(cfg.ffn_hidden))
        if self.moe:
            self.experts = MoE(d, cfg.ffn_hidden, cfg.n_experts, cfg.top_k, cfg.capacity_factor,
                               group=moe_group, seed=seed * 1000 + layer + 500)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        hd, cfg = self.cfg.head_dim, self.cfg
        h = _rms(x, self.norm1)
        q = (h @ self.wq.t()).view(b, s, cfg.n_heads, hd).transpose(1, 2)
        k = (h @ self.wk.t()).view(b, s, cfg.n_kv_heads, hd).transpose(1, 2)
        v = (h @ self.wv.t()).view(b, s, cfg.n_kv_heads, hd).transpose(1, 2)
        o = attention_reference(q, k, v, causal=True).transpose(1, 2).reshape(b, s, -1)
        x = x + o @ self.wo.t()
        h = _rms(x, self.norm2)
        if self.moe:
            return x + self.experts(h)[0]
        return x + (F.silu(h @ self.w1.t()) * (h @ self.w3.t())) @ self.w2.t()


class ParallelBlock(nn.Module):
    """This rank's share of a :class:`Block` under ``tp``, ``cp`` and ``ep`` groups (``None``: not
    split). ``x``: ``(b, S/cp, d)``, this rank's zig-zag shard of the sequence."""

    def __init__(self, cfg: ModelConfig, layer: int, *, seed: int = 0, tp: groups.Group = None,
                 cp: groups.Group = None, ep: groups.Group = None, device: str | torch.device = "cpu"):
        super().__init__()
        t, r = _size(tp), _rank(tp)
        if cfg.n_heads % t:
            raise LabError("tp_uneven_heads", heads=cfg.n_heads, tp=t)
        if cfg.n_kv_heads % t:
            raise LabError("dims_kv_heads_tp", kv=cfg.n_kv_heads, tp=t)
        if cfg.ffn_hidden % t:
            raise LabError("tp_uneven", what="ffn_hidden", n=cfg.ffn_hidden, tp=t)
        if is_moe_layer(cfg, layer) and t > 1:
            raise LabError("ep_moe_tp", tp=t)
        self.cfg, self.tp, self.cp, self.moe = cfg, tp, cp, is_moe_layer(cfg, layer)
        hd, self.heads, self.kv_heads = cfg.head_dim, cfg.n_heads // t, cfg.n_kv_heads // t
        with torch.device(device):          # "meta": shapes only, what the planner counts
            full = Block(cfg, layer, seed=seed, moe_group=ep)

        def rows(w, n):          # this rank's n-row slice (column-parallel: output features)
            return nn.Parameter(w.detach()[r * n:(r + 1) * n].clone())

        def cols(w, n):          # this rank's n-column slice (row-parallel: input features)
            return nn.Parameter(w.detach()[:, r * n:(r + 1) * n].clone())

        self.norm1, self.norm2 = nn.Parameter(full.norm1.detach().clone()), nn.Parameter(full.norm2.detach().clone())
        self.wq, self.wk, self.wv = rows(full.wq, self.heads * hd), rows(full.wk, self.kv_heads * hd), \
            rows(full.wv, self.kv_heads * hd)
        self.wo = cols(full.wo, self.heads * hd)
        if self.moe:
            self.experts = full.experts
        else:
            n = cfg.ffn_hidden // t
            self.w1, self.w3, self.w2 = rows(full.w1, n), rows(full.w3, n), cols(full.w2, n)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        hd = self.cfg.head_dim
        h = f(_rms(x, self.norm1), self.tp)                                   # f: All-Reduce of ∂h backward
        q = (h @ self.wq.t()).view(b, s, self.heads, hd).transpose(1, 2)      # (b, h/tp, S/cp, hd)
        k = (h @ self.wk.t()).view(b, s, self.kv_heads, hd).transpose(1, 2)
        v = (h @ self.wv.t()).view(b, s, self.kv_heads, hd).transpose(1, 2)
        o = ring_attention(q, k, v, causal=True, layout="zigzag", group=self.cp)
        x = x + g(o.transpose(1, 2).reshape(b, s, -1) @ self.wo.t(), self.tp)  # g: All-Reduce forward
        h = _rms(x, self.norm2)
        if self.moe:
            return x + self.experts(h)[0]
        h = f(h, self.tp)
        return x + g((F.silu(h @ self.w1.t()) * (h @ self.w3.t())) @ self.w2.t(), self.tp)


def _size(group) -> int:
    return 1 if group is None else groups.size(group)


def _rank(group) -> int:
    return 0 if group is None else groups.rank(group)


def expert_parameters(module: nn.Module) -> list[nn.Parameter]:
    """The MoE experts' weights (split over ep; averaged over edp), not the router's."""
    return [p for m in module.modules() if isinstance(m, MoE) for p in (m.w1, m.w3, m.w2)]


def sync_gradients(module: nn.Module, dense_group: groups.Group, expert_group: groups.Group,
                   data_ranks: int) -> dict:
    """Average gradients after backward: dense ones over ``dense_group`` (dp × cp: the ranks holding the
    same weights), expert ones over ``expert_group`` (edp), both divided by ``data_ranks`` = dp · cp —
    an expert's gradient already sums the tokens of its whole ep group (torchtitan divides FSDP-sharded
    experts by the data-parallel degree for the same reason). One flat All-Reduce per group (ZeRO-0).
    Returns ``{"dense": numel, "expert": numel}`` all-reduced."""
    experts = {id(p) for p in expert_parameters(module)}
    out = {}
    for name, group, ps in (("dense", dense_group, [p for p in module.parameters() if id(p) not in experts]),
                            ("expert", expert_group, expert_parameters(module))):
        ps = [p for p in ps if p.grad is not None]
        if not ps:
            continue
        flat = torch.cat([p.grad.reshape(-1) for p in ps])
        if _size(group) > 1:
            with torch.profiler.record_function("dtrain:dp" if name == "dense" else "dtrain:edp"):
                dist.all_reduce(flat, group=group)
        flat /= data_ranks
        for p, piece in zip(ps, torch.split(flat, [p.numel() for p in ps])):
            p.grad.copy_(piece.view_as(p))
        out[name] = flat.numel()
    return out
