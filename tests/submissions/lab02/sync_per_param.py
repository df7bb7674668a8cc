"""Right numbers, wrong communication: one all-reduce per parameter, ignoring the buckets."""
import torch.distributed as dist
from dtrain_lab.grading.lab02 import train


def sync_gradients(params, buckets, group=None):
    world = dist.get_world_size(group)
    for bucket in buckets:
        for i in bucket:
            dist.all_reduce(params[i].grad, group=group)
            params[i].grad /= world


def run():
    return train(sync_gradients)
