"""Forgets that all-reduce sums: the gradients are world_size times too large."""
import torch
import torch.distributed as dist
from dtrain_lab.grading.lab02 import train


def sync_gradients(params, buckets, group=None):
    for bucket in buckets:
        grads = [params[i].grad for i in bucket]
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, group=group)
        offset = 0
        for g in grads:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()


def run():
    return train(sync_gradients)
