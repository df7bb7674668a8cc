"""A shortcut an honest learner might write: no checkpoint at all. After the restart the job trains
the 12 steps again from step 0, and reports the steps it ran as if it had resumed at step 4. Before
the grader handed out other batches for steps 0-3 after a restart, starting over ended with the
right parameters; now it ends with other ones."""
import torch.distributed as dist

from dtrain_lab.grading.lab09 import Job, report


def train():
    job = Job()
    for step in range(job.steps):
        job.train_step(step)
    dist.barrier()
    job.steps_run[:] = [s for s in job.steps_run if s >= 4]    # claims a resume
    return job.model


def run():
    return report(train())
