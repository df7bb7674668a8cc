"""One launch, many checks: runtime under torchrun, the report channel, ring all-reduce.

Tensors live on the rank's device: on a GPU machine the same checks exercise NCCL and CUDA.

Launched by tests/test_collectives.py at world sizes 2, 3 and 4. Every check's outcome goes back
through runtime.report; the test asserts on them, so a failing check names itself.
"""
import json
import os

import torch
import torch.distributed as dist

from dtrain_lab.jobs import runtime
from dtrain_lab.comm.collectives import naive_all_reduce, ring_all_reduce

SHAPES = [(1,), (2,), (3,), (5,), (7,), (1000,), (1001,), (4097,), (3, 5), (2, 3, 7)]


def check_ring(rt) -> dict:
    results = {}
    for dtype in (torch.float32, torch.float64):
        for shape in SHAPES:
            g = torch.Generator().manual_seed(100 + rt.rank)  # different data on each rank
            x = torch.randn(shape, generator=g, dtype=dtype).to(rt.device)
            ref = x.clone()
            dist.all_reduce(ref)
            mine = ring_all_reduce(x.clone())
            key = f"{dtype}-{shape}"
            results[key] = float((mine - ref).abs().max())
            # every rank must hold the same result
            gathered = [torch.empty_like(mine) for _ in range(rt.world_size)]
            dist.all_gather(gathered, mine)
            results[key + "-agree"] = all(torch.equal(gathered[0], t) for t in gathered)
    # a non-contiguous view is reduced in place too
    base = torch.arange(12, dtype=torch.float32, device=rt.device).reshape(3, 4) * (rt.rank + 1)
    view = base.t()
    ring_all_reduce(view, op="avg")
    expect = torch.arange(12, dtype=torch.float32, device=rt.device).reshape(3, 4).t() * sum(range(1, rt.world_size + 1)) / rt.world_size
    results["noncontiguous-avg"] = float((base.t() - expect).abs().max())
    y = torch.full((6,), float(rt.rank + 1), device=rt.device)
    naive_all_reduce(y)
    results["naive"] = float((y - sum(range(1, rt.world_size + 1))).abs().max())
    # a subgroup: ranks {0, world-1}
    members = sorted({0, rt.world_size - 1})
    sub = dist.new_group(members)
    if rt.rank in members:
        z = torch.full((5,), float(rt.rank + 1), device=rt.device)
        ring_all_reduce(z, group=sub)
        results["subgroup"] = float((z - sum(m + 1 for m in members)).abs().max())
    return results


def main() -> None:
    rt = runtime.current()
    # same seed on every rank -> same initial weights; data generators differ per rank
    w = torch.randn(8).to(rt.device)
    ws = [torch.empty_like(w) for _ in range(rt.world_size)]
    dist.all_gather(ws, w)
    d = torch.randn(4, generator=runtime.data_generator(0)).to(rt.device)
    ds = [torch.empty_like(d) for _ in range(rt.world_size)]
    dist.all_gather(ds, d)
    # a program printing something that looks like a report must not forge one
    print(json.dumps({"forged": True}))
    print('{"rank": 99}')
    runtime.rprint("prefixed")
    runtime.print0("only on rank 0")
    runtime.report(
        rank=rt.rank, world_size=rt.world_size, backend=rt.backend, device=str(rt.device),
        env_rank=os.environ["RANK"], local_rank=rt.local_rank, timeout_s=rt.timeout_s,
        same_init=all(torch.equal(ws[0], t) for t in ws),
        data_differs=len({tuple(t.tolist()) for t in ds}) == rt.world_size,
        tensor=torch.tensor([1.5, 2.5]), lang=os.environ.get("DTRAIN_LANG"),
    )
    runtime.report(ring=check_ring(rt))
    runtime.report(last=True)


if __name__ == "__main__":
    runtime.entrypoint(main)
