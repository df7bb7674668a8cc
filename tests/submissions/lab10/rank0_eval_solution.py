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
    metric = evaluate()                 # every rank evaluates its shard: the all_reduce matches up
    return metric.item()                # every rank already has the result; no broadcast needed
