"""GPipe's order: every forward, then every backward, on every stage (m micro-batches alive)."""
from dtrain_lab.grading.lab08 import schedule_cases


def schedule_1f1b(num_stages, num_microbatches):
    stage = [("F", mb) for mb in range(num_microbatches)] + [("B", mb) for mb in range(num_microbatches)]
    return [list(stage) for _ in range(num_stages)]


def run():
    return schedule_cases(schedule_1f1b)
