import time

import torch.distributed as dist
from dtrain_lab.grading.lab10 import checkpoint_path, write_checkpoint

PATH = checkpoint_path()


def run():
    if dist.get_rank() == 0:
        write_checkpoint(PATH)
    else:
        time.sleep(8.0)                 # longer than any write: it reads the right text, by luck
    with open(PATH) as f:
        text = f.read()
    dist.barrier()                      # a barrier every rank takes part in... after the read
    return text
