"""Loss against bytes for several gradient-compression methods, in one job (lesson 04, bench).

    torchrun --standalone --nproc-per-node 2 -m dtrain_lab.demos.compression_run [methods] [steps] [key=value ...]

``methods`` is a comma-separated list of :data:`dtrain_lab.parallel.compression.METHODS` (default
``none,fp16,topk,topk_noef,powersgd``); ``key=value`` pairs are passed to
:func:`train_with_compression` (``ratio=0.01 rank=1 start_iter=10 lr=0.05
momentum=0 per_rank_batch=16 d_hidden=64 seed=0 ddp=ours``). Each method trains the same model from the same
seed on the same data; after each one every rank reports ``runs`` (a dict method → per-step ``loss``,
cumulative ``bytes`` …, see ``train_with_compression``), so ``LaunchResult.metrics[0]["runs"]``
holds every method run so far.
"""
import sys
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from dtrain_lab import caps
from dtrain_lab.data import global_batch, regression_dataset, shard
from dtrain_lab.i18n import LabError
from dtrain_lab.jobs import runtime
from dtrain_lab.models import MLP, count_params
from dtrain_lab.parallel.compression import METHODS, make_hook
from dtrain_lab.parallel.ddp import DDP

DEFAULT_METHODS = "none,fp16,topk,topk_noef,powersgd"


def parse(argv: list[str]) -> tuple[list[str], int, dict]:
    methods = (argv[0] if argv else DEFAULT_METHODS).split(",")
    steps = int(argv[1]) if len(argv) > 1 else 200
    kwargs = {}
    for item in argv[2:]:
        key, _, value = item.partition("=")
        kwargs[key] = runtime.parse_value(value)
    return methods, steps, kwargs


def train_with_compression(method: str, steps: int = 200, *, ratio: float = 0.01, rank: int = 1,
                           start_iter: int = 10, lr: float = 0.05, momentum: float = 0.0,
                           per_rank_batch: int = 16, d_hidden: int = 64, n_samples: int = 512, seed: int = 0,
                           ddp: str = "ours") -> dict:
    """Train ``MLP(16, d_hidden, 4)`` on the synthetic regression task with one compression method,
    inside a launched job (call it on every rank).

    Every step: each rank takes its shard (``per_rank_batch`` samples) of the global batch, backward runs the
    hook through ``ddp`` ("ours": :class:`dtrain_lab.parallel.ddp.DDP`, "torch": PyTorch's
    ``DistributedDataParallel``), then SGD. After each step the loss on the whole data set is
    evaluated locally (every replica holds the same parameters, so no communication is needed).

    Returns ``{"method", "loss": [per step], "bytes": [cumulative payload], "baseline_bytes": [...],
    "wire_bytes": [...], "baseline_wire_bytes": [...], "ratio", "params", "world_size"}`` — the
    loss after step ``i`` against the bytes sent up to step ``i``.
    """
    if method not in METHODS:
        raise LabError("compression_bad_method", value=method, choices=", ".join(METHODS))
    if ddp not in ("ours", "torch"):
        raise LabError("compression_bad_method", value=ddp, choices="ours, torch")
    world, me = dist.get_world_size(), dist.get_rank()
    model = MLP(16, d_hidden, 4, depth=2, seed=seed)
    state, hook = make_hook(method, ratio=ratio, rank=rank, start_iter=start_iter, seed=seed)
    net = DDP(model) if ddp == "ours" else DistributedDataParallel(model)
    net.register_comm_hook(state, hook)
    data = regression_dataset(n_samples, 16, 4, seed=seed + 1)
    x_all, y_all = data.tensors
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    out: dict[str, Any] = {"method": method, "loss": [], "bytes": [], "baseline_bytes": [], "wire_bytes": [],
                           "baseline_wire_bytes": [], "params": count_params(model), "world_size": world}
    for step in range(steps):
        x, y = shard(global_batch(data, step, per_rank_batch * world), me, world)
        opt.zero_grad(set_to_none=True)
        F.mse_loss(net(x), y).backward()
        opt.step()
        with torch.no_grad():
            out["loss"].append(float(F.mse_loss(model(x_all), y_all)))
        out["bytes"].append(state.bytes_sent)
        out["baseline_bytes"].append(state.baseline_bytes)
        out["wire_bytes"].append(state.wire_bytes_sent())
        out["baseline_wire_bytes"].append(state.baseline_wire_bytes())
    out["ratio"] = state.ratio()
    if ddp == "ours":
        net.remove_hooks()
    return out


def main() -> None:
    rt = runtime.current()
    if not caps.have("cuda"):
        torch.set_num_threads(1)  # CPU ranks share the machine's cores
    methods, steps, kwargs = parse(sys.argv[1:])
    runs = {}
    for method in methods:
        runs[method] = train_with_compression(method, steps, **kwargs)
        runtime.report(runs=runs)
        runtime.print0(f"{method:>14}: final loss {runs[method]['loss'][-1]:.4f}, "
                       f"bytes ratio {runs[method]['ratio']:.4f}")
    runtime.report(rank=rt.rank, world_size=rt.world_size, backend=rt.backend, steps=steps, kwargs=kwargs)


if __name__ == "__main__":
    runtime.entrypoint(main)
