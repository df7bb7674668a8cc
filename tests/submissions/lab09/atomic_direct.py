# Wrong: torch.save straight onto the checkpoint's name (a crash leaves a torn file there).
import torch

from dtrain_lab.grading.lab09 import atomic_cases


def atomic_save(obj, path):
    torch.save(obj, path)


def run():
    return atomic_cases(atomic_save)
