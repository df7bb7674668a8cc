"""Finding and killing every process of a launched job, so that none survives it.

A job's processes are found three ways, because each alone misses some:

* the launcher starts torchrun in a new session (its own process group): ``killpg`` reaches every
  process that stayed in that group;
* the process tree under torchrun: reaches processes that changed group but kept their parent;
* the marker ``DTRAIN_JOB_ID=<id>`` in the environment every process of the job inherits: reaches
  a double-forked, ``setsid`` daemon whose parent already exited (it was re-parented to init).

Killing is ``SIGKILL`` and repeated until a sweep finds nothing, since a process can fork while the
previous sweep runs.
"""
from __future__ import annotations

import ctypes
import os
import signal
import sys
import time

import psutil

JOB_ENV = "DTRAIN_JOB_ID"


def set_parent_death_signal() -> None:  # pragma: no cover - runs in the child before exec
    """Linux: have the kernel SIGTERM torchrun if the launching process (a notebook kernel) dies,
    so that torchrun stops its workers instead of leaving them orphaned."""
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL("libc.so.6", use_errno=True)
            libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
        except OSError:
            pass


def job_processes(job_id: str, root_pid: int | None = None, since: float = 0.0) -> list[psutil.Process]:
    """Every live process of the job (not the caller)."""
    found: dict[int, psutil.Process] = {}
    me = os.getpid()
    if root_pid is not None:
        try:
            root = psutil.Process(root_pid)
            for p in [root, *root.children(recursive=True)]:
                found[p.pid] = p
        except psutil.Error:
            pass
    uid = os.getuid()
    for p in psutil.process_iter(["pid", "create_time", "uids"]):
        try:
            if p.pid == me or p.pid in found:
                continue
            if p.info["create_time"] is not None and p.info["create_time"] < since - 1.0:
                continue
            if p.info["uids"] is not None and p.info["uids"].real != uid and uid != 0:
                continue
            if p.environ().get(JOB_ENV) == job_id:
                found[p.pid] = p
        except (psutil.Error, OSError):
            continue
    live = []
    for p in found.values():
        try:
            if p.status() != psutil.STATUS_ZOMBIE:
                live.append(p)
        except psutil.Error:
            pass
    return live


def kill_job(job_id: str, popen=None, since: float = 0.0, rounds: int = 20) -> int:
    """SIGKILL every process of the job until none is left; returns how many were alive to kill."""
    killed = 0
    root_pid = popen.pid if popen is not None else None
    for _ in range(rounds):
        procs = job_processes(job_id, root_pid, since)
        if popen is not None and popen.poll() is None:
            try:
                os.killpg(popen.pid, signal.SIGKILL)  # torchrun leads its own session / group
            except (ProcessLookupError, PermissionError):
                pass
        if not procs:
            break
        for p in procs:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass  # already gone by killpg: it was alive when found, so it counts
            except psutil.Error:
                continue
            killed += 1
        psutil.wait_procs(procs, timeout=1.0)
    if popen is not None:
        try:
            popen.wait(timeout=5)
        except Exception:  # noqa: BLE001
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
