"""A plausible slip: one open bucket per dtype, but the buckets listed as they were closed, then the
ones left open (DDP orders them by their first parameter in the reverse walk)."""
from dtrain_lab.grading.lab02 import bucket_cases


def build_buckets(params, cap_bytes):
    open_, buckets = {}, []
    for i in reversed(range(len(params))):
        current = open_.setdefault(params[i].dtype, [[], 0])
        current[0].append(i)
        current[1] += params[i].numel() * params[i].element_size()
        if current[1] >= cap_bytes:
            buckets.append(current[0])
            del open_[params[i].dtype]
    return buckets + [current for current, _ in open_.values()]


def run():
    return bucket_cases(build_buckets)
