"""The other accepted fix: keep rank-0-only evaluation, but wait in a group with a long timeout."""
from datetime import timedelta

import torch
import torch.distributed as dist
from dtrain_lab.grading.lab11 import VAL_SIZE, evaluate


def run():
    patient = dist.new_group(timeout=timedelta(seconds=60))   # every rank creates it, before the wait
    metric = torch.zeros(1)
    if dist.get_rank() == 0:
        metric = torch.tensor([evaluate(range(VAL_SIZE)) / VAL_SIZE])
    dist.broadcast(metric, src=0, group=patient)
    return metric.item()
