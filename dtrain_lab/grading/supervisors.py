"""Where a graded job's supervisor comes from: a fresh ``python supervisor.py PLAN`` that bubblewrap
starts in the job's outer sandbox, or a fork of this grader's supervisor server
(:mod:`dtrain_lab.grading.supervisor_server`) that enters an outer sandbox bubblewrap built around a
placeholder. The server imports torch once per grader process instead of once per job; its forks
are the same supervisor, in the same sandbox, and the ranks they start enter their own sandboxes
from them (:mod:`dtrain_lab.grading.zygote`).

A job uses the server only in zygote mode (bubblewrap; ``DTRAIN_GRADE_ZYGOTE=0`` turns both off) and
where the grader runs as root (a course server, CI), the case this course's tests prove. A
server that cannot start, or a supervisor that cannot enter its sandbox, costs nothing but the try:
the job starts the way it did before. The server ends with this process (its stdin closes; any
supervisor it still runs is killed, and every rank with it), or after ten idle minutes.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

from dtrain_lab.grading import zygote
from dtrain_lab.jobs._forkserve import Client, Served, slot_env

SERVER_FILE = str(Path(__file__).with_name("supervisor_server.py"))
_lock = threading.Lock()
_server: Client | None = None
_broken = ""   # why no server can be had in this process


class ServedSupervisor(Served):
    """A supervisor the server forked; it also owns the job's outer placeholder sandbox."""

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
            zygote.stop_placeholder(outer)


def _server_for(sys_path: list) -> Client:
    client = Client([sys.executable, "-I", "-S", SERVER_FILE, json.dumps(sys_path)],
                    slot_env(), "dtrain-supervisor-server")
    if not client.ready.get("usable"):
        client.close()
        raise OSError("the supervisor server has no environment slot")
    return client


def start(outer_argv: list, bwrap: str, plan: str, log: str, sys_path: list) -> ServedSupervisor | None:
    """The job's supervisor, forked by this process's server into the outer sandbox ``outer_argv``
    builds around a placeholder; None where that cannot be had (the caller starts it as before)."""
    global _server, _broken
    if os.geteuid() != 0:
        # proven here and in CI only where the grader is root (the outer sandbox then has no user or PID
        # namespace of its own); elsewhere each job starts its own supervisor, whose ranks still use the zygote
        return None
    with _lock:
        if _broken:
            return None
        if _server is None or not _server.alive():
            try:
                _server = _server_for(sys_path)
            except OSError as exc:
                _broken = str(exc)
                return None
        try:
            outer, init, _ = zygote.start_placeholder(outer_argv, bwrap)
        except OSError:
            return None
        pid = _server.fork({"plan": plan, "outer": init, "log": log})
        if pid is None:
            zygote.stop_placeholder(outer)
            return None
        return ServedSupervisor(_server, pid, outer)


def entered(proc: ServedSupervisor, status: Path, timeout: float = 60.0) -> bool:
    """Whether the supervisor got into its sandbox and started the job (its first status line), or
    False once it ended without (then nothing of the job ran)."""
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
