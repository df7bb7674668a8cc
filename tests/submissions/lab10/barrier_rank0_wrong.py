import os
import tempfile
import time

import torch.distributed as dist

PATH = os.path.join(tempfile.gettempdir(), f"lab10_ckpt_{os.environ.get('DTRAIN_JOB_ID', 'x')}.txt")


def run():
    if dist.get_rank() == 0:
        with open(PATH, "w") as f:
            f.write("step 100 checkpoint")
    else:
        time.sleep(0.5)                 # "fix": hope half a second is enough, no synchronisation
    try:
        with open(PATH) as f:
            return f.read()
    except FileNotFoundError:
        return None
