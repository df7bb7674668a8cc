"""Hooks that only count; every bucket is reduced in finish(), after backward: no overlap."""
import torch
import torch.distributed as dist
from dtrain_lab.grading.lab02 import train_overlap


def attach_overlap(params, buckets, group=None):
    world = dist.get_world_size(group)
    ready = []
    for p in params:
        p.register_post_accumulate_grad_hook(lambda param: ready.append(param))

    def finish():
        works = []
        for bucket in buckets:
            flat = torch.cat([params[i].grad.reshape(-1) for i in bucket])
            works.append((dist.all_reduce(flat, group=group, async_op=True), flat, bucket))
        for work, flat, bucket in works:
            work.wait()
            flat /= world
            offset = 0
            for i in bucket:
                g = params[i].grad
                g.copy_(flat[offset:offset + g.numel()].view_as(g))
                offset += g.numel()
        ready.clear()

    return finish


def run():
    return train_overlap(attach_overlap)
