"""A plausible slip: DDP's rule applied to one stream of buckets whatever the dtype (a flat bucket
buffer holds one dtype, so DDP keeps one open bucket per dtype)."""
from dtrain_lab.grading.lab02 import bucket_cases


def build_buckets(params, cap_bytes):
    buckets, current, size = [], [], 0
    for i in reversed(range(len(params))):
        current.append(i)
        size += params[i].numel() * params[i].element_size()
        if size >= cap_bytes:
            buckets.append(current)
            current, size = [], 0
    if current:
        buckets.append(current)
    return buckets


def run():
    return bucket_cases(build_buckets)
