import torch
import torch.distributed as dist
from dtrain_lab.grading.lab10 import local_batches


def run():
    total = torch.zeros(1)
    for value in local_batches(dist.get_rank()):   # ranks have different numbers of batches
        t = torch.tensor([value])
        dist.all_reduce(t)                          # the rank that runs out first stops calling it
        total += t
    return total.item()
