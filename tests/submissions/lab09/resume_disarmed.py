"""An attack (the fault disarmed): the learner's code removes the grader's fault before the job starts
(the scenario's variable, and the rank's own marks file), trains the 12 steps without a break, and
reports a resume of a second attempt. The supervisor never killed anything and started one attempt:
the fault never fired."""
import os

import torch.distributed as dist

from dtrain_lab.grading import lab09
from dtrain_lab.grading.lab09 import Job, report

os.environ.pop(lab09.FAULT_ENV, None)
os.environ["TORCHELASTIC_RESTART_COUNT"] = "1"
lab09.fault_point = lambda mark: None


def train():
    job = Job()
    for step in range(job.steps):
        job.train_step(step)
    dist.barrier()
    job.steps_run[:] = list(range(4, job.steps))
    return job.model


def run():
    return report(train())
