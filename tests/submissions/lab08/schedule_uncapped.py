"""The warm-up p - s - 1 is not capped by m: with m < p it schedules micro-batches that do not exist."""
from dtrain_lab.grading.lab08 import schedule_cases


def schedule_1f1b(num_stages, num_microbatches):
    schedule = []
    for s in range(num_stages):
        warmup = num_stages - s - 1
        actions = [("F", mb) for mb in range(warmup)]
        for i in range(num_microbatches - warmup):
            actions += [("F", warmup + i), ("B", i)]
        actions += [("B", mb) for mb in range(num_microbatches - warmup, num_microbatches)]
        schedule.append(actions)
    return schedule


def run():
    return schedule_cases(schedule_1f1b)
