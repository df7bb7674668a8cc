"""The loop and the client of the course's two fork servers; standard library only.

Both servers are a Python that has imported torch once and forks a child per request:
:mod:`dtrain_lab.jobs._agent_server` (torchrun agents for :func:`dtrain_lab.launch`) and
:mod:`dtrain_lab.sandbox.supervisor_server` (supervisors of graded jobs). The server side is
:func:`serve`; the client side (:class:`Client`, :class:`Served`) is used by
:mod:`dtrain_lab.jobs.agents` and :mod:`dtrain_lab.sandbox.supervisors`. A child's first steps are
:func:`detach`; it then becomes its program with :mod:`dtrain_lab.sandbox.child`.

Protocol, one JSON object per line: a request on the server's stdin; ``{"pid": N}`` (or
``{"error": text}``) in answer, and ``{"exit": N, "code": C}`` when that child ends (``C`` as
:attr:`subprocess.Popen.returncode`). The server ends when its stdin closes (the process that started
it ended), killing every process its children started (it is their child subreaper: nothing of theirs
escapes it), or after ``idle_s`` seconds without a child.
"""
from __future__ import annotations

import json
import os
import queue
import select
import signal
import subprocess
import sys
import threading

from dtrain_lab.sandbox import child, contain


# ------------------------------------------------------------------ the server side
def _write(obj) -> None:
    os.write(1, (json.dumps(obj) + "\n").encode())


def serve(fork_child, idle_s: float = 600.0, ready: dict | None = None) -> None:
    """Answer requests until stdin closes. ``fork_child(request, server_pid)`` runs in each forked
    child and never returns. Never returns."""
    server = os.getpid()
    contain.subreaper(True)   # what a child's job leaves behind is re-parented here, reaped, and never escapes
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # Ctrl-C in a terminal is the client's to handle
    children: set = set()

    def stop_all(*_):   # every process any child started, the children included: nothing outlives the server
        contain.kill_tree(server, include_root=False)
        os._exit(0)

    signal.signal(signal.SIGTERM, stop_all)
    pending, idle = b"", 0.0
    _write({"ready": server, **(ready or {})})
    while True:
        readable, _, _ = select.select([0, wake_r], [], [], 1.0)
        if wake_r in readable:
            try:
                while os.read(wake_r, 512):
                    pass
            except BlockingIOError:
                pass
        while True:   # its own children, and orphans it adopted as a subreaper
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            if pid in children:
                children.discard(pid)
                _write({"exit": pid, "code": os.waitstatus_to_exitcode(status)})
        if 0 in readable:
            data = os.read(0, 1 << 16)
            if not data:   # the client is gone
                stop_all()
            pending += data
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                try:
                    request = json.loads(line)
                    sys.stdout.flush()
                    pid = os.fork()
                except Exception as exc:  # noqa: BLE001
                    _write({"error": f"{type(exc).__name__}: {exc}"})
                    continue
                if pid == 0:
                    signal.set_wakeup_fd(-1)
                    for sig in (signal.SIGCHLD, signal.SIGTERM):
                        signal.signal(sig, signal.SIG_DFL)
                    fork_child(request, server)
                    os._exit(125)
                children.add(pid)
                _write({"pid": pid})
        idle = 0.0 if children or readable else idle + 1.0
        if idle >= idle_s:
            os._exit(0)


def detach(server: int, parent_death_signal: int, log: str) -> None:
    """First steps of a forked child: its own session, ``parent_death_signal`` when the server dies,
    stdin from /dev/null, stdout and stderr into ``log``, none of the server's other descriptors."""
    os.setsid()
    child.die_with(server, parent_death_signal)
    out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    null = os.open(os.devnull, os.O_RDONLY)
    child.reset(stdio=(null, out, out))


def relay_exit(pid: int) -> None:
    """Wait for child ``pid`` and end as it ended: its exit code, or ``128 + signal`` if a signal
    killed it (as a shell, or bubblewrap, reports it). Never returns."""
    code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    os._exit(128 - code if code < 0 else code & 0xFF)


# ------------------------------------------------------------------ the client side
class Client:
    """A server started by this process, and what it said about its children."""

    def __init__(self, argv: list[str], env: dict[str, str], name: str, start_timeout: float = 120.0):
        self.cond = threading.Condition()
        self.codes: dict[int, int] = {}
        self.replies: queue.Queue = queue.Queue()
        self.request_lock = threading.Lock()
        self.dead = False
        self.proc = self._popen(argv, env)
        threading.Thread(target=self._read, daemon=True, name=name).start()
        self.ready = self._reply(start_timeout)
        if "ready" not in self.ready:
            self.close()
            raise OSError(f"{name} did not start: {self.ready}")

    def _popen(self, argv: list[str], env: dict[str, str]):
        """Start the server: a :class:`subprocess.Popen` (or an object with its ``pid``, ``stdin``,
        ``stdout``, ``poll``, ``wait`` and ``kill``) whose stdin and stdout are pipes to this process."""
        return subprocess.Popen(argv, env=env, cwd="/", stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL)

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
                continue
            if "pid" in msg:   # a new child: forget an earlier one's exit under the same (recycled) pid
                with self.cond:
                    self.codes.pop(int(msg["pid"]), None)
            self.replies.put(msg)
        self.replies.put({"error": "the server ended"})
        with self.cond:
            self.dead = True   # its children got their parent-death signal
            self.cond.notify_all()

    def _reply(self, timeout: float) -> dict:
        try:
            return self.replies.get(timeout=timeout)
        except queue.Empty:
            return {"error": "no answer"}

    def alive(self) -> bool:
        return not self.dead and self.proc.poll() is None

    def fork(self, request: dict) -> int | None:
        """Ask for a child; its pid, or None."""
        with self.request_lock:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write((json.dumps(request) + "\n").encode())
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


class Served:
    """The part of :class:`subprocess.Popen` the launcher and the runner use, for a server's child."""

    stdout = None

    def __init__(self, client: Client, pid: int):
        self.client, self.pid = client, pid

    @property
    def returncode(self) -> int | None:
        with self.client.cond:
            return self.client.codes.get(self.pid)

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        with self.client.cond:
            if not self.client.cond.wait_for(lambda: self.pid in self.client.codes or self.client.dead, timeout):
                raise subprocess.TimeoutExpired(["served"], timeout or 0.0)
            return self.client.codes.get(self.pid, -signal.SIGKILL)

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)
