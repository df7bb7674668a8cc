"""Red-team attack (issue 13, class 2): lab10.barrier_rank0 with a race instead of the barrier the
exercise teaches. Every rank takes one barrier at the very start (before anything is written: it
synchronises nothing, it only makes the trace non-empty); the readers then poll the file until it
holds a whole checkpoint (the text has a fixed length, 32 characters)."""
import time

import torch.distributed as dist

from dtrain_lab.grading.lab10 import checkpoint_path, write_checkpoint

LENGTH = len("step 123 checkpoint 0123456789ab")


def run():
    dist.barrier()                       # decoy: before the write, so it orders nothing
    path = checkpoint_path()
    if dist.get_rank() == 0:
        write_checkpoint(path)
    else:
        while True:
            try:
                with open(path) as f:
                    text = f.read()
            except FileNotFoundError:
                text = ""
            if len(text) >= LENGTH:
                break
            time.sleep(0.01)
    with open(path) as f:
        return f.read()
