"""Ranks with different numbers of samples (mixed GPU types): weighted gradients vs naive averaging.

    torchrun --standalone --nproc-per-node 2 -m dtrain_lab.demos.multinode_hetero --counts 3,5

Rank ``r`` takes ``counts[r]`` consecutive samples of one global batch. Every rank computes, and
reports the largest difference from the gradient (and the SGD step) of one process on the whole
batch with the mean loss:

* ``ddp_scaled``: PyTorch DDP, each rank's *summed* loss times ``hetero.loss_scale`` (= W/N);
* ``ddp_scaled_accum``: the same with gradient accumulation in micro-batches from ``hetero.plan``
  (ranks take different numbers of micro-batches; ``no_sync`` on all but the last);
* ``manual_weighted``: no DDP, per-rank mean loss, then ``hetero.weighted_allreduce_grads``;
* ``naive``: DDP with each rank's *mean* loss: the mean of the per-rank means, compared both with
  the global mean (it differs) and with that mean of means computed in one process (it matches).
"""
import argparse

import torch
import torch.distributed as dist
import torch.nn.functional as F

from dtrain_lab.parallel import hetero
from dtrain_lab.i18n import tr
from dtrain_lab.jobs import runtime


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Tanh(), torch.nn.Linear(6, 1))


def _data(n: int):
    g = torch.Generator().manual_seed(7)
    x = torch.randn(n, 4, generator=g)
    y = torch.randn(n, 1, generator=g) * 3.0 + x[:, :1] * 2.0
    return x, y


def _grads(model) -> torch.Tensor:
    return torch.cat([p.grad.detach().reshape(-1) for p in model.parameters()])


def _params(model) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def _diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--counts", default="3,5")
    ap.add_argument("--lr", type=float, default=0.1)
    a = ap.parse_args()
    rt = runtime.current()
    counts = [int(c) for c in a.counts.split(",")]
    assert len(counts) == rt.world_size, (counts, rt.world_size)
    n_total = sum(counts)
    start = sum(counts[: rt.rank])
    x, y = _data(n_total)
    xl, yl = x[start:start + counts[rt.rank]], y[start:start + counts[rt.rank]]

    # the reference: one process, the whole batch, the mean loss
    ref = _model()
    F.mse_loss(ref(x), y).backward()
    g_ref = _grads(ref)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=a.lr)
    ref_opt.step()
    p_ref = _params(ref)
    # the mean of per-rank means, in one process
    mom = _model()
    loss = sum(F.mse_loss(mom(x[s:s + c]), y[s:s + c]) for s, c in
               zip([sum(counts[:i]) for i in range(len(counts))], counts)) / len(counts)
    loss.backward()
    g_mom = _grads(mom)

    out = {}
    n_global = hetero.global_count(counts[rt.rank])
    scale = hetero.loss_scale(counts[rt.rank], n_global, rt.world_size)

    # 1. DDP, summed loss scaled by W/N, one backward
    m = _model()
    ddp = torch.nn.parallel.DistributedDataParallel(m)
    (F.mse_loss(ddp(xl), yl, reduction="sum") * scale).backward()
    out["ddp_scaled"] = {"grad": _diff(_grads(m), g_ref)}
    opt = torch.optim.SGD(m.parameters(), lr=a.lr)
    opt.step()
    out["ddp_scaled"]["params"] = _diff(_params(m), p_ref)

    # 2. the same with accumulation: micro-batches from the plan (here at most 2 samples at once)
    p = hetero.plan(n_total, throughputs=counts, max_micro=[2] * rt.world_size)
    mine = p.ranks[rt.rank]
    assert mine.samples == counts[rt.rank], (mine, counts)
    m = _model()
    ddp = torch.nn.parallel.DistributedDataParallel(m)
    offset = 0
    for k, size in enumerate(mine.micro_sizes):
        xb, yb = xl[offset:offset + size], yl[offset:offset + size]
        offset += size
        # no_sync() must cover the forward too: DDP decides at forward time whether this
        # backward all-reduces (a forward outside it would all-reduce on this rank only)
        if k < mine.accum_steps - 1:
            with ddp.no_sync():
                (F.mse_loss(ddp(xb), yb, reduction="sum") * scale).backward()
        else:
            (F.mse_loss(ddp(xb), yb, reduction="sum") * scale).backward()
    out["ddp_scaled_accum"] = {"grad": _diff(_grads(m), g_ref), "accum_steps": mine.accum_steps,
                               "micro_sizes": mine.micro_sizes}

    # 3. no DDP: per-rank mean loss, then the weighted all-reduce
    m = _model()
    F.mse_loss(m(xl), yl).backward()
    hetero.weighted_allreduce_grads(m.parameters(), counts[rt.rank])
    out["manual_weighted"] = {"grad": _diff(_grads(m), g_ref)}

    # 4. naive: DDP averages the per-rank mean gradients
    m = _model()
    ddp = torch.nn.parallel.DistributedDataParallel(m)
    F.mse_loss(ddp(xl), yl).backward()
    out["naive"] = {"vs_global_mean": _diff(_grads(m), g_ref), "vs_mean_of_means": _diff(_grads(m), g_mom)}

    # the replicas agree with each other (max difference across ranks of the DDP-scaled gradient)
    g = _grads(m)
    spread = g.clone()
    dist.all_reduce(spread, op=dist.ReduceOp.MAX)
    out["grad_norm_ref"] = float(g_ref.norm())
    print(tr("demo_hetero_line", rank=rt.rank, samples=counts[rt.rank], scaled=out["ddp_scaled"]["grad"],
             accum=out["ddp_scaled_accum"]["grad"], manual=out["manual_weighted"]["grad"],
             naive=out["naive"]["vs_global_mean"]))
    runtime.report(rank=rt.rank, samples=counts[rt.rank], n_global=n_global, scale=scale,
                   naive_spread=_diff(spread, g), **out)


if __name__ == "__main__":
    runtime.entrypoint(main)
