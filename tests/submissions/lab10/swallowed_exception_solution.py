import torch
import torch.distributed as dist
from dtrain_lab.grading.lab10 import STEPS, load_batch


def run():
    rank = dist.get_rank()
    total = torch.zeros(1)
    for step in range(STEPS):
        try:
            value, ok = load_batch(rank, step), 1.0
        except ValueError:
            value, ok = 0.0, 0.0
        flag = torch.tensor([ok])
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)  # every rank learns whether any batch failed
        if flag.item() == 0.0:
            continue                                 # now every rank skips the step together
        t = torch.tensor([value])
        dist.all_reduce(t)
        total += t
    return total.item()
