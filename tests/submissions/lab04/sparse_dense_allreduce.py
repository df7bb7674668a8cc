"""Right numbers, no compression: scatter into a dense tensor and all-reduce all of it."""
import torch
import torch.distributed as dist
from dtrain_lab.grading.lab04 import sparse_cases


def sparse_allreduce(values, indices, numel, group=None):
    dense = torch.zeros(numel, dtype=values.dtype, device=values.device)
    dense[indices] = values
    dist.all_reduce(dense, group=group)
    return dense / dist.get_world_size(group)


def run():
    return sparse_cases(sparse_allreduce)
