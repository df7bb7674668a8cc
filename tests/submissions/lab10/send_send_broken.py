import torch
import torch.distributed as dist
from dtrain_lab.grading.lab10 import MESSAGE_NUMEL


def run():
    rank = dist.get_rank()
    peer = 1 - rank
    mine = torch.full((MESSAGE_NUMEL,), float(rank))
    theirs = torch.empty(MESSAGE_NUMEL)
    dist.send(mine, peer)               # both ranks send first: each waits for the other to receive
    dist.recv(theirs, peer)
    return theirs
