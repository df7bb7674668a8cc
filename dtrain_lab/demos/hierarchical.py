"""Hierarchical all-reduce on one machine, its ranks split into "nodes": the circulating version that
deadlocks, and the fixed one checked against ``dist.all_reduce`` and timed against a flat ring.

    torchrun --standalone --nproc-per-node 4 -m dtrain_lab.demos.hierarchical           # check + time, 2 × 2
    torchrun --standalone --nproc-per-node 4 -m dtrain_lab.demos.hierarchical copied    # the deadlock

On one machine every "node" shares the same memory and the same loopback interface: there is no slow
link between nodes, so the timings say what the extra steps cost, not what a real cluster would gain.
"""
from __future__ import annotations

import statistics
import sys
import time

import torch
import torch.distributed as dist

from dtrain_lab import caps
from dtrain_lab.comm.collectives import ring_all_reduce
from dtrain_lab.comm.counted import count_collectives
from dtrain_lab.comm.hierarchical import hierarchical_all_reduce, hierarchical_groups, node_layout
from dtrain_lab.i18n import tr
from dtrain_lab.jobs import runtime

SIZES = (16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20)   # bytes per rank
VARIANTS = ("ring", "gloo", "hierarchical")


def copied_hierarchical_all_reduce(tensor: torch.Tensor, node_group, leader: int) -> torch.Tensor:
    """The version that circulates. Steps 1 and 3 use the node's group; step 2 does not."""
    dist.reduce(tensor, dst=leader, group=node_group)
    if dist.get_rank() == leader:
        dist.all_reduce(tensor)        # the bug: the default group waits for EVERY rank of the world
    dist.broadcast(tensor, src=leader, group=node_group)
    return tensor


def copied(ranks_per_node: int) -> None:
    rt = runtime.current()
    hg = hierarchical_groups(node_layout(rt.world_size, ranks_per_node))
    x = torch.full((4,), float(rt.rank + 1))
    step2 = "hier_step_world_all_reduce" if hg.is_leader else "hier_step_broadcast"
    print(tr("hier_rank_goes", rank=rt.rank, leader=hg.leader, step=tr(step2)), flush=True)
    copied_hierarchical_all_reduce(x, hg.node, hg.leader)
    print(tr("hier_never_printed"), flush=True)


def _time_block(fn, buf: torch.Tensor, iters: int) -> float:
    """Seconds per call of the slowest rank over ``iters`` calls (every rank calls it)."""
    dist.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        fn(buf)
    t = torch.tensor([(time.perf_counter() - start) / iters])
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def time_variants(hg, sizes=SIZES, blocks: int = 5, warmup: int = 3) -> list[dict]:
    """Time our flat ring, gloo's all-reduce and the hierarchical all-reduce on the same buffers.

    The variants alternate in blocks (their order rotates every block), so that a change of load on
    the machine falls on all of them alike; each row keeps the minimum and the median over blocks.
    The buffers hold zeros, so that repeated sums never grow (a buffer of ones would be multiplied
    by the world size at every call and end as inf)."""
    ops = {"ring": ring_all_reduce, "gloo": dist.all_reduce,
           "hierarchical": lambda t: hierarchical_all_reduce(t, hg)}
    rows = []
    for nbytes in sizes:
        buf = torch.zeros(nbytes // 4)
        iters = max(3, (256 << 10) // nbytes)          # more calls for small messages, fixed in advance
        for name in VARIANTS:
            for _ in range(warmup):
                ops[name](buf)
        seen = {name: [] for name in VARIANTS}
        for block in range(blocks):
            order = VARIANTS[block % 3:] + VARIANTS[:block % 3]
            for name in order:
                seen[name].append(_time_block(ops[name], buf, iters))
        for name in VARIANTS:
            rows.append({"variant": name, "bytes": nbytes, "iters": iters,
                         "min": min(seen[name]), "median": statistics.median(seen[name])})
    return rows


def measure(ranks_per_node: int) -> None:
    rt = runtime.current()
    layout = node_layout(rt.world_size, ranks_per_node)
    hg = hierarchical_groups(layout)
    # 1. the same sums as dist.all_reduce: random float64 data of an awkward length, and small integers
    g = torch.Generator().manual_seed(100 + rt.rank)
    x = torch.randn(1001, dtype=torch.float64, generator=g)
    ref = x.clone()
    dist.all_reduce(ref)
    diff = (hierarchical_all_reduce(x.clone(), hg) - ref).abs().max().item()
    ints = torch.arange(7, dtype=torch.float32) * (rt.rank + 1)
    int_ref = ints.clone()
    dist.all_reduce(int_ref)
    exact = bool(torch.equal(hierarchical_all_reduce(ints.clone(), hg), int_ref))
    # 2. which collectives this rank issued (a witness of c10d's own dispatch, nothing patched)
    _, counts = count_collectives(hierarchical_all_reduce, torch.zeros(8), hg)
    # 3. timings
    torch.set_num_threads(1)    # one thread per rank: the ranks already share the cores
    rows = time_variants(hg)
    runtime.report(layout=layout, is_leader=hg.is_leader, max_abs_diff=diff, exact_on_integers=exact,
                   counts=counts, cores=caps.cores(), world_size=rt.world_size,
                   rows=rows if rt.rank == 0 else None)


def main() -> None:
    args = sys.argv[1:]
    mode = "copied" if "copied" in args else "measure"
    per_node = next((runtime.parse_value(a.split("=", 1)[1]) for a in args if a.startswith("ranks_per_node=")), 2)
    runtime.current()
    (copied if mode == "copied" else measure)(per_node)


if __name__ == "__main__":
    runtime.entrypoint(main)
