"""The warm-up grows with the stage index (s instead of p - s - 1): neighbours wait for each other."""
from dtrain_lab.grading.lab08 import schedule_cases


def schedule_1f1b(num_stages, num_microbatches):
    schedule = []
    for s in range(num_stages):
        warmup = min(s, num_microbatches)
        actions = [("F", mb) for mb in range(warmup)]
        for i in range(num_microbatches - warmup):
            actions += [("F", warmup + i), ("B", i)]
        actions += [("B", mb) for mb in range(num_microbatches - warmup, num_microbatches)]
        schedule.append(actions)
    return schedule


def run():
    return schedule_cases(schedule_1f1b)
