"""The grader's program in every rank, inside the rank's sandbox: ``python -m dtrain_lab.grading.harness --rank R``.

It runs the learner's function and hands back what it returned; it judges nothing (the checks are
not even importable here). In order: register a stack dump on ``SIGUSR1`` (the grader asks for it
on a hang), join the process group (``ready``), shorten the group's timeout if the exercise says so,
run the exercise's contract ``setup``, record the collectives this rank issues (a trace the
grader uses to explain a failure), import the submission *as a module* (its ``__main__`` block does
not run), call its entry function and write the value into the rank's result file
(:mod:`dtrain_lab.grading.channel`). Every step is an event line in the rank's ``events`` file; an
exception goes to its ``error`` file. Everything it was given comes from files and variables
named ``DTRAIN_GRADE_*``; inside the sandbox they are this rank's own.

Nothing here is trusted: the learner's code runs in this process and could rewrite any of it. What
the grader believes comes from outside (exit codes, times, private inputs) or is checked against it.
"""
from __future__ import annotations

import importlib
import importlib.util
import json
import os
import sys
import time
import traceback


def _event(io: str, name: str, **fields) -> None:
    line = json.dumps({"ev": name, "t": time.time(), **fields}) + "\n"
    try:
        fd = os.open(os.path.join(io, "events"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)
    except OSError:
        pass


def _record_error(io: str, exc: BaseException) -> None:
    info = {"type": type(exc).__name__, "message": str(exc)[:2000], "time": time.time(),
            "traceback": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))[-8000:]}
    try:
        with open(os.path.join(io, "error"), "w") as f:
            json.dump(info, f)
    except OSError:
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


def _stack_dumps(io: str) -> None:
    import faulthandler
    import signal

    f = open(os.path.join(io, "stack"), "w")  # noqa: SIM115 - kept open for the process's lifetime
    faulthandler.register(signal.SIGUSR1, file=f, all_threads=True, chain=False)
    sys._dtrain_stack_file = f


def _run(io: str, spec: dict) -> int:
    from dtrain_lab.grading import channel, trace
    from dtrain_lab.jobs import runtime

    rt = runtime.init()
    _event(io, "ready")
    if spec.get("pg_timeout"):
        _shorten_pg_timeout(rt, float(spec["pg_timeout"]))   # before tracing: the barrier is the harness's own
    if spec.get("setup"):
        module_name, _, func = spec["setup"].partition(":")
        getattr(importlib.import_module(module_name), func)(rt)
    trace.install(os.path.join(io, "trace"))

    path = os.environ["DTRAIN_GRADE_SUBMISSION"]
    module_spec = importlib.util.spec_from_file_location("submission", path)
    module = importlib.util.module_from_spec(module_spec)
    sys.modules["submission"] = module
    module_spec.loader.exec_module(module)
    fn = getattr(module, spec["entry"], None)
    if not callable(fn):
        _event(io, "missing_entry")
        return 0
    result = fn()
    _event(io, "returned")
    try:
        size = channel.write(os.path.join(io, "result"), result)
    except ValueError as exc:   # too large to hand back
        _event(io, "result_too_large", why=str(exc)[:300])
        return 0
    _event(io, "done", bytes=size)
    runtime.cleanup()
    return 0


def main() -> None:
    io = os.environ["DTRAIN_GRADE_IO"]
    _event(io, "start")
    code = 1
    try:
        with open(os.environ["DTRAIN_GRADE_SPEC"]) as f:
            spec = json.load(f)
        _stack_dumps(io)
        code = _run(io, spec)
    except SystemExit as exc:   # sys.exit(n) inside the submission
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        _event(io, "exit", code=code)
    except BaseException as exc:  # noqa: BLE001 - every failure reaches the grader as data
        _record_error(io, exc)
        traceback.print_exc()
        code = 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001
            pass
    # gloo's process-group destructor can deadlock at interpreter exit (pytorch#56297)
    os._exit(code)


if __name__ == "__main__":
    main()
