"""Where a graded job's supervisor comes from: a fork of this grader process's supervisor server
(:mod:`dtrain_lab.sandbox.supervisor_server`), which imports torch once per grader process instead
of once per job. With bubblewrap the fork enters the job's outer sandbox, which bubblewrap built
around a placeholder; the ranks it starts enter their own sandboxes from it
(:mod:`dtrain_lab.sandbox.enter`). Without a sandbox it is the job's supervisor directly.

The server ends with this process (its stdin closes; any supervisor it still runs is killed, and
every rank with it), or after ten idle minutes. A server that cannot start, or an outer sandbox that
cannot be built, is the grader's failure (:class:`StartError`), never the submission's.
"""
from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from dtrain_lab.sandbox import enter, python_m
from dtrain_lab.sandbox.forkserve import Client, Served

_lock = threading.Lock()
_server: Client | None = None


class StartError(OSError):
    """The job's supervisor could not be started (the grader's machine, not the submission)."""


class ServedSupervisor(Served):
    """A supervisor the server forked; it also owns the job's outer placeholder sandbox, if any."""

    def __init__(self, client: Client, pid: int, outer):
        super().__init__(client, pid)
        self.outer = outer

    def poll(self):
        code = self.returncode
        if code is not None:
            self.stop()
        return code

    def kill(self) -> None:
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except OSError:
            pass
        self.stop()

    def stop(self) -> None:
        """End the outer sandbox (its namespaces go; every rank's sandbox was already ended with its rank)."""
        outer, self.outer = self.outer, None
        if outer is not None:
            enter.stop_placeholder(outer)


@functools.lru_cache(maxsize=1)
def fresh_sys_path() -> tuple:
    """``sys.path`` of a fresh ``python`` (after ``site``), without the working folder or ``PYTHONPATH``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    out = subprocess.run([sys.executable, "-c", "import sys, json; print(json.dumps(sys.path[1:]))"],
                         capture_output=True, text=True, env=env, cwd="/", timeout=60)
    return tuple(p for p in json.loads(out.stdout) if p and os.path.exists(p))


def _server_now() -> Client:
    global _server
    if _server is None or not _server.alive():
        argv = python_m("dtrain_lab.sandbox.supervisor_server", json.dumps(list(fresh_sys_path())))
        try:
            _server = Client(argv, {"PATH": "/usr/bin:/bin"}, "dtrain-supervisor-server")
        except OSError as exc:
            raise StartError(f"the supervisor server did not start: {exc}") from None
    return _server


def start(plan: str, log: str, outer_argv: list | None = None, bwrap: str | None = None) -> ServedSupervisor:
    """The job's supervisor (plan file ``plan``, output in ``log``), forked by this process's server,
    inside the outer sandbox ``outer_argv`` builds around a placeholder (None: no sandbox)."""
    with _lock:
        server = _server_now()
        outer = init = None
        if outer_argv is not None:
            try:
                outer, init, _ = enter.start_placeholder(outer_argv, bwrap)
            except OSError as exc:
                raise StartError(f"the job's outer sandbox did not start: {exc}") from None
        pid = server.fork({"plan": plan, "outer": init, "log": log})
        if pid is None:
            if outer is not None:
                enter.stop_placeholder(outer)
            raise StartError("the supervisor server did not answer")
        return ServedSupervisor(server, pid, outer)


def started(proc: ServedSupervisor, status: Path, timeout: float = 60.0) -> bool:
    """Whether the supervisor got going (its first status line), or False once it ended without."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if status.is_file() and status.stat().st_size > 0:
            return True
        if proc.poll() is not None:
            return status.is_file() and status.stat().st_size > 0
        time.sleep(0.01)
    return True   # slow, not failed: the runner's own clocks take over


def server_pid() -> int | None:
    with _lock:
        return _server.proc.pid if _server is not None and _server.alive() else None
