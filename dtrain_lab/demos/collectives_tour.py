"""Every basic collective once, with each rank's tensor before and after; then the ring all-reduce
from send/recv checked against dist.all_reduce.

    torchrun --standalone --nproc-per-node 3 -m dtrain_lab.demos.collectives_tour

Each rank prints only its own lines, in a fixed order, so the output grouped by rank is the same at
every run; the launcher gathers what each rank reports.
"""
import torch
import torch.distributed as dist

from dtrain_lab.jobs import runtime
from dtrain_lab.comm.collectives import ring_all_reduce


def fmt(t: torch.Tensor) -> str:
    return "[" + ", ".join(f"{v:g}" for v in t.flatten().tolist()) + "]"


def main() -> None:
    rt = runtime.current()
    r, p = rt.rank, rt.world_size
    seen = {}

    # broadcast: rank 0's tensor is copied to everyone
    x = torch.tensor([10.0 * (r + 1)])
    before = fmt(x)
    dist.broadcast(x, src=0)
    print(f"broadcast(src=0)      before {before:>14}  after {fmt(x)}")
    seen["broadcast"] = x.tolist()

    # all_reduce: every rank ends with the sum of all ranks' tensors
    x = torch.tensor([float(r + 1), 1.0])
    before = fmt(x)
    dist.all_reduce(x, op=dist.ReduceOp.SUM)
    print(f"all_reduce(SUM)       before {before:>14}  after {fmt(x)}")
    seen["all_reduce"] = x.tolist()

    # all_gather: every rank ends with every rank's tensor, in rank order
    x = torch.tensor([float(r)])
    out = torch.empty(p)
    dist.all_gather_single(out, x)   # formerly all_gather_into_tensor (deprecated in torch 2.13)
    print(f"all_gather            before {fmt(x):>14}  after {fmt(out)}")
    seen["all_gather"] = out.tolist()

    # reduce_scatter: sum element-wise, then rank i keeps the i-th piece
    x = torch.arange(p, dtype=torch.float32) + 10 * r
    out = torch.empty(1)
    dist.reduce_scatter_single(out, x)   # formerly reduce_scatter_tensor
    print(f"reduce_scatter(SUM)   before {fmt(x):>14}  after {fmt(out)}")
    seen["reduce_scatter"] = out.tolist()

    # send/recv: point to point, around a ring; even ranks send first, odd ranks receive first
    # (with blocking calls, everyone sending first could deadlock: lesson 10)
    right, left = (r + 1) % p, (r - 1) % p
    msg = torch.tensor([100.0 + r])
    got = torch.empty(1)
    if r % 2 == 0:
        dist.send(msg, right)
        dist.recv(got, left)
    else:
        dist.recv(got, left)
        dist.send(msg, right)
    print(f"send→{right} / recv←{left}     sent {fmt(msg):>14}  got   {fmt(got)}")
    seen["recv"] = got.tolist()

    # our ring all-reduce against PyTorch's, on random data of an awkward length
    g = torch.Generator().manual_seed(1234 + r)
    data = torch.randn(1001, generator=g)
    ref = data.clone()
    dist.all_reduce(ref)
    sends: list = []   # every send this rank posted in the ring, in order (lesson 01 draws them)
    mine = ring_all_reduce(data.clone(), trace=sends)
    diff = (mine - ref).abs().max().item()
    print(f"ring_all_reduce == dist.all_reduce on 1001 floats: {diff < 1e-5}")
    runtime.report(seen=seen, ring_max_abs_diff=diff, ring_bitwise_equal=bool(torch.equal(mine, ref)),
                   ring_sends=sends)


if __name__ == "__main__":
    runtime.entrypoint(main)
