"""One rank raises in the middle of training; the others then fail in their next collective.

    torchrun --standalone --nproc-per-node 2 -m dtrain_lab.demos.crash
"""
import sys

import torch
import torch.distributed as dist

from dtrain_lab.jobs import runtime


def main() -> None:
    rt = runtime.current()
    bad_rank = int(sys.argv[1]) if len(sys.argv) > 1 else rt.world_size - 1
    x = torch.zeros(1)
    for step in range(5):
        if rt.rank == bad_rank and step == 2:
            raise ValueError(f"bad batch at step {step} on rank {rt.rank}")
        x += 1
        dist.all_reduce(x)
        runtime.report(step=step)
        dist.barrier()    # every rank has reported this step before the next one can fail


if __name__ == "__main__":
    runtime.entrypoint(main)
