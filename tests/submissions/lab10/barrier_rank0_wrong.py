import time

import torch.distributed as dist
from dtrain_lab.grading.lab10 import checkpoint_path, write_checkpoint

PATH = checkpoint_path()


def run():
    dist.barrier()                      # "fix": everyone takes part in a barrier... before the write
    if dist.get_rank() == 0:
        write_checkpoint(PATH)
    else:
        time.sleep(0.5)                 # and the readers hope half a second is enough
    try:
        with open(PATH) as f:
            return f.read()
    except FileNotFoundError:
        return None
