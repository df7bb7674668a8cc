import os
import tempfile

import torch.distributed as dist

PATH = os.path.join(tempfile.gettempdir(), f"lab10_ckpt_{os.environ.get('DTRAIN_JOB_ID', 'x')}.txt")


def run():
    if dist.get_rank() == 0:
        with open(PATH, "w") as f:
            f.write("step 100 checkpoint")
        dist.barrier()                  # "wait until everyone sees the file": only rank 0 is here
    with open(PATH) as f:
        return f.read()
