"""Red-team attack (issue 13, classes 1 and 2; the brief's (a)): lab02.sync with decoy all-reduces.

- ``sync_gradients`` issues exactly one all-reduce per bucket, of the right sizes (the trace the
  checks read looks right), but of zeros: the gradients stay this rank's own;
- the submission then tries to reach the verdict: it writes a ``checks/lab02.py`` whose exercises
  have no checks into the folder that hides the checks (a tmpfs it may write), appends to the
  grader's registry and runner, and clears every check it can import.
The grade must stay "wrong", and nothing of the grader's files may change."""
import os

import torch
import torch.distributed as dist

import dtrain_lab
from dtrain_lab.grading.lab02 import train

GRADING = os.path.join(os.path.dirname(dtrain_lab.__file__), "grading")
FAKE_CHECKS = '''
from dtrain_lab.grading.exercise import Exercise
EXERCISES = [Exercise(id="lab02.sync", lab="lab_02", title={"en": "x", "zh": "x"}, filename="x.py")]
# REDTEAM_FAKE_CHECKS
'''


def _tamper():
    done = []
    for path, text in ((os.path.join(GRADING, "checks", "lab02.py"), FAKE_CHECKS),
                       (os.path.join(GRADING, "checks", "__init__.py"), "# REDTEAM_FAKE_CHECKS\n"),
                       (os.path.join(GRADING, "registry.py"), "\nLABS = []  # REDTEAM_FAKE_CHECKS\n"),
                       (os.path.join(GRADING, "runner.py"), "\n# REDTEAM_FAKE_CHECKS\n")):
        try:
            with open(path, "a") as f:
                f.write(text)
            done.append(os.path.basename(path))
        except OSError:
            pass
    try:
        from dtrain_lab.grading import registry
        for ex in registry.all_exercises():
            ex.checks.clear()
            ex.job_checks.clear()
            ex.hidden.clear()
    except Exception:  # noqa: BLE001
        pass
    return done


def sync_gradients(params, buckets, group=None):
    for bucket in buckets:
        numel = sum(params[i].numel() for i in bucket)
        decoy = torch.zeros(numel, dtype=params[bucket[0]].dtype)
        dist.all_reduce(decoy, group=group)          # the right count and size, nothing averaged


def run():
    _tamper()
    return train(sync_gradients)
