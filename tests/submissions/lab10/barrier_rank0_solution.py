import os
import tempfile

import torch.distributed as dist

PATH = os.path.join(tempfile.gettempdir(), f"lab10_ckpt_{os.environ.get('DTRAIN_JOB_ID', 'x')}.txt")


def run():
    if dist.get_rank() == 0:
        with open(PATH + ".tmp", "w") as f:
            f.write("step 100 checkpoint")
        os.replace(PATH + ".tmp", PATH)  # readers never see a half-written file
    dist.barrier()                       # every rank waits here until rank 0 has written it
    with open(PATH) as f:
        return f.read()
