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
from dtrain_lab.comm.counted import Comm, CommTrace, wire_bytes
from dtrain_lab.perfmodel import ring_bytes_sent

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
    total = sum(range(1, rt.world_size + 1))
    expect = torch.arange(12, dtype=torch.float32, device=rt.device).reshape(3, 4).t() * total / rt.world_size
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


def check_counted(rt) -> dict:
    """dtrain_lab.comm.counted.Comm: results equal torch.distributed's, and what it counts equals what
    a CommTrace (CommDebugMode's dispatch mode) saw go through c10d; the ring all-reduce's sends."""
    out = {}
    p, r, dev = rt.world_size, rt.rank, rt.device
    x = torch.arange(6 * p, dtype=torch.float32, device=dev) * (r + 1)
    comm = Comm()
    with CommTrace() as trace:
        a = x.clone()
        comm.all_reduce(a)
        shard = torch.empty(6, device=dev)
        comm.reduce_scatter(shard, x.clone())
        full = torch.empty(6 * p, device=dev)
        comm.all_gather(full, shard)
        listed = comm.all_gather_list(shard)
        b = x.clone()
        comm.broadcast(b, src=p - 1)
        c = x.clone()
        comm.reduce(c, dst=0)
        work = comm.all_reduce(x.clone(), async_op=True)
        work.wait()
    ref = x.clone()
    dist.all_reduce(ref)
    out["all_reduce"] = torch.equal(a, ref)
    out["reduce_scatter"] = torch.equal(shard, ref[6 * r:6 * (r + 1)])
    out["all_gather"] = torch.equal(full, ref) and torch.equal(torch.cat(listed), ref)
    out["broadcast"] = torch.equal(b, torch.arange(6 * p, dtype=torch.float32, device=dev) * p)
    out["reduce"] = torch.equal(c, ref) if r == 0 else True
    seen = trace.summary()
    out["trace_counts"] = seen["counts"]
    out["trace_bytes"] = seen["by_op"]
    out["comm_calls"] = {op: n for op, n in comm.calls.items() if n}
    out["comm_payload"] = {op: n for op, n in comm.payload.items() if n or comm.calls[op]}
    out["comm_wire_all_reduce"] = comm.wire["all_reduce"]
    out["expected_wire_all_reduce"] = 2 * ring_bytes_sent(6 * p * 4, p)
    out["all_gather_wire"] = [comm.wire["all_gather"], 2 * wire_bytes("all_gather", 24, p), 2 * (p - 1) * 24]
    # the from-scratch ring: 2(p-1) sends of one chunk each, 2(p-1)/p of the tensor in all
    n = 12 * p
    with CommTrace() as ring_trace:
        ring_all_reduce(torch.ones(n, device=dev))
    s = ring_trace.summary()
    out["ring_sends"] = [s["counts"].get("send", 0), s["counts"].get("recv", 0), 2 * (p - 1)]
    out["ring_bytes"] = [s["by_op"].get("send", 0), ring_bytes_sent(n * 4, p)]
    # a subgroup: ranks {0, world-1}; a non-member counts nothing
    members = sorted({0, p - 1})
    sub = dist.new_group(members)
    if r in members:
        sc = Comm(sub)
        z = torch.full((4,), float(r + 1), device=dev)
        sc.broadcast(z, src=1 if len(members) > 1 else 0)
        out["sub_broadcast"] = float(z[0]) == float(members[-1] + 1)
        out["sub_size"] = sc.size
    return out


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
    runtime.report(ring=check_ring(rt), counted=check_counted(rt))
    runtime.report(last=True)


if __name__ == "__main__":
    runtime.entrypoint(main)
