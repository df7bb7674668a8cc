import torch
import torch.distributed as dist
from dtrain_lab.grading.lab10 import local_batches


def run():
    batches = local_batches(dist.get_rank())
    steps = torch.tensor([len(batches)])
    dist.all_reduce(steps, op=dist.ReduceOp.MIN)    # "fix": stop when the shortest rank stops: drops data
    total = torch.zeros(1)
    for i in range(int(steps.item())):
        t = torch.tensor([batches[i]])
        dist.all_reduce(t)
        total += t
    return total.item()
