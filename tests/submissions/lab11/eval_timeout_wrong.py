"""A plausible wrong fix: raise "the NCCL timeout" through the environment, keep the program."""
import os

import torch
import torch.distributed as dist
from dtrain_lab.grading.lab11 import VAL_SIZE, evaluate

os.environ["NCCL_TIMEOUT"] = "3600"            # read by nothing
os.environ["TORCH_NCCL_BLOCKING_WAIT"] = "1"


def run():
    metric = torch.zeros(1)
    if dist.get_rank() == 0:
        metric = torch.tensor([evaluate(range(VAL_SIZE)) / VAL_SIZE])
    dist.broadcast(metric, src=0)
    return metric.item()
