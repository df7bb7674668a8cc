"""A plausible wrong fix: raise "the NCCL timeout" through the environment, keep the program."""
import os

import torch
import torch.distributed as dist
from dtrain_lab.grading.lab11 import VAL_SIZE, evaluate, val_samples

os.environ["NCCL_TIMEOUT"] = "3600"            # read by nothing
os.environ["TORCH_NCCL_BLOCKING_WAIT"] = "1"


def run():
    metric = torch.zeros(1, dtype=torch.float64)
    if dist.get_rank() == 0:
        metric = torch.tensor([evaluate(val_samples()) / VAL_SIZE], dtype=torch.float64)
    dist.broadcast(metric, src=0)
    return metric.item()
