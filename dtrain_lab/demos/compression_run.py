"""Loss against bytes for several gradient-compression methods, in one job (lesson 04, bench).

    torchrun --standalone --nproc-per-node 2 -m dtrain_lab.demos.compression_run [methods] [steps] [key=value ...]

``methods`` is a comma-separated list of :data:`dtrain_lab.parallel.compression.METHODS` (default
``none,fp16,topk,topk_noef,powersgd``); ``key=value`` pairs are passed to
:func:`dtrain_lab.parallel.compression.train_with_compression` (``ratio=0.01 rank=1 start_iter=10 lr=0.05
momentum=0 per_rank_batch=16 d_hidden=64 seed=0 ddp=ours``). Each method trains the same model from the same
seed on the same data; after each one every rank reports ``runs`` (a dict method → per-step ``loss``,
cumulative ``bytes`` …, see ``train_with_compression``), so ``LaunchResult.metrics[0]["runs"]``
holds every method run so far.
"""
import sys

import torch

from dtrain_lab.jobs import runtime
from dtrain_lab.parallel.compression import train_with_compression

DEFAULT_METHODS = "none,fp16,topk,topk_noef,powersgd"


def parse(argv: list[str]) -> tuple[list[str], int, dict]:
    methods = (argv[0] if argv else DEFAULT_METHODS).split(",")
    steps = int(argv[1]) if len(argv) > 1 else 200
    kwargs = {}
    for item in argv[2:]:
        key, _, value = item.partition("=")
        kwargs[key] = runtime.parse_value(value)
    return methods, steps, kwargs


def main() -> None:
    rt = runtime.current()
    if not torch.cuda.is_available():
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
