"""Mixed GPU types: uneven shares of the global batch, and gradients that still average correctly.

When one node has A100s and another T4s, giving every rank the same micro-batch makes the fast GPUs
wait for the slow ones at every all-reduce. :func:`plan` splits a global batch in proportion to each
rank's throughput (samples/s), then cuts each rank's share into micro-batches that fit its memory
(``max_micro``) with gradient accumulation::

    >>> p = plan(64, throughputs=[300, 300, 100, 100], max_micro=[16, 16, 8, 8])
    >>> [(r.samples, r.micro_batch, r.accum_steps) for r in p.ranks]
    [(24, 12, 2), (24, 12, 2), (8, 8, 1), (8, 8, 1)]

Averaging is where uneven shares go wrong. DDP *averages* gradients over ranks; when rank ``r``
processed ``n_r`` of the ``N`` samples and used a per-rank *mean* loss, the result is
``(1/W) Σ_r mean_r``, the mean of means, which weighs a sample of a small rank more than a sample of
a big one. The gradient of the global-batch mean is ``(1/N) Σ_r Σ_{i∈r} g_i``. Both ways to get it:

* scale each rank's *summed* loss by :func:`loss_scale` ``= W / N`` before ``backward()`` (DDP then
  divides by ``W``): ``(1/W) Σ_r (W/N) Σ_i g_i = (1/N) Σ g_i``. With accumulation, each
  micro-batch's summed loss gets the same factor; ranks may take different numbers of
  accumulation steps, since DDP all-reduces only in the one backward outside ``no_sync()``.
  ``no_sync()`` must wrap the micro-batch's forward as well as its backward: DDP decides in the
  forward whether the next backward all-reduces (a forward outside it, with only the backward
  inside, all-reduces anyway; ranks with different step counts then mismatch and abort);
* without DDP, :func:`weighted_allreduce_grads` multiplies each rank's mean-loss gradient by
  ``n_r``, sums over ranks and divides by ``N``.

``N`` is the all-reduced sum of the ``n_r`` (:func:`global_count`) when it is not known in advance
(a last, short batch).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable, Sequence

from dtrain_lab.comm import groups
from dtrain_lab.comm.groups import Group
from dtrain_lab.i18n import LabError, tr


@dataclass
class RankPlan:
    rank: int
    samples: int          # this rank's share of the global batch
    micro_batch: int      # samples per forward/backward (the last micro-batch may be smaller)
    accum_steps: int      # micro-batches per optimizer step
    throughput: float     # samples/s used to split the batch

    @property
    def micro_sizes(self) -> list[int]:
        """The size of each micro-batch; they sum to ``samples``."""
        sizes, left = [], self.samples
        for _ in range(self.accum_steps):
            sizes.append(min(self.micro_batch, left))
            left -= sizes[-1]
        return sizes

    @property
    def seconds(self) -> float:
        """Estimated compute time of this rank's share, ``samples / throughput``."""
        return self.samples / self.throughput


@dataclass
class HeteroPlan:
    global_batch: int
    ranks: list[RankPlan] = field(default_factory=list)

    @property
    def samples(self) -> list[int]:
        return [r.samples for r in self.ranks]

    @property
    def weights(self) -> list[float]:
        """``n_r / N``: each rank's weight in the global-batch mean."""
        return [r.samples / self.global_batch for r in self.ranks]

    @property
    def step_seconds(self) -> float:
        """Estimated compute time of one step: the slowest rank's (the others wait for it)."""
        return max(r.seconds for r in self.ranks)

    @property
    def even_step_seconds(self) -> float:
        """The same estimate with an even split (what a plain DistributedSampler does)."""
        n = len(self.ranks)
        shares = _largest_remainder(self.global_batch, [1.0] * n)
        return max(s / r.throughput for s, r in zip(shares, self.ranks))

    def table(self, lang: str | None = None) -> str:
        """Each rank's share, micro-batch × accumulation steps and estimated seconds, then the step
        time of this split against an even one, in the learner's language."""
        rows = [tr("het_table_head", lang)]
        for r in self.ranks:
            rows.append(f"{r.rank:>4}  {r.samples:>7}  {r.micro_batch:>5}×{r.accum_steps:<5}  "
                        f"{r.samples / self.global_batch:>5.1%}  {r.seconds:.3g}")
        planned, even = self.step_seconds, self.even_step_seconds
        rows.append(tr("het_table_foot", lang, planned=planned, even=even, ratio=even / planned))
        return "\n".join(rows)


def _positive(values: Iterable, what: str) -> list[float]:
    out = []
    for i, v in enumerate(values):
        try:
            f = float(v)
        except (TypeError, ValueError):
            f = float("nan")
        if isinstance(v, bool) or not (f > 0 and math.isfinite(f)):
            raise LabError("het_bad_value", what=what, rank=i, value=v)
        out.append(f)
    return out


