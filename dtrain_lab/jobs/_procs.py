"""Ending every process of a launched job, so that none survives it, and asking ranks for their stacks.

Every launch runs under an init (:mod:`dtrain_lab.sandbox.contain`): a child subreaper that holds the
job's whole process tree, a double-forked ``setsid`` daemon included, and kills what is left of it
when torchrun ends. :func:`kill_job` kills that tree from outside (a time-out, Ctrl-C).
"""
from __future__ import annotations

import os
import signal
import sys
import time

from dtrain_lab.sandbox import child, contain

JOB_ENV = "DTRAIN_JOB_ID"   # the job's id, in every rank's environment (a label: nothing finds processes by it)


def set_parent_death_signal() -> None:  # pragma: no cover - runs in the child before exec
    """Linux: have the kernel SIGTERM the job's init if the launching process (a notebook kernel)
    dies; it passes it on to torchrun, which stops its workers, and then kills what is left."""
    if sys.platform.startswith("linux"):
        child.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def kill_job(popen, report: str | None = None) -> int:
    """SIGKILL every process of the job whose init is ``popen`` (until none is left), then the init;
    wait for it. Returns how many processes were killed, counting those the init itself killed when
    the job ended (the number it wrote to ``report``)."""
    killed = contain.kill_tree(popen.pid) if popen.poll() is None else 0
    try:
        popen.wait(timeout=5)
    except Exception:  # noqa: BLE001
        pass
    if report:
        try:
            with open(report) as f:
                killed += int(f.read().strip() or 0)
        except (OSError, ValueError):
            pass
    return killed


def sigusr1(pid: int) -> bool:
    try:
        os.kill(pid, signal.SIGUSR1)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def wait_stable_all(paths: list[str], timeout: float = 3.0, quiet: float = 0.5, growing: float = 10.0) -> None:
    """Wait until every stack dump in ``paths`` is complete. faulthandler writes a dump frame by frame,
    in the rank's signal handler, and on a loaded machine the rank can be descheduled half-way: a
    dump counts as complete once its size has not changed for ``quiet`` seconds. A file still empty
    after ``timeout`` seconds is given up (the rank did not answer: gone, or not a Python process);
    one that keeps growing, after ``growing`` seconds. All files are watched together, so the wait
    is about ``quiet`` seconds however many ranks there are."""
    t0 = time.monotonic()
    last: dict[str, tuple[int, float]] = {}
    pending = set(paths)
    while pending:
        now = time.monotonic()
        for path in list(pending):
            try:
                size = os.path.getsize(path)
            except OSError:
                size = -1
            if size <= 0:
                if now - t0 > timeout:
                    pending.discard(path)
                continue
            seen, since = last.get(path, (-1, now))
            if size != seen:
                last[path] = (size, now)
            if (size == seen and now - since >= quiet) or now - t0 > growing:
                pending.discard(path)
        if pending:
            time.sleep(0.05)


def read_text(path: str) -> str:
    """The file's text, or "" if it cannot be read."""
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""
