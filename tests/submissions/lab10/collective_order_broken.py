import torch
import torch.distributed as dist
from dtrain_lab.grading.lab10 import local_stats


def run():
    stats = local_stats(dist.get_rank())
    names = list(stats)
    if dist.get_rank() % 2:             # e.g. a set or a dict built in a rank-dependent order
        names.reverse()
    out = {}
    for name in names:
        t = torch.tensor([stats[name]])
        dist.all_reduce(t)              # rank 0 reduces "loss" while rank 1 reduces "correct"
        out[name] = t.item()
    return out
