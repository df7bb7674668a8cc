"""Lesson 02 §3: step time of naive data parallelism, our DDP and PyTorch's DDP, and of both DDPs
against the bucket size, measured in the same job.

    torchrun --standalone --nproc-per-node 2 -m dtrain_lab.demos.dp_bucket_sweep [repeats] [steps] [caps_mb ...]

The model is deep and narrow on purpose, ``MLP(32, 64, 32, depth=12)``: 26 parameter tensors of at
most 16 KiB, 0.19 MiB of gradients. Per step, naive data parallelism issues 26 all-reduces; a 25 MiB
bucket, one. Variants:

* ``naive`` — one blocking all-reduce per parameter after backward;
* ``ours@CAP`` / ``ours_no_overlap@CAP`` — :class:`dtrain_lab.parallel.ddp.DDP` with ``bucket_cap_mb=CAP``,
  with and without overlap;
* ``torch@CAP`` — ``DistributedDataParallel(bucket_cap_mb=CAP)``.

25 MiB, in the default list of caps, is both DDPs' default bucket size.

Timed blocks of ``steps`` steps (forward, backward, SGD step) alternate between the variants
``repeats`` times, so that a change of load on the machine hits all of them alike. A block's time is
the slowest rank's seconds per step; a variant's time is the median of its blocks. Rank 0 reports
them. These are CPU/gloo numbers: they say nothing about NCCL on GPUs.
"""
import sys

import torch
from torch.nn.parallel import DistributedDataParallel

from dtrain_lab.demos.alternate import mse_step, time_blocks
from dtrain_lab.jobs import runtime
from dtrain_lab.parallel.ddp import DDP
from dtrain_lab.models import MLP

DEFAULT_CAPS = (0.005, 0.02, 0.1, 25.0)


def main() -> None:
    rt = runtime.current()
    argv = sys.argv[1:]
    repeats = int(argv[0]) if argv else 5
    steps = int(argv[1]) if len(argv) > 1 else 4
    caps = [float(c) for c in argv[2:]] or list(DEFAULT_CAPS)
    cuda = torch.device(rt.device).type == "cuda"
    if not cuda:
        torch.set_num_threads(1)  # two CPU ranks share the machine's cores: no oversubscription
    g = torch.Generator().manual_seed(1 + rt.rank)
    x = torch.randn(32, 32, generator=g).to(rt.device)
    y = torch.randn(32, 32, generator=g).to(rt.device)

    def make(kind: str, cap: float | None):
        model = MLP(32, 64, 32, depth=12, seed=0).to(rt.device)
        ids = [rt.device] if cuda else None
        if kind == "torch":
            net = DistributedDataParallel(model, device_ids=ids, bucket_cap_mb=cap)
        elif kind in ("ours", "ours_no_overlap"):
            net = DDP(model, bucket_cap_mb=cap, overlap=kind == "ours")
        else:
            net = model
        return net, torch.optim.SGD(model.parameters(), lr=1e-3)

    variants = {"naive": make("naive", None)}
    for cap in caps:
        for kind in ("ours", "ours_no_overlap", "torch"):
            variants[f"{kind}@{cap:g}"] = make(kind, cap)

    seconds, _ = time_blocks(mse_step(variants, x, y), variants, repeats, steps, 2, rt.device)
    buckets = {name: net.stats()["num_buckets"] for name, (net, _) in variants.items() if isinstance(net, DDP)}
    runtime.report(backend=rt.backend, caps=caps, seconds=seconds, buckets=buckets, repeats=repeats, steps=steps,
                   params=len(list(variants["naive"][0].parameters())))


def plot_bucket_sweep(metrics: dict, ax=None):
    """Step time against ``bucket_cap_mb`` from this program's report (rank 0's metrics): our DDP with
    and without overlap, PyTorch's DDP, and the naive version as a horizontal line."""
    from dtrain_lab.viz import label, new_figure

    if ax is None:
        _, ax = new_figure(figsize=(7, 4))
    caps, seconds, buckets = metrics["caps"], metrics["seconds"], metrics["buckets"]
    lines = (("ours", label("viz_bucket_ours")),
             ("ours_no_overlap", label("viz_bucket_ours_no_overlap")),
             ("torch", label("viz_bucket_torch")))
    for kind, name in lines:
        ax.plot(caps, [seconds[f"{kind}@{c:g}"] * 1e3 for c in caps], marker="o", label=name)
    for c in caps:
        ax.annotate(label("viz_buckets", n=buckets[f"ours@{c:g}"]),
                    (c, seconds[f"ours@{c:g}"] * 1e3), textcoords="offset points", xytext=(4, 6), fontsize=8)
    n = metrics["params"]
    ax.axhline(seconds["naive"] * 1e3, color="grey", linestyle="--",
               label=label("viz_bucket_naive", n=n))
    ax.set_xscale("log")
    ax.set_ylim(0, 1.3 * max(seconds.values()) * 1e3)   # room for the legend above the lines
    ax.set_xlabel(label("viz_bucket_cap"))
    ax.set_ylabel(label("viz_time_per_step"))
    ax.set_title(label("viz_bucket_title", backend=metrics["backend"]))
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    return ax


if __name__ == "__main__":
    runtime.entrypoint(main)
