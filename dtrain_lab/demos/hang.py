"""A deliberate deadlock: rank 0 runs an "evaluation" that contains a collective, the others don't.

Rank 0 waits in ``all_reduce`` for partners that never come; the other ranks wait in ``barrier``
for rank 0. Neither collective can finish: a hang, until the process-group timeout fires or the
launcher's time limit kills the job.

    torchrun --standalone --nproc-per-node 2 -m dtrain_lab.demos.hang
"""
import torch
import torch.distributed as dist

from dtrain_lab.i18n import tr
from dtrain_lab.jobs import runtime


def evaluate(model_state: torch.Tensor) -> float:
    # Averaging a metric across ranks is a collective: every rank must call it.
    metric = model_state.sum().reshape(1)
    dist.all_reduce(metric)
    return metric.item() / dist.get_world_size()


def main() -> None:
    rt = runtime.current()
    state = torch.ones(4)
    print(tr("demo_hang_step_done", rank=rt.rank))
    if rt.rank == 0:          # the bug: evaluation (with its collective) on rank 0 only
        print(tr("demo_hang_evaluating", rank=rt.rank))
        evaluate(state)
    dist.barrier()            # the other ranks are already here, waiting for rank 0
    print(tr("demo_hang_never"))


if __name__ == "__main__":
    runtime.entrypoint(main)
