import torch
import torch.distributed as dist
from dtrain_lab.grading.lab10 import ACCUM, micro_batches


def run():
    grads = []
    acc = torch.zeros(1)
    for i, g in enumerate(micro_batches(dist.get_rank())):
        acc += g / ACCUM
        if (i + 1) % ACCUM == 0:
            grads.append(acc.item())    # "fix": never synchronise: nothing hangs, ranks diverge
            acc.zero_()
    return grads
