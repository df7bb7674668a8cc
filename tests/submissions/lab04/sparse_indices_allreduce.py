"""The tempting wrong exchange: all-reduce the values and the indices as if they were dense."""
import torch
import torch.distributed as dist
from dtrain_lab.grading.lab04 import sparse_cases


def sparse_allreduce(values, indices, numel, group=None):
    world = dist.get_world_size(group)
    values, indices = values.clone(), indices.clone()
    dist.all_reduce(values, group=group)
    dist.all_reduce(indices, group=group)       # a sum of positions is not a position
    dense = torch.zeros(numel, dtype=values.dtype, device=values.device)
    dense.index_add_(0, indices % numel, values)
    return dense / world


def run():
    return sparse_cases(sparse_allreduce)
