# Wrong: never resumes, starts over from step 0 after the restart.
import os
import re

import torch
import torch.distributed as dist

from dtrain_lab.grading.lab09 import Job, report


def atomic_save(obj, path):
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def latest_checkpoint(ckpt_dir):
    """The path of the newest complete checkpoint in ckpt_dir, or None."""
    steps = [int(m.group(1)) for name in os.listdir(ckpt_dir)
             if (m := re.fullmatch(r"step_(\d+)\.pt", name))]   # never a half-written step_N.pt.tmp
    return os.path.join(ckpt_dir, f"step_{max(steps):06d}.pt") if steps else None


def train():
    job = Job()
    rank, world = dist.get_rank(), dist.get_world_size()
    start = 0
    path = None   # wrong: never looks for a checkpoint
    if path is not None:
        state = torch.load(path, weights_only=True)
        job.module.load_state_dict(state["model"])
        job.optimizer.load_state_dict(state["optimizer"])     # momentum buffers
        job.scheduler.load_state_dict(state["scheduler"])     # where StepLR is in its count
        torch.set_rng_state(state["rng"][rank])               # this rank's own dropout stream
        start = state["step"]
    for step in range(start, job.steps):
        job.train_step(step)
        if (step + 1) % job.ckpt_every == 0:
            rngs = [None] * world
            dist.all_gather_object(rngs, torch.get_rng_state())   # every rank's generator differs
            if rank == 0:                                     # model and optimizer are the same on every rank
                state = {"step": step + 1, "model": job.module.state_dict(),
                         "optimizer": job.optimizer.state_dict(), "scheduler": job.scheduler.state_dict(),
                         "rng": rngs}
                atomic_save(state, os.path.join(job.ckpt_dir, f"step_{step + 1:06d}.pt"))
            dist.barrier()                                    # nobody runs ahead of a checkpoint being written
    return job.model


def run():
    return report(train())
