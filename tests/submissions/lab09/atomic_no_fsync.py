# Wrong (subtly): temporary file and rename, but nothing is fsynced.
import os

import torch

from dtrain_lab.grading.lab09 import atomic_cases


def atomic_save(obj, path):
    tmp = path + ".tmp"
    torch.save(obj, tmp)
    os.replace(tmp, path)


def run():
    return atomic_cases(atomic_save)
