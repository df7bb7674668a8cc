"""Tiny deterministic models used across the course.

They are small on purpose: every lesson runs on 2 CPU processes, and the tests compare parameters
after a few steps, so a model must train in milliseconds. Each constructor takes ``seed``: with a
seed the weights are drawn from a private generator state (``torch.random.fork_rng``), so building
a model neither depends on nor disturbs the global RNG; with ``seed=None`` it draws from the global
RNG like any ``nn.Module`` (``torch.manual_seed`` / :func:`dtrain_lab.jobs.runtime.seed_all` decide).

* :class:`MLP` — the workhorse: ``Linear → ReLU → … → Linear``.
* :class:`TiedMLP` — token model whose input embedding and output projection are **one**
  ``nn.Parameter`` registered twice (``head.weight is embed.weight``), as in GPT-2.
* :class:`FrozenMLP` — an :class:`MLP` whose first layer has ``requires_grad=False`` (fine-tuning).
* :class:`BranchMLP` — has a residual ``branch`` that a step may skip (``use_branch=False``): its
  parameters then get no gradient, the case of DDP's ``find_unused_parameters``.
* :class:`TinyTransformer` — a causal decoder (pre-LayerNorm blocks, separate q/k/v/o and fc1/fc2
  projections so that later lessons can shard them), d=32, 1–2 blocks.
"""
from __future__ import annotations

import contextlib
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from dtrain_lab.i18n import LabError

__all__ = ["MLP", "TiedMLP", "FrozenMLP", "BranchMLP", "TinyTransformer", "Block", "seeded", "count_params"]


@contextlib.contextmanager
def seeded(seed: int | None):
    """Draw from a private RNG state seeded ``seed`` inside the block (no-op for ``None``).

    The global RNG is restored afterwards, so two models built with the same seed are identical
    whatever was drawn before, on every rank.
    """
    if seed is None:
        yield
        return
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


def count_params(module: nn.Module, trainable_only: bool = False) -> int:
    """Number of scalars in ``module``'s parameters (tied parameters counted once)."""
    return sum(p.numel() for p in module.parameters() if p.requires_grad or not trainable_only)


class MLP(nn.Module):
    """``depth`` hidden layers of width ``d_hidden`` with ReLU, then a linear output layer.

    ``depth=2`` gives three ``Linear`` layers (``layers.0``, ``layers.2``, ``layers.4``).
    """

    def __init__(self, d_in: int = 16, d_hidden: int = 32, d_out: int = 4, depth: int = 2, *,
                 seed: int | None = None):
        super().__init__()
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
            raise LabError("model_bad_depth", value=depth)
        self.d_in, self.d_hidden, self.d_out, self.depth = d_in, d_hidden, d_out, depth
        with seeded(seed):
            mods: list[nn.Module] = []
            width = d_in
            for _ in range(depth):
                mods += [nn.Linear(width, d_hidden), nn.ReLU()]
                width = d_hidden
            mods.append(nn.Linear(width, d_out))
            self.layers = nn.Sequential(*mods)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


class FrozenMLP(MLP):
    """An :class:`MLP` whose first ``Linear`` is frozen (``requires_grad=False``): DDP must skip it."""

    def __init__(self, d_in: int = 16, d_hidden: int = 32, d_out: int = 4, depth: int = 2, *,
                 seed: int | None = None):
        super().__init__(d_in, d_hidden, d_out, depth, seed=seed)
        for p in self.layers[0].parameters():
            p.requires_grad_(False)


class TiedMLP(nn.Module):
    """Token ids ``(B,)`` or ``(B, T)`` → logits over ``vocab``; embedding and output projection share
    one weight of shape ``(vocab, d_hidden)``.

    ``model.head.weight is model.embed.weight``: ``named_parameters()`` lists it once (as
    ``embed.weight``), and its gradient is the sum of both uses — a data-parallel wrapper must reduce
    it once, not twice.
    """

    def __init__(self, vocab: int = 16, d_hidden: int = 32, depth: int = 1, *, seed: int | None = None):
        super().__init__()
        self.vocab, self.d_hidden = vocab, d_hidden
        with seeded(seed):
            self.embed = nn.Embedding(vocab, d_hidden)
            self.hidden = nn.ModuleList(nn.Linear(d_hidden, d_hidden) for _ in range(depth))
            self.head = nn.Linear(d_hidden, vocab, bias=False)
        self.head.weight = self.embed.weight  # the tie: one Parameter, two modules

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens)
        for layer in self.hidden:
            h = h + torch.tanh(layer(h))
        return self.head(h)


class BranchMLP(nn.Module):
    """``trunk → (+ branch, if use_branch) → head``. With ``use_branch=False`` the branch's two
    parameters are not part of the autograd graph and get no gradient in that step."""

    def __init__(self, d_in: int = 16, d_hidden: int = 32, d_out: int = 4, *, seed: int | None = None):
        super().__init__()
        with seeded(seed):
            self.trunk = nn.Linear(d_in, d_hidden)
            self.branch = nn.Linear(d_hidden, d_hidden)
            self.head = nn.Linear(d_hidden, d_out)

    def forward(self, x: torch.Tensor, use_branch: bool = True) -> torch.Tensor:
        h = torch.relu(self.trunk(x))
        if use_branch:
            h = h + torch.relu(self.branch(h))
        return self.head(h)


class Block(nn.Module):
    """Pre-LayerNorm transformer block: ``x + attn(ln1(x))``, then ``x + mlp(ln2(x))``; causal."""

    def __init__(self, d: int = 32, n_heads: int = 2, mlp_ratio: int = 4):
        super().__init__()
        if d % n_heads:
            raise LabError("model_heads_divide", d=d, n_heads=n_heads)
        self.n_heads = n_heads
        self.ln1 = nn.LayerNorm(d)
        self.q_proj = nn.Linear(d, d)
        self.k_proj = nn.Linear(d, d)
        self.v_proj = nn.Linear(d, d)
        self.o_proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, mlp_ratio * d)
        self.fc2 = nn.Linear(mlp_ratio * d, d)

    def attention(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        h = self.n_heads

        def split(y: torch.Tensor) -> torch.Tensor:  # (B, T, d) -> (B, heads, T, d/heads)
            return y.view(b, t, h, d // h).transpose(1, 2)

        q, k, v = split(self.q_proj(x)), split(self.k_proj(x)), split(self.v_proj(x))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(d // h)
        mask = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, d)
        return self.o_proj(y)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.ln1(x))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class TinyTransformer(nn.Module):
    """A causal language model: token + position embeddings, ``n_layers`` :class:`Block`, final
    LayerNorm, linear head. Tokens ``(B, T)`` with ``T <= max_len`` → logits ``(B, T, vocab)``.

    Attention is written out (no fused kernel) so that the lessons can show and shard every matmul.
    """

    def __init__(self, vocab: int = 32, d: int = 32, n_heads: int = 2, n_layers: int = 2, max_len: int = 16,
                 *, seed: int | None = None):
        super().__init__()
        self.vocab, self.d, self.max_len = vocab, d, max_len
        with seeded(seed):
            self.tok_emb = nn.Embedding(vocab, d)
            self.pos_emb = nn.Embedding(max_len, d)
            self.blocks = nn.ModuleList(Block(d, n_heads) for _ in range(n_layers))
            self.ln_f = nn.LayerNorm(d)
            self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        t = tokens.shape[-1]
        if t > self.max_len:
            raise LabError("model_seq_too_long", t=t, max_len=self.max_len)
        pos = torch.arange(t, device=tokens.device)
        x = self.tok_emb(tokens) + self.pos_emb(pos)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))
