import torch
import torch.distributed as dist
from dtrain_lab.grading.lab10 import local_loss


def run():
    rank, world = dist.get_rank(), dist.get_world_size()
    loss = torch.tensor([local_loss(rank)])
    dist.all_reduce(loss)               # every rank takes part in the collective
    loss /= world
    if rank == 0:                       # only the logging is rank-specific
        print(f"mean loss {loss.item():.3f}")
    dist.barrier()
    return loss.item()
