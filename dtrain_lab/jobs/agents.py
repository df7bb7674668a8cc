"""Where a launch's torchrun agent comes from: a fresh ``python -m torch.distributed.run``, or a fork
of an agent server that has imported torch once (:mod:`dtrain_lab.jobs._agent_server`).

A process that launches many jobs (a notebook kernel, a test worker) pays ``import torch`` once, in
its server, instead of once per launch, and its ranks find ``torch._dynamo`` imported (it is what
the first ``torch.optim`` optimizer of every rank would import). The agent is the same torchrun with
the same command line; only the process it was forked from differs.

A launch uses a server only where that cannot change what the job does (:func:`served`): ranks
forked from their agent (``start="fork"``, the CPU default), one node, and an environment that
differs from the server's only in the course's own ``DTRAIN_*`` variables, which are read when the
program runs. torch reads some variables when it is imported (``TORCH_DISTRIBUTED_DEBUG``, the C++
log level, ``LOGLEVEL`` for torchrun's loggers): a launch that sets any other variable, or a process
whose own environment changed since its server started, gets a server of its own (at most
``MAX_SERVERS``), or else a fresh Python as before. ``DTRAIN_AGENT_SERVER=0`` turns servers off.

A server belongs to the process that started it: it ends when that process ends (its stdin
closes; running agents get ``SIGTERM``, as a fresh agent did from the kernel on the launcher's
death), or after ten idle minutes.
"""
from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

from dtrain_lab.sandbox.forkserve import Client, Served

MAX_SERVERS = 2
START_TIMEOUT_S = 120.0

_lock = threading.Lock()
_servers: dict[tuple, "_Server"] = {}


class _Server(Client):
    def __init__(self, env: dict[str, str]):
        super().__init__([sys.executable, "-m", "dtrain_lab.jobs._agent_server"], env, "dtrain-agent-server",
                         START_TIMEOUT_S)


def served(opts) -> bool:
    """Whether a launch with these :class:`~dtrain_lab.jobs.options.LaunchOptions` may use a server."""
    if os.environ.get("DTRAIN_AGENT_SERVER", "1").strip() == "0" or not sys.platform.startswith("linux"):
        return False
    return (opts.start == "fork" and opts.nnodes == 1 and not opts.debug
            and all(str(k).startswith("DTRAIN_") for k in (opts.env or {})))


def _key_env(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if not k.startswith("DTRAIN_")}


def start(cmd: list[str], env: dict[str, str], log: Path, report: Path) -> Served | None:
    """Fork ``cmd`` (``[python, "-m", "torch.distributed.run", ...]``) from the server for ``env``,
    starting the server first if needed, under the launch's init (which writes to ``report`` how many
    processes it killed at the end). None where no server can be had: the caller starts a fresh
    Python instead."""
    if cmd[1:3] != ["-m", "torch.distributed.run"]:
        return None
    base = _key_env(env)
    key = tuple(sorted(base.items()))
    with _lock:
        server = _servers.get(key)
        if server is not None and not server.alive():
            del _servers[key]
            server = None
        if server is None:
            for k, s in list(_servers.items()):
                if not s.alive():
                    del _servers[k]
            if len(_servers) >= MAX_SERVERS:
                return None
            try:
                server = _servers[key] = _Server(base)
            except OSError:
                return None
    pid = server.fork({"argv": cmd[3:], "env": env, "cwd": os.getcwd(), "log": str(log), "report": str(report)})
    return None if pid is None else Served(server, pid)


def shutdown() -> None:
    """End this process's servers now (each stops any agent it still runs, as when this process ends)."""
    with _lock:
        servers = list(_servers.values())
        _servers.clear()
    for s in servers:
        s.close()


def server_pids() -> list[int]:
    """The agent servers this process started and that still run (a test that counts the children
    of its process leaves them out)."""
    with _lock:
        return [s.proc.pid for s in _servers.values() if s.alive()]
