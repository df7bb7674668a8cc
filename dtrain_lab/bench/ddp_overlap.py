"""``ddp_overlap``: how much of the gradient all-reduce DDP hides behind backward, on a model with
several buckets.

    torchrun --standalone --nproc-per-node 2 -m dtrain_lab.bench.ddp_overlap [repeats] [steps]

An MLP of 3.2 M parameters in 13 layers (12 of them 512×512, 1 MiB of fp32 gradient each) with
``bucket_cap_mb=1``: 13 buckets, so the first buckets' all-reduce can run while backward still computes
the earlier layers. Five variants
train the same model on the same data, timed in blocks of ``steps`` steps that alternate (forward
order in even rounds, reversed in odd ones), after a warm-up:

* ``compute`` — the model alone, no communication: the floor;
* ``comm`` — only the all-reduces of the buckets' sizes, one after another: the communication alone;
* ``no_overlap`` — :class:`dtrain_lab.parallel.ddp.DDP` with ``overlap=False`` (every bucket reduced
  after backward): about ``compute + comm``;
* ``overlap`` — the same with ``overlap=True`` (a bucket's all-reduce starts from the gradient hooks);
* ``torch`` — PyTorch's ``DistributedDataParallel`` with the same ``bucket_cap_mb``.

``hidden`` = (no_overlap − overlap) / comm: the share of the communication that overlap took off the
step. It can only be large when there is a free core for gloo's thread to send while backward
computes: with 2 ranks on 2 busy cores the two contend, and the measured share says how much gloo
could hide on this machine, not on a GPU (NCCL runs on its own stream and copy engines).
"""
from __future__ import annotations

import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from dtrain_lab.jobs import runtime
from dtrain_lab.jobs.launch import launch
from dtrain_lab.models import MLP, count_params
from dtrain_lab.parallel.ddp import DDP

SHAPE = dict(d_in=512, d_hidden=512, d_out=16, depth=12)   # 3 160 080 parameters, 12 layers of 1 MiB
BUCKET_MB = 1.0
BATCH = 64
ORDER = ("compute", "comm", "no_overlap", "overlap", "torch")


def main() -> None:
    rt = runtime.current()
    argv = [int(a) for a in sys.argv[1:]]
    repeats, steps = (argv + [7, 5][len(argv):])[:2]
    torch.set_num_threads(1)                 # CPU ranks share the machine's cores
    g = torch.Generator().manual_seed(1 + rt.rank)
    x, y = torch.randn(BATCH, SHAPE["d_in"], generator=g), torch.randn(BATCH, SHAPE["d_out"], generator=g)

    def model():
        return MLP(**SHAPE, seed=0)

    nets = {"compute": model(), "no_overlap": DDP(model(), bucket_cap_mb=BUCKET_MB, overlap=False),
            "overlap": DDP(model(), bucket_cap_mb=BUCKET_MB, overlap=True),
            "torch": DistributedDataParallel(model(), bucket_cap_mb=BUCKET_MB)}
    opts = {k: torch.optim.SGD(n.parameters(), lr=1e-4) for k, n in nets.items()}
    buckets = [torch.zeros(n) for n in nets["overlap"].stats()["bucket_numels"]]

    def step(kind: str) -> None:
        if kind == "comm":
            for b in buckets:
                dist.all_reduce(b)
            return
        opts[kind].zero_grad(set_to_none=True)
        F.mse_loss(nets[kind](x), y).backward()
        opts[kind].step()

    def block(kind: str, k: int) -> float:
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(k):
            step(kind)
        t = torch.tensor([(time.perf_counter() - t0) / k], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t.item())

    for kind in ORDER:                       # warm-up: PyTorch's DDP rebuilds its buckets after step 1
        block(kind, 3)
    samples = {k: [] for k in ORDER}
    for r in range(repeats):
        for kind in (ORDER if r % 2 == 0 else ORDER[::-1]):
            samples[kind].append(block(kind, steps))
    stats = nets["overlap"].stats()
    runtime.report(backend=rt.backend, world_size=rt.world_size, params=count_params(nets["compute"]),
                   buckets=stats["num_buckets"], launched_in_backward=stats["launched_in_backward"],
                   bucket_mb=BUCKET_MB, samples=samples, repeats=repeats, steps=steps, last=True)


def ddp_overlap_row(nproc: int = 2, repeats: int = 7, steps: int = 5) -> dict:
    r = launch("dtrain_lab.bench.ddp_overlap", nproc=nproc, args=[repeats, steps], timeout=600, quiet=True)
    if not r.ok:
        raise RuntimeError(r.summary())
    return row_from_report(r.metrics[0], nproc)


def row_from_report(m: dict, nproc: int) -> dict:
    med = {k: statistics.median(v) for k, v in m["samples"].items()}
    low = {k: min(v) for k, v in m["samples"].items()}
    return {"name": "ddp_overlap", "nproc": nproc, "backend": m["backend"], "params": m["params"],
            "buckets": m["buckets"], "launched_in_backward": m["launched_in_backward"], "median_s": med,
            "min_s": low, "repeats": m["repeats"], "steps": m["steps"],
            "overlap_vs_no_overlap": med["overlap"] / med["no_overlap"], "torch_vs_overlap": med["torch"] / med["overlap"],
            "hidden": (med["no_overlap"] - med["overlap"]) / med["comm"],
            "no_overlap_vs_sum": med["no_overlap"] / (med["compute"] + med["comm"])}


if __name__ == "__main__":
    runtime.entrypoint(main)
