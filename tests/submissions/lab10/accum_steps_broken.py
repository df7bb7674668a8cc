import torch
import torch.distributed as dist
from dtrain_lab.grading.lab10 import ACCUM, micro_batches


def run():
    grads = []
    acc = torch.zeros(1)
    for i, g in enumerate(micro_batches(dist.get_rank())):   # ranks have different numbers of micro-batches
        acc += g / ACCUM
        if (i + 1) % ACCUM == 0:        # rank 1 reaches more sync points than rank 0
            dist.all_reduce(acc)
            grads.append(acc.item() / dist.get_world_size())
            acc.zero_()
    return grads
