import torch
import torch.distributed as dist
from dtrain_lab.grading.lab10 import ACCUM, micro_batches


def run():
    batches = micro_batches(dist.get_rank())
    n = torch.tensor([len(batches)])
    dist.all_reduce(n, op=dist.ReduceOp.MIN)          # agree on how many micro-batches every rank uses
    steps = int(n.item()) // ACCUM                    # the same number of optimizer steps everywhere
    grads = []
    for s in range(steps):
        acc = torch.tensor([sum(batches[s * ACCUM:(s + 1) * ACCUM]) / ACCUM])
        dist.all_reduce(acc)
        grads.append(acc.item() / dist.get_world_size())
    return grads
