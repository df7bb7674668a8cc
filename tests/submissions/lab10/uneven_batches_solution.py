import torch
import torch.distributed as dist
from dtrain_lab.grading.lab10 import local_batches


def run():
    batches = local_batches(dist.get_rank())
    steps = torch.tensor([len(batches)])
    dist.all_reduce(steps, op=dist.ReduceOp.MAX)    # agree on the number of steps first
    total = torch.zeros(1)
    for i in range(int(steps.item())):
        # a rank without data contributes zero, but still takes part in the collective
        t = torch.tensor([batches[i] if i < len(batches) else 0.0])
        dist.all_reduce(t)
        total += t
    return total.item()
