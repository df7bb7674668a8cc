import torch
import torch.distributed as dist
from dtrain_lab.grading.lab10 import local_stats


def run():
    stats = local_stats(dist.get_rank())
    out = {}
    for name in sorted(stats):          # one order, the same on every rank
        t = torch.tensor([stats[name]])
        dist.all_reduce(t)
        out[name] = t.item()
    return out
