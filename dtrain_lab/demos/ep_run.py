"""Lesson 13: expert parallelism (ours) against the same MoE layer on one process.

    torchrun --standalone --nproc-per-node 2 -m dtrain_lab.demos.ep_run
    torchrun --standalone --nproc-per-node 4 -m dtrain_lab.demos.ep_run
    torchrun --standalone --nproc-per-node 2 -m dtrain_lab.demos.ep_run --top-k 1

Every rank draws its own ``T = 24`` tokens (seed = rank) and holds ``12 / world_size`` of the 12 experts of
:class:`dtrain_lab.parallel.expert.MoE` (``d = 8``, hidden 16, top-2 or ``--top-k K``, capacity factor
1.0, so some assignments are dropped). One training step: loss = ``Σ y ∘ w + 0.01 · L_aux``. The reference is the
same layer with all 12 experts on one process, run on every rank's tokens separately (routing and
capacity are per batch, as in the EP run), losses summed. Each rank reports the largest difference of
its output, of its tokens' gradient and of its experts' gradients (and of the router's, summed over
ranks) from the reference,
the dropped assignments and uneven splits, the All-to-All calls counted by ``CommDebugMode``, the
calls and bytes the backend saw (profiler, :mod:`dtrain_lab.demos.commcount`), and what
:func:`dtrain_lab.parallel.expert.moe_comm_bytes` predicts. Afterwards :func:`uneven_all_to_all` runs
``all_to_all_single`` bare, with uneven splits (outside the counted step), and each rank reports the
rows it received.
"""
import argparse

import torch
import torch.distributed as dist

from dtrain_lab.demos.commcount import counted
from dtrain_lab.jobs import runtime
from dtrain_lab.parallel.expert import MoE, moe_comm_bytes

E, D, HIDDEN, T, TOP_K, CF, ALPHA = 12, 8, 16, 24, 2, 1.0, 0.01


def uneven_all_to_all() -> list[float]:
    """``all_to_all_single`` with uneven splits, bare: rank r sends r + j + 1 rows to rank j, each row
    tagged 10·r + j; the counts go first, so every rank knows how many rows will arrive."""
    rank, p = dist.get_rank(), dist.get_world_size()
    send = [rank + j + 1 for j in range(p)]                                    # rows for rank j
    recv = torch.empty(p, dtype=torch.long)
    dist.all_to_all_single(recv, torch.tensor(send))                           # how many rows arrive from each rank
    x = torch.cat([torch.full((n, 1), 10.0 * rank + j) for j, n in enumerate(send)])
    y = x.new_empty(int(recv.sum()), 1)
    dist.all_to_all_single(y, x, output_split_sizes=recv.tolist(), input_split_sizes=send)
    return y.reshape(-1).tolist()


def tokens(rank: int) -> torch.Tensor:
    return torch.randn(T, D, generator=torch.Generator().manual_seed(100 + rank), dtype=torch.float64)


def weights() -> torch.Tensor:
    return torch.randn(T, D, generator=torch.Generator().manual_seed(7), dtype=torch.float64)


def main() -> None:
    from torch.distributed.tensor.debug import CommDebugMode

    ap = argparse.ArgumentParser()
    ap.add_argument("--top-k", type=int, default=TOP_K, help="experts per token (lesson 13, exercise 4)")
    top_k = ap.parse_args().top_k
    torch.set_num_threads(1)
    rt = runtime.current()
    p, r = rt.world_size, rt.rank
    torch.set_default_dtype(torch.float64)
    moe = MoE(D, HIDDEN, E, top_k, CF, seed=0)                 # group=None: the world is the EP group
    with counted() as comm, CommDebugMode() as cdm:
        x = tokens(r).requires_grad_()          # as inside a model: its gradient flows back too
        y, aux = moe(x)
        ((y * weights()).sum() + ALPHA * aux).backward()
    stats = moe.last_stats
    router_grad = moe.router.weight.grad.clone()
    dist.all_reduce(router_grad)                               # the router is replicated: sum over ranks
    # reference: all experts on one process (a group of one rank), each rank's batch routed on its own
    solo = [dist.new_group([i]) for i in range(p)][r]         # every rank creates every group
    ref = MoE(D, HIDDEN, E, top_k, CF, group=solo, seed=0)
    xs = [tokens(src).requires_grad_() for src in range(p)]
    ys = [ref(xx) for xx in xs]
    sum((yy * weights()).sum() + ALPHA * a for yy, a in ys).backward()
    mine = slice(moe.first, moe.first + moe.local)
    counts = {str(k).split(".")[-1]: v for k, v in cdm.get_comm_counts().items()}
    uneven = uneven_all_to_all()                               # after the counted step: its bytes are apart
    runtime.report(
        uneven=uneven, out=(y - ys[r][0]).abs().max().item(), aux=abs(aux.item() - ys[r][1].item()),
        x=(x.grad - xs[r].grad).abs().max().item(),
        w1=(moe.w1.grad - ref.w1.grad[mine]).abs().max().item(), w2=(moe.w2.grad - ref.w2.grad[mine]).abs().max().item(),
        w3=(moe.w3.grad - ref.w3.grad[mine]).abs().max().item(),
        router=(router_grad - ref.router.weight.grad).abs().max().item(),
        grad_scale=ref.w1.grad.abs().max().item(), top_k=top_k, **stats, comm=comm, debug_counts=counts,
        formula=moe_comm_bytes(stats["kept"], D, p, E, bytes_per_elem=8, received=sum(stats["received"]),
                               local=stats["sent"][r]))


if __name__ == "__main__":
    runtime.entrypoint(main)
