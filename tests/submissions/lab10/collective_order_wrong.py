import torch
import torch.distributed as dist
from dtrain_lab.grading.lab10 import local_stats


def run():
    stats = local_stats(dist.get_rank())
    names = list(stats)
    if dist.get_rank() % 2:
        names.reverse()
    out = {}
    for name in names:
        t = torch.tensor([stats[name]])
        dist.barrier()                  # "fix": a barrier before each call does not fix the order
        dist.all_reduce(t)
        out[name] = t.item()
    return out
