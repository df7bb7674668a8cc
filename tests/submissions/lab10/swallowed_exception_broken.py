import torch
import torch.distributed as dist
from dtrain_lab.grading.lab10 import STEPS, load_batch


def run():
    rank = dist.get_rank()
    total = torch.zeros(1)
    for step in range(STEPS):
        try:
            value = load_batch(rank, step)
        except ValueError:
            continue                    # this rank skips the all_reduce below; the others don't
        t = torch.tensor([value])
        dist.all_reduce(t)
        total += t
    return total.item()
