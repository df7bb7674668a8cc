"""Notebook kernels (and their agent servers) for the tests, forked from a Python that has imported
torch and ipykernel once.

nbval starts one kernel per notebook, ``python -m ipykernel_launcher -f CONNECTION_FILE``; the first
thing every course notebook does is import torch, and a kernel that launches a job starts the
launcher's agent server (:mod:`dtrain_lab.jobs.agents`), ``python -m dtrain_lab.jobs._agent_server``,
which imports torch, ``torch._dynamo`` and ``torch.distributed.run`` again. That is about 2 + 2.7
CPU-seconds per notebook, for about 64 notebooks per ``make test``, on a 2-core machine where the
suite is CPU-bound. So each test process (each xdist worker) starts one *zygote*: a Python that
imports ipykernel, numpy, torch, ``torch._dynamo`` and ``torch.distributed.run`` (nothing of the
course but its standard-library process code) and then forks

- a kernel per nbval kernel start: the same ipykernel with the same ``-f`` connection file, run as
  ``python -m ipykernel_launcher`` runs it (:func:`dtrain_lab.sandbox.child.run_main`), with the
  same environment, working folder, standard streams and a session of its own;
- an agent server per server a kernel starts: the same ``-m dtrain_lab.jobs._agent_server`` with the
  same environment and pipes (``forkserve.Client._popen`` is its one seam). It ends when the kernel
  ends, as before (its stdin closes).

Where a fork could change what a notebook does, the process is started as before: the request's
environment differs from the zygote's in a variable other than Jupyter's own and the course's
``DTRAIN_*`` (torch and OpenMP read some variables once, when they are imported); the zygote has more
threads than when it became ready (a fork keeps only the calling one); or there is no zygote
(``DTRAIN_TEST_KERNEL_ZYGOTE=0``, or it did not start). The difference that stays: a forked kernel
finds torch, numpy and ``torch._dynamo`` imported before its first cell.

What jupyter_client starts is a small client (this file with ``-I -S``, standard library only). It
hands its stdin/stdout/stderr to the zygote over a UNIX socket, relays every signal it gets to the
kernel's process group (the kernel's own session: an interrupt reaches what the kernel started, as
jupyter_client's ``killpg`` does for a kernel it started itself), and ends when the kernel ends. When
the client is killed (jupyter_client's last resort), the kernel's process group is killed with it.

Tests only: the course's own kernels (JupyterLab, ``dtrain-lab`` commands) never use it.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import sys

_RELAYED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
_OWN_ENV = ("JPY_", "PYDEVD_", "DTRAIN_")   # set per kernel by jupyter_client, or read by the course when it runs
# variables no module the zygote imported reads when it is imported: the terminal's size (the test
# process sets it for a while around a kernel's start), pytest's current test, what ipykernel sets for
# its children (pagers, colours, matplotlib's backend: matplotlib is not imported here), and
# PYTHONPATH (a forked server's sys.path is built from it, as a fresh Python's is)
_HARMLESS = ("COLUMNS", "LINES", "PYTEST_CURRENT_TEST", "CLICOLOR", "CLICOLOR_FORCE", "FORCE_COLOR", "GIT_PAGER",
             "PAGER", "TERM", "MPLBACKEND", "PYTHONPATH")
ENV_SOCKET = "DTRAIN_TEST_KERNEL_SOCKET"


def _send(sock: socket.socket, request: dict, fds: list[int]) -> dict:
    data = json.dumps(request).encode()
    socket.send_fds(sock, [len(data).to_bytes(8, "big") + data], fds)
    reply = b""
    while not reply.endswith(b"\n"):
        chunk = sock.recv(4096)
        if not chunk:
            raise OSError("the zygote closed the connection")
        reply += chunk
    return json.loads(reply)


# ------------------------------------------------------------------ the client (what jupyter_client starts)
def client(argv: list[str]) -> None:
    import ctypes

    parent = os.getppid()
    ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)   # PR_SET_PDEATHSIG: it dies with jupyter_client's process
    if os.getppid() != parent:
        os._exit(1)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(os.environ.get(ENV_SOCKET, ""))
        answer = _send(sock, {"kind": "kernel", "argv": argv, "env": dict(os.environ), "cwd": os.getcwd()},
                       [0, 1, 2])
    except (OSError, ValueError):
        answer = {}
    if "pid" not in answer:   # no zygote, or one that said no: the kernel jupyter_client would have started
        sock.close()
        os.execv(sys.executable, [sys.executable, "-m", "ipykernel_launcher", *argv])

    def relay(signum, _frame):
        try:
            sock.sendall(b"%d\n" % signum)
        except OSError:
            pass

    for s in _RELAYED:
        signal.signal(s, relay)
    while True:   # until the kernel ends (its end of the socket closes)
        try:
            if not sock.recv(4096):
                break
        except InterruptedError:
            continue
        except OSError:
            break
    os._exit(0)


# ------------------------------------------------------------------ in a forked kernel
def _watch(conn: socket.socket) -> None:
    """Relay the client's signals to this kernel's process group; kill the group when the client ends."""
    import threading

    def run():
        pending = b""
        while True:
            try:
                data = conn.recv(4096)
            except OSError:
                data = b""
            if not data:
                os.killpg(os.getpgrp(), signal.SIGKILL)
                return
            pending += data
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                try:
                    os.killpg(os.getpgrp(), int(line))
                except (ValueError, OSError):
                    pass

    threading.Thread(target=run, daemon=True, name="zygote-client").start()


class _ForkedServer:
    """The part of :class:`subprocess.Popen` ``forkserve.Client`` uses, for a server the zygote forked
    (not this process's child: its end is seen through a pidfd)."""

    def __init__(self, pid: int, stdin, stdout):
        self.pid, self.stdin, self.stdout = pid, stdin, stdout
        self.returncode = None
        self._pidfd = os.pidfd_open(pid)

    def wait(self, timeout: float | None = None) -> int:
        import select
        import subprocess

        if self.returncode is None:
            if not select.select([self._pidfd], [], [], timeout)[0]:
                raise subprocess.TimeoutExpired(["agent server"], timeout or 0.0)
            self.returncode = 0   # its status went to the zygote, which reaped it
        return self.returncode

    def poll(self) -> int | None:
        try:
            return self.wait(0)
        except Exception:  # noqa: BLE001 - subprocess.TimeoutExpired: still running
            return None

    def kill(self) -> None:
        if self.returncode is None:
            try:
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _agent_servers_from(path: str) -> None:
    """This kernel's agent servers come from the zygote at ``path`` (the one seam:
    ``forkserve.Client._popen``), or are started as before where it says no."""
    from dtrain_lab.jobs import agents

    plain = agents._Server._popen

    def _popen(self, argv, env):
        if argv[1:] != ["-m", "dtrain_lab.jobs._agent_server"]:
            return plain(self, argv, env)
        in_r, in_w = os.pipe()
        out_r, out_w = os.pipe()
        null = os.open(os.devnull, os.O_WRONLY)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(path)
            answer = _send(sock, {"kind": "agent-server", "env": env}, [in_r, out_w, null])
        except (OSError, ValueError):
            answer = {}
        finally:
            sock.close()
            for fd in (in_r, out_w, null):
                os.close(fd)
        if "pid" not in answer:
            os.close(in_w)
            os.close(out_r)
            return plain(self, argv, env)
        return _ForkedServer(int(answer["pid"]), open(in_w, "wb"), open(out_r, "rb"))

    agents._Server._popen = _popen


# ------------------------------------------------------------------ the zygote
def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def _recv(conn: socket.socket):
    data, fds, _flags, _addr = socket.recv_fds(conn, 1 << 20, 3)
    if len(fds) != 3 or len(data) < 8:
        for fd in fds:
            os.close(fd)
        raise OSError("a malformed request")
    size = int.from_bytes(data[:8], "big")
    data = data[8:]
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            raise OSError("a short request")
        data += chunk
    return json.loads(data), fds


def _own(env: dict) -> dict:
    return {k: v for k, v in env.items() if not k.startswith(_OWN_ENV) and k not in _HARMLESS}


def _path(env: dict, base_path: list[str]) -> list[str]:
    """``sys.path`` after its first entry for a fresh Python with ``env``: PYTHONPATH, then the rest. A
    ``sitecustomize`` on that PYTHONPATH is imported, as ``site`` does at a fresh Python's start."""
    extra = [os.path.abspath(p) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if any(os.path.exists(os.path.join(p, "sitecustomize.py")) for p in extra):
        sys.path[:] = [*extra, *base_path]
        sys.modules.pop("sitecustomize", None)
        try:
            import sitecustomize  # noqa: F401
        except Exception:  # noqa: BLE001 - site prints it and goes on
            import traceback

            traceback.print_exc()
    return [*extra, *base_path]


def serve(path: str) -> None:
    """Fork a kernel or an agent server per request until stdin closes (the test process that started
    it ended). Never returns."""
    import select

    own_pp = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    # without this file's folder (a fresh ``python -m`` has the working folder there) or PYTHONPATH
    base_path = sys.path[1 + len(own_pp):]
    base_env = _own(os.environ)   # before torch: importing torch._dynamo sets TORCHINDUCTOR_CACHE_DIR
    # what ipykernel.kernelapp imports, but not that module itself: it reads JPY_PARENT_PID (which jupyter_client
    # sets per kernel) when it is imported, so each kernel imports it afresh, as a fresh kernel does
    import ipykernel.connect  # noqa: F401
    import ipykernel.heartbeat  # noqa: F401
    import ipykernel.iostream  # noqa: F401
    import ipykernel.ipkernel  # noqa: F401
    import ipykernel.parentpoller  # noqa: F401
    import ipykernel.zmqshell  # noqa: F401
    import numpy  # noqa: F401
    import torch  # noqa: F401
    import torch._dynamo  # noqa: F401
    import torch.distributed.run  # noqa: F401

    import dtrain_lab.jobs.agents  # noqa: F401 - standard library only
    from dtrain_lab.sandbox import child

    assert "ipykernel.kernelapp" not in sys.modules
    threads = _threads()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(16)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    os.write(1, b"ready\n")
    while True:
        readable, _, _ = select.select([0, listener], [], [], 1.0)
        while True:   # reap what ended
            try:
                pid, _status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
        if 0 in readable and not os.read(0, 4096):
            listener.close()
            os.unlink(path)
            os._exit(0)
        if listener not in readable:
            continue
        conn, _ = listener.accept()
        try:
            request, fds = _recv(conn)
        except (OSError, ValueError):
            conn.close()
            continue
        env = _own(request["env"])
        why = "threads" if _threads() > threads else ""   # fewer: OpenBLAS stops its own before a fork
        if env != base_env:
            why = "environment: " + " ".join(sorted(f"{k}={env.get(k)!r}/{base_env.get(k)!r}"
                                                    for k in env.keys() | base_env.keys()
                                                    if env.get(k) != base_env.get(k)))[:300]
        if why:
            print(f"kernel zygote: a {request.get('kind')} started afresh ({why})", file=sys.stderr, flush=True)
            conn.sendall(json.dumps({"no": why}).encode() + b"\n")
            conn.close()
            for fd in fds:
                os.close(fd)
            continue
        pid = os.fork()
        if pid == 0:
            listener.close()
            conn.sendall(json.dumps({"pid": os.getpid()}).encode() + b"\n")
            if request["kind"] == "kernel":
                child.reset(stdio=tuple(fds), env=request["env"], cwd=request["cwd"], new_session=True,
                            keep_fds=(conn.fileno(),))
                tail = _path(request["env"], base_path)
                _watch(conn)
                _agent_servers_from(path)
                child.run_main(["-m", "ipykernel_launcher", *request["argv"]], tail)
            conn.close()
            child.reset(stdio=tuple(fds), env=request["env"], cwd="/")
            child.run_main(["-m", "dtrain_lab.jobs._agent_server"], _path(request["env"], base_path))
        conn.close()
        for fd in fds:
            os.close(fd)


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"]:
        serve(sys.argv[2])
    else:
        client(sys.argv[1:])
