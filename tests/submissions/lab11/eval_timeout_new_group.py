"""The other accepted fix: keep rank-0-only evaluation, but wait in a group with a long timeout."""
from datetime import timedelta

import torch
import torch.distributed as dist
from dtrain_lab.grading.lab11 import VAL_SIZE, evaluate, val_samples


def run():
    patient = dist.new_group(timeout=timedelta(seconds=60))   # every rank creates it, before the wait
    metric = torch.zeros(1, dtype=torch.float64)
    if dist.get_rank() == 0:
        metric = torch.tensor([evaluate(val_samples()) / VAL_SIZE], dtype=torch.float64)
    dist.broadcast(metric, src=0, group=patient)
    return metric.item()