def _largest_remainder(total: int, weights: Sequence[float], minimum: int = 0) -> list[int]:
    """Integers proportional to ``weights`` summing to ``total``, each ≥ ``minimum`` (Hamilton's method)."""
    n = len(weights)
    rest = total - minimum * n
    s = sum(weights)
    exact = [rest * w / s for w in weights]
    base = [int(math.floor(e)) for e in exact]
    order = sorted(range(n), key=lambda i: (-(exact[i] - base[i]), i))
    for i in order[: rest - sum(base)]:
        base[i] += 1
    return [b + minimum for b in base]


def plan(global_batch: int, throughputs: Sequence[float] | None = None,
         max_micro: Sequence[int] | None = None) -> HeteroPlan:
    """Split ``global_batch`` over ranks and choose each rank's micro-batch and accumulation steps.

    ``throughputs`` (samples/s per rank, measured) sets the shares; without them the shares follow
    ``max_micro`` (how many samples fit in each rank's memory at once), a rough proxy of speed.
    Every rank gets at least one sample. A rank's micro-batch is at most its ``max_micro``; its
    accumulation steps are the fewest that cover its share, and its micro-batches are made as equal
    as possible.
    """
    if not isinstance(global_batch, int) or isinstance(global_batch, bool) or global_batch < 1:
        raise LabError("het_bad_global", value=global_batch)
    if throughputs is None and max_micro is None:
        raise LabError("het_no_ranks")
    tp = _positive(throughputs, "throughputs") if throughputs is not None else None
    mm = None
    if max_micro is not None:
        mm = _positive(max_micro, "max_micro")
        for i, v in enumerate(max_micro):
            if not isinstance(v, int) or isinstance(v, bool):
                raise LabError("het_bad_value", what="max_micro", rank=i, value=v)
    if tp is not None and mm is not None and len(tp) != len(mm):
        raise LabError("het_lengths", n=len(tp), m=len(mm))
    speeds = tp if tp is not None else mm
    assert speeds is not None
    n = len(speeds)
    if n == 0:
        raise LabError("het_no_ranks")
    if global_batch < n:
        raise LabError("het_too_small", value=global_batch, n=n)
    shares = _largest_remainder(global_batch, speeds, minimum=1)
    ranks = []
    for r, samples in enumerate(shares):
        cap = int(mm[r]) if mm is not None else samples
        accum = math.ceil(samples / cap)
        micro = math.ceil(samples / accum)
        ranks.append(RankPlan(rank=r, samples=samples, micro_batch=micro, accum_steps=accum,
                              throughput=speeds[r]))
    return HeteroPlan(global_batch=global_batch, ranks=ranks)


# ----------------------------------------------------------------------------------- gradients
def _check_counts(local: int, total: int | None = None) -> None:
    bad = not isinstance(local, int) or isinstance(local, bool) or local < 0
    if total is not None:
        bad = bad or not isinstance(total, int) or isinstance(total, bool) or total <= 0 or local > total
    if bad:
        raise LabError("het_bad_counts", value=(local, total) if total is not None else local)


def loss_scale(local_samples: int, global_samples: int, world_size: int, average: bool = True) -> float:
    """The factor for a rank's *summed* loss (``reduction="sum"``) so that the all-reduced gradient
    is the gradient of the mean loss over the whole global batch.

    ``average=True`` for DDP (it divides the sum over ranks by ``world_size``): ``W / N``.
    ``average=False`` for a plain ``all_reduce(SUM)``: ``1 / N``. ``local_samples`` is only checked
    (a rank with zero samples still has to take part in the all-reduce, with a zero gradient).
    """
    _check_counts(local_samples, global_samples)
    if not isinstance(world_size, int) or world_size < 1:
        raise LabError("cl_bad_int", field="world_size", value=world_size, lo=1)
    return (world_size if average else 1) / global_samples


def global_count(local_samples: int, group: Group = None) -> int:
    """``N = Σ_r n_r``, all-reduced (1 process: ``local_samples``)."""
    import torch
    import torch.distributed as dist

    _check_counts(local_samples)
    if groups.size(group) == 1:
        return local_samples
    t = torch.tensor([local_samples], dtype=torch.int64)
    if dist.get_backend(group) == "nccl":
        t = t.cuda()
    dist.all_reduce(t, group=group)
    return int(t.item())


def weighted_allreduce_grads(params, local_samples: int, group: Group = None) -> int:
    """Turn each rank's gradient of its *mean* loss into the gradient of the global-batch mean:
    ``g ← Σ_r n_r g_r / Σ_r n_r`` (one all-reduce per gradient, plus one for the counts).

    Returns ``N``. A rank with ``local_samples == 0`` must still call it (its gradients count as zero).
    """
    import torch
    import torch.distributed as dist

    total = global_count(local_samples, group)
    if total <= 0:
        raise LabError("het_bad_counts", value=(local_samples, total))
    distributed = groups.size(group) > 1
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        p.grad.mul_(local_samples / total)
        if distributed:
            dist.all_reduce(p.grad, group=group)
    return total
