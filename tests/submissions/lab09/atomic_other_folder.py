# Wrong: the temporary file lives in another folder (os.replace is atomic only within one file system).
import os
import tempfile

import torch

from dtrain_lab.grading.lab09 import atomic_cases


def atomic_save(obj, path):
    fd, tmp = tempfile.mkstemp(dir=tempfile.mkdtemp())
    with os.fdopen(fd, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dfd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    os.fsync(dfd)
    os.close(dfd)


def run():
    return atomic_cases(atomic_save)
