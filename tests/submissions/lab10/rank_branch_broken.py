import torch
import torch.distributed as dist
from dtrain_lab.grading.lab10 import local_loss


def run():
    rank, world = dist.get_rank(), dist.get_world_size()
    loss = torch.tensor([local_loss(rank)])
    if rank == 0:                       # only rank 0 logs the mean loss...
        dist.all_reduce(loss)           # ...but the all-reduce needs every rank
        loss /= world
    dist.barrier()
    return loss.item()
