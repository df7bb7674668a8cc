"""Launches buckets from the hooks, but never resets its per-step state: from step 2 on, nothing
is launched and finish() writes back the first step's averages."""
import torch
import torch.distributed as dist
from dtrain_lab.grading.lab02 import train_overlap


def attach_overlap(params, buckets, group=None):
    world = dist.get_world_size(group)
    bucket_of = {i: b for b, bucket in enumerate(buckets) for i in bucket}
    missing = [len(b) for b in buckets]
    launched = []

    def make_hook(i):
        def hook(param):
            missing[bucket_of[i]] -= 1
            while len(launched) < len(buckets) and missing[len(launched)] == 0:
                flat = torch.cat([params[j].grad.reshape(-1) for j in buckets[len(launched)]])
                launched.append((dist.all_reduce(flat, group=group, async_op=True), flat))
        return hook

    for i, p in enumerate(params):
        p.register_post_accumulate_grad_hook(make_hook(i))

    def finish():
        for bucket, (work, flat) in zip(buckets, launched):
            work.wait()
            avg = flat / world
            offset = 0
            for i in bucket:
                g = params[i].grad
                g.copy_(avg[offset:offset + g.numel()].view_as(g))
                offset += g.numel()

    return finish


def run():
    return train_overlap(attach_overlap)
