import torch
import torch.distributed as dist
from dtrain_lab.grading.lab10 import MESSAGE_NUMEL


def run():
    rank = dist.get_rank()
    peer = 1 - rank
    mine = torch.full((MESSAGE_NUMEL,), float(rank))
    theirs = torch.empty(MESSAGE_NUMEL)
    # post both operations at once; neither blocks the other
    reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, mine, peer), dist.P2POp(dist.irecv, theirs, peer)])
    for req in reqs:
        req.wait()
    return theirs
