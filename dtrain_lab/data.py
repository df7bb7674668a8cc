"""Synthetic data sets, generated from a seed: no downloads, identical on every machine.

* :func:`regression_dataset` — ``y = x @ W + noise`` for :class:`~dtrain_lab.models.MLP` (MSE).
* :func:`classification_dataset` — Gaussian blobs, one per class (cross-entropy).
* :func:`token_dataset` — token sequences whose next token is a fixed function of the current one,
  for :class:`~dtrain_lab.models.TiedMLP` and :class:`~dtrain_lab.models.TinyTransformer`.
* :func:`shard` — the slice of a global batch that one rank of data parallelism trains on.

Every function draws from its own ``torch.Generator``: the global RNG is untouched.
"""
from __future__ import annotations

import torch
from torch.utils.data import TensorDataset

from dtrain_lab.i18n import LabError

__all__ = ["regression_dataset", "classification_dataset", "token_dataset", "shard", "global_batch"]


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(int(seed))


def regression_dataset(n: int = 256, d_in: int = 16, d_out: int = 4, seed: int = 0,
                       noise: float = 0.1) -> TensorDataset:
    """``n`` pairs ``(x, y)``, ``x ~ N(0, I)`` of size ``d_in``, ``y = x @ W + noise·ε`` of size
    ``d_out`` with a fixed random ``W`` (drawn from ``seed`` too)."""
    g = _gen(seed)
    w = torch.randn(d_in, d_out, generator=g) / d_in ** 0.5
    x = torch.randn(n, d_in, generator=g)
    y = x @ w + noise * torch.randn(n, d_out, generator=g)
    return TensorDataset(x, y)


def classification_dataset(n: int = 256, d_in: int = 16, n_classes: int = 4, seed: int = 0,
                           spread: float = 1.0) -> TensorDataset:
    """``n`` pairs ``(x, label)``: class ``c`` is a Gaussian blob of std ``spread`` around a random
    centre of norm ~3; labels are ``int64`` in ``[0, n_classes)``."""
    g = _gen(seed)
    centres = 3.0 * torch.nn.functional.normalize(torch.randn(n_classes, d_in, generator=g), dim=1)
    labels = torch.randint(0, n_classes, (n,), generator=g)
    x = centres[labels] + spread * torch.randn(n, d_in, generator=g)
    return TensorDataset(x, labels)


def token_dataset(n: int = 256, seq_len: int = 8, vocab: int = 16, seed: int = 0) -> TensorDataset:
    """``n`` pairs ``(tokens, targets)`` of shape ``(seq_len,)``: ``targets[t]`` is the token after
    ``tokens[t]``, and the sequence follows a fixed random permutation of the vocabulary (with a 10 %
    chance of a random token), so a model can learn it. ``seq_len=1`` gives ``(B,)``-shaped samples
    for :class:`~dtrain_lab.models.TiedMLP` after ``squeeze(-1)``."""
    g = _gen(seed)
    perm = torch.randperm(vocab, generator=g)
    seq = torch.empty(n, seq_len + 1, dtype=torch.long)
    seq[:, 0] = torch.randint(0, vocab, (n,), generator=g)
    for t in range(seq_len):
        nxt = perm[seq[:, t]]
        noise = torch.rand(n, generator=g) < 0.1
        seq[:, t + 1] = torch.where(noise, torch.randint(0, vocab, (n,), generator=g), nxt)
    return TensorDataset(seq[:, :-1].contiguous(), seq[:, 1:].contiguous())


def global_batch(dataset: TensorDataset, step: int, batch_size: int) -> tuple[torch.Tensor, ...]:
    """The ``step``-th global batch of ``batch_size`` samples (wrapping around the data set)."""
    n = len(dataset)
    idx = (torch.arange(batch_size) + step * batch_size) % n
    return tuple(t[idx] for t in dataset.tensors)


def shard(batch, rank: int, world_size: int):
    """Rank ``rank``'s contiguous slice of a global batch (a tensor or a tuple of tensors).

    The batch size must be divisible by ``world_size``: with equal shards the average of the ranks'
    mean losses is the mean loss of the global batch, which is what makes data parallelism exact.
    """
    if isinstance(batch, (tuple, list)):
        return type(batch)(shard(t, rank, world_size) for t in batch)
    n = batch.shape[0]
    if n % world_size:
        raise LabError("data_uneven_shards", n=n, world_size=world_size)
    per = n // world_size
    return batch[rank * per:(rank + 1) * per]
