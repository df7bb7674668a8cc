"""Steady state as (backward, forward): the last stage starts with B0 before F0."""
from dtrain_lab.grading.lab08 import schedule_cases


def schedule_1f1b(num_stages, num_microbatches):
    schedule = []
    for s in range(num_stages):
        warmup = min(num_stages - s - 1, num_microbatches)
        actions = [("F", mb) for mb in range(warmup)]
        for i in range(num_microbatches - warmup):
            actions += [("B", i), ("F", warmup + i)]
        actions += [("B", mb) for mb in range(num_microbatches - warmup, num_microbatches)]
        schedule.append(actions)
    return schedule


def run():
    return schedule_cases(schedule_1f1b)
