"""A plausible slip: the bucket rule applied in registration order instead of reverse."""
from dtrain_lab.grading.lab02 import bucket_cases


def build_buckets(params, cap_bytes):
    buckets, current, size = [], [], 0
    for i, p in enumerate(params):
        current.append(i)
        size += p.numel() * p.element_size()
        if size >= cap_bytes:
            buckets.append(current)
            current, size = [], 0
    if current:
        buckets.append(current)
    return buckets


def run():
    return bucket_cases(build_buckets)
