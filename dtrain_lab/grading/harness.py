"""The grader's program inside every rank: ``python -m dtrain_lab.grading.harness ID SUBMISSION``.

In each rank: cap memory (a runaway allocation becomes an error, not a swapping machine), join the
process group, trace collectives, import the submission *as a module* (its ``__main__`` block does
not run), call the exercise's entry function, run every check on the result, and report the
problems through the launcher's private channel. The learner's code cannot skip the checks: they
run after it returns, in the harness.
"""
from __future__ import annotations

import importlib.util
import os
import resource
import sys
import traceback


def _limit_memory(gb: float) -> None:
    limit = int(gb * (1 << 30))
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        if hard != resource.RLIM_INFINITY:
            limit = min(limit, hard)
        resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    except (ValueError, OSError):  # macOS ignores RLIMIT_AS for some processes: best effort
        pass


def _shorten_pg_timeout(rt, seconds: float) -> None:
    """Give the default group a short timeout, standing for PyTorch's default (10 minutes for NCCL).

    It is set after a barrier taken under the normal timeout, so that a rank slow to start on a
    loaded machine cannot trip it: only waits inside the submission count. ``_set_pg_timeout`` is
    PyTorch's (private) way to change a live group's timeout; the learner's code cannot tell the
    difference from ``init_process_group(timeout=...)``.
    """
    import datetime

    import torch.distributed as dist
    from torch.distributed.distributed_c10d import _set_pg_timeout

    dist.barrier()
    _set_pg_timeout(datetime.timedelta(seconds=seconds))
    rt.timeout_s = seconds


def main() -> None:
    from dtrain_lab.jobs import runtime
    from dtrain_lab.grading import registry, trace

    exercise_id, path = sys.argv[1], sys.argv[2]
    ex = registry.get(exercise_id)
    _limit_memory(ex.memory_limit_gb)
    rt = runtime.current()
    if ex.pg_timeout:
        _shorten_pg_timeout(rt, ex.pg_timeout)   # before tracing: the barrier is the harness's own
    if ex.setup is not None:
        ex.setup(rt)
    job_dir = os.environ.get("DTRAIN_JOB_DIR", "/tmp")
    trace.install(os.path.join(job_dir, f"trace.{rt.rank}.jsonl"))

    spec = importlib.util.spec_from_file_location("submission", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["submission"] = module
    spec.loader.exec_module(module)
    fn = getattr(module, ex.entry, None)
    if not callable(fn):
        runtime.report(missing_entry=ex.entry)
        return
    result = fn()
    problems = []
    for check in ex.all_checks():
        try:
            problems.extend(check(rt, result, module) or [])
        except Exception as exc:  # noqa: BLE001 - a check that cannot run on this result is a failure
            problems.append({"zh": f"检查无法在你的结果上运行：{type(exc).__name__}: {exc}",
                             "en": f"a check could not run on your result: {type(exc).__name__}: {exc}",
                             "trace": traceback.format_exc()[-2000:]})
    runtime.report(done=True, problems=problems)


if __name__ == "__main__":
    from dtrain_lab.jobs import runtime

    runtime.entrypoint(main)
