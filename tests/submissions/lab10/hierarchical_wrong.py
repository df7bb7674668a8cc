# A plausible wrong fix for lab 10 exercise 9: the deadlock is gone because every rank now calls one
# flat all-reduce over the world. The sum is right, but there is no hierarchy left (the grader's
# trace check says so).
import torch.distributed as dist
from dtrain_lab.grading.lab10 import local_gradient


def run():
    grad = local_gradient()
    dist.all_reduce(grad)
    return grad
