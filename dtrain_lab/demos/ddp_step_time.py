"""Step time of dtrain_lab's DDP against PyTorch's DistributedDataParallel, in the same run.

    torchrun --standalone --nproc-per-node 2 -m dtrain_lab.demos.ddp_step_time [repeats] [steps] [d_hidden] [depth] [batch]

Four variants train the same MLP on the same data: ``torch`` (DistributedDataParallel), ``ours``
(:class:`dtrain_lab.parallel.ddp.DDP`, overlap on), ``no_overlap`` (ours, buckets reduced after backward) and
``naive`` (one blocking all-reduce per parameter after backward). Timed blocks of ``steps`` steps
(forward, backward, SGD step) alternate between the variants ``repeats`` times, so that drifting load
hits all alike; a variant's time is the median over its blocks of the slowest rank's seconds per
step. Rank 0 reports them. CPU/gloo figures: they say nothing about NCCL on GPUs.

:func:`bench_ddp` launches this program and turns its report into a benchmark row.
"""
import sys

import torch
from torch.nn.parallel import DistributedDataParallel

from dtrain_lab import caps
from dtrain_lab.demos.alternate import mse_step, time_blocks
from dtrain_lab.jobs import runtime
from dtrain_lab.jobs.launch import launch
from dtrain_lab.parallel.ddp import DDP
from dtrain_lab.models import MLP, count_params


def main() -> None:
    rt = runtime.current()
    argv = [int(float(a)) for a in sys.argv[1:]]
    repeats, steps, d_hidden, depth, batch = (argv + [5, 20, 256, 4, 64][len(argv):])[:5]
    if not caps.have("cuda"):
        torch.set_num_threads(1)  # CPU ranks share the machine's cores: no oversubscription
    g = torch.Generator().manual_seed(1 + rt.rank)
    x = torch.randn(batch, 64, generator=g).to(rt.device)
    y = torch.randn(batch, 16, generator=g).to(rt.device)
    cuda = torch.device(rt.device).type == "cuda"

    def make(kind):
        model = MLP(64, d_hidden, 16, depth=depth, seed=0).to(rt.device)
        if kind == "torch":
            net = DistributedDataParallel(model, device_ids=[rt.device] if cuda else None)
        elif kind == "ours":
            net = DDP(model)
        elif kind == "no_overlap":
            net = DDP(model, overlap=False)
        else:
            net = model
        return net, torch.optim.SGD(model.parameters(), lr=1e-3)

    variants = {k: make(k) for k in ("torch", "ours", "no_overlap", "naive")}

    med, times = time_blocks(mse_step(variants, x, y), variants, repeats, steps, 3, rt.device)
    ours = variants["ours"][0]
    runtime.report(backend=rt.backend, world_size=rt.world_size, params=count_params(ours.module),
                   buckets=ours.stats()["num_buckets"], ours_s=med["ours"], torch_s=med["torch"],
                   no_overlap_s=med["no_overlap"], naive_s=med["naive"], samples=times)
    runtime.print0(" ".join(f"{k}={v * 1e3:.2f}ms" for k, v in med.items())
                   + f"  ours/torch={med['ours'] / med['torch']:.2f}")


def bench_ddp(repeats: int = 5, nproc: int = 2, steps: int = 20, d_hidden: int = 256, depth: int = 4,
              batch: int = 64, timeout: float = 300) -> dict:
    """Step time of :class:`DDP` against ``torch.nn.parallel.DistributedDataParallel`` on ``nproc``
    CPU ranks, measured in the same run (this program, launched). Returns a bench row::

        {"name": "ddp_step_time", "ratio": ours / torch, "ours_s": ..., "torch_s": ..., ...}

    ``ratio`` compares median step times (forward + backward + SGD step, ``steps`` steps per timed
    block, blocks of each variant alternated ``repeats`` times). Also reported: ``no_overlap_s`` and
    ``naive_s`` (one all-reduce per parameter) with their ratios to PyTorch.
    """
    r = launch("dtrain_lab.demos.ddp_step_time", nproc=nproc, timeout=timeout, quiet=True,
               args=[repeats, steps, d_hidden, depth, batch])
    if not r.ok:
        raise RuntimeError(r.summary())
    m = r.metrics[0]
    row = {"name": "ddp_step_time", "nproc": nproc, "backend": m["backend"], "repeats": repeats, "steps": steps,
           "params": m["params"], "buckets": m["buckets"], "ours_s": m["ours_s"], "torch_s": m["torch_s"],
           "no_overlap_s": m["no_overlap_s"], "naive_s": m["naive_s"]}
    row["ratio"] = row["ours_s"] / row["torch_s"]
    row["no_overlap_ratio"] = row["no_overlap_s"] / row["torch_s"]
    row["naive_ratio"] = row["naive_s"] / row["torch_s"]
    return row


if __name__ == "__main__":
    runtime.entrypoint(main)
