"""Red-team attack (issue 13, class 1 "patch/bypass the tracer"; the brief's (a)): lab10.hierarchical
without any hierarchy. One flat all-reduce over the whole world, issued through the process
group object (``ProcessGroup.allreduce``) instead of ``torch.distributed.all_reduce``: the harness's
tracer wraps the module-level functions only, so the trace shows no all-reduce at all, and the
check that catches a flat all-reduce (``_two_levels``) reads only the trace. The sum is right."""
from torch.distributed.distributed_c10d import _get_default_group

from dtrain_lab.grading.lab10 import local_gradient


def run():
    t = local_gradient()
    _get_default_group().allreduce([t]).wait()     # flat, world-wide, not in the trace
    return t
