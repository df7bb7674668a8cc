"""What torchrun gives each process, and a first collective.

    torchrun --standalone --nproc-per-node 2 -m dtrain_lab.demos.hello
"""
import os

import torch
import torch.distributed as dist

from dtrain_lab.i18n import tr
from dtrain_lab.jobs import runtime

ENV_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def main() -> None:
    rt = runtime.current()
    env = {k: os.environ.get(k) for k in ENV_VARS}
    print(tr("demo_hello_rank", rank=rt.rank, world=rt.world_size, local_rank=rt.local_rank, pid=os.getpid(),
             backend=rt.backend, device=rt.device))
    # A first collective: every rank contributes rank+1; all_reduce sums them on every rank.
    x = torch.tensor([float(rt.rank + 1)], device=rt.device)
    dist.all_reduce(x, op=dist.ReduceOp.SUM)
    print(tr("demo_hello_sum", value=x.item()))
    runtime.report(env=env, backend=rt.backend, device=str(rt.device), pid=os.getpid(),
                   all_reduce_sum=x.item(), timeout_s=rt.timeout_s)


if __name__ == "__main__":
    runtime.entrypoint(main)
