import torch
import torch.distributed as dist
from dtrain_lab.grading.lab10 import VAL_SIZE, val_sample


def evaluate():
    """Each rank evaluates its share of the validation set and the results are averaged."""
    rank, world = dist.get_rank(), dist.get_world_size()
    total = torch.tensor([sum(val_sample(i) for i in range(rank, VAL_SIZE, world))])
    dist.all_reduce(total)
    return total / VAL_SIZE


def run():
    metric = torch.zeros(1)
    if dist.get_rank() == 0:
        metric = evaluate()             # evaluate() contains an all_reduce: only rank 0 calls it
    dist.broadcast(metric, src=0)
    return metric.item()
