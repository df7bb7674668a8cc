"""Where a graded job's supervisor comes from: a fresh ``python supervisor.py PLAN`` that bubblewrap
starts in the job's outer sandbox, or a fork of this grader's supervisor server
(:mod:`dtrain_lab.grading.supervisor_server`) that enters an outer sandbox bubblewrap built around a
placeholder. The server imports torch once per grader process instead of once per job; its forks
are the same supervisor, in the same sandbox, and the ranks they start enter their own sandboxes
from them (:mod:`dtrain_lab.grading.zygote`).

A job uses the server only in zygote mode (bubblewrap; ``DTRAIN_GRADE_ZYGOTE=0`` turns both off). A
server that cannot start, or a supervisor that cannot enter its sandbox, costs nothing but the try:
the job starts the way it did before. The server ends with this process (its stdin closes; any
supervisor it still runs is killed, and every rank with it), or after ten idle minutes.
"""
from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from dtrain_lab.grading import zygote

SERVER_FILE = str(Path(__file__).with_name("supervisor_server.py"))
_lock = threading.Lock()
_server: "_Server | None" = None
_broken = ""   # why no server can be had in this process


class ServedSupervisor:
    """The part of :class:`subprocess.Popen` the runner uses, for a supervisor the server forked; it
    also owns the job's outer placeholder sandbox."""

    def __init__(self, server: "_Server", pid: int, outer):
        self.server, self.pid, self.outer = server, pid, outer

    @property
    def returncode(self):
        with self.server.cond:
            return self.server.codes.get(self.pid)

    def poll(self):
        code = self.returncode
        if code is not None and self.outer is not None:
            self.stop()
        return code

    def wait(self, timeout: float | None = None) -> int:
        with self.server.cond:
            if not self.server.cond.wait_for(lambda: self.pid in self.server.codes or self.server.dead, timeout):
                raise subprocess.TimeoutExpired(["supervisor"], timeout or 0.0)
        return self.poll() if self.returncode is not None else -signal.SIGKILL

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


class _Server:
    def __init__(self, sys_path: list):
        self.cond = threading.Condition()
        self.codes: dict[int, int] = {}
        self.replies: queue.Queue = queue.Queue()
        self.dead = False
        self.proc = subprocess.Popen([sys.executable, "-I", "-S", SERVER_FILE, json.dumps(sys_path)],
                                     env={zygote.SLOT: "x" * zygote.SLOT_BYTES}, cwd="/", stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        threading.Thread(target=self._read, daemon=True, name="dtrain-supervisor-server").start()
        first = self._reply(120.0)
        if not first.get("usable"):
            self.close()
            raise OSError(f"supervisor server did not start: {first}")

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            if "exit" in msg:
                with self.cond:
                    self.codes[int(msg["exit"])] = int(msg["code"])
                    self.cond.notify_all()
            else:
                if "pid" in msg:   # a recycled pid: forget the exit of the one before
                    with self.cond:
                        self.codes.pop(int(msg["pid"]), None)
                self.replies.put(msg)
        self.replies.put({"error": "supervisor server ended"})
        with self.cond:
            self.dead = True
            self.cond.notify_all()

    def _reply(self, timeout: float) -> dict:
        try:
            return self.replies.get(timeout=timeout)
        except queue.Empty:
            return {"error": "no answer"}

    def alive(self) -> bool:
        return not self.dead and self.proc.poll() is None

    def fork(self, plan: str, outer_pid: int, log: str) -> int | None:
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write((json.dumps({"plan": plan, "outer": outer_pid, "log": log}) + "\n").encode())
            self.proc.stdin.flush()
        except (OSError, ValueError):
            return None
        reply = self._reply(30.0)
        return int(reply["pid"]) if "pid" in reply else None

    def close(self) -> None:
        try:
            if self.proc.stdin is not None:
                self.proc.stdin.close()
            self.proc.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()


def start(outer_argv: list, bwrap: str, plan: str, log: str, sys_path: list) -> ServedSupervisor | None:
    """The job's supervisor, forked by this process's server into the outer sandbox ``outer_argv``
    builds around a placeholder; None where that cannot be had (the caller starts it as before)."""
    global _server, _broken
    with _lock:
        if _broken:
            return None
        if _server is None or not _server.alive():
            try:
                _server = _Server(sys_path)
            except OSError as exc:
                _broken = str(exc)
                return None
        try:
            outer, init, _ = zygote.start_placeholder(outer_argv, bwrap)
        except OSError:
            return None
        pid = _server.fork(plan, init, log)
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
