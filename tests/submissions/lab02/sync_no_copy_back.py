"""Reduces a flat copy of each bucket and never writes it back: p.grad keeps the local gradient."""
import torch
import torch.distributed as dist
from dtrain_lab.grading.lab02 import train


def sync_gradients(params, buckets, group=None):
    world = dist.get_world_size(group)
    for bucket in buckets:
        flat = torch.cat([params[i].grad.reshape(-1) for i in bucket])
        dist.all_reduce(flat, group=group)
        flat /= world


def run():
    return train(sync_gradients)
