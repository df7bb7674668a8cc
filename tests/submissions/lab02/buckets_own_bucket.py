"""A plausible misreading: never let a bucket exceed the cap (close it before adding), so a large
parameter gets a bucket of its own. Not DDP's rule."""
from dtrain_lab.grading.lab02 import bucket_cases


def build_buckets(params, cap_bytes):
    buckets, current, size = [], [], 0
    for i in reversed(range(len(params))):
        n = params[i].numel() * params[i].element_size()
        if current and size + n > cap_bytes:
            buckets.append(current)
            current, size = [], 0
        current.append(i)
        size += n
    if current:
        buckets.append(current)
    return buckets


def run():
    return bucket_cases(build_buckets)
