"""Where a launch's torchrun agent comes from: a fresh ``python -m torch.distributed.run``, or a fork
of an agent server that has imported torch once (:mod:`dtrain_lab.jobs._agent_server`).

A process that launches many jobs (a notebook kernel, a test worker) pays ``import torch`` once, in
its server, instead of once per launch, and its ranks find ``torch._dynamo`` imported (it is what
the first ``torch.optim`` optimizer of every rank would import). The agent is the same torchrun with
the same command line; only the process it was forked from differs.

A launch uses a server only where that cannot change what the job does (:func:`served`): ranks
forked from their agent (``start="fork"``, the CPU default) and one node. torch reads some variables
once, when it is imported (``TORCH_DISTRIBUTED_DEBUG``, the C++ log level, ``LOGLEVEL`` for
torchrun's loggers), so a server serves one environment: the launch's own, but for the course's
``DTRAIN_*`` variables, which are read when the program runs. A launch whose environment differs
(it sets a variable, or ``debug=``, or a notebook cell changed ``os.environ``) gets a server started
with that environment. A process keeps at most ``MAX_SERVERS``: for a new one, the one used longest
ago that runs no launch is closed; where every one is busy, the launch gets a fresh Python as
before. ``DTRAIN_AGENT_SERVER=0`` turns servers off.

A server belongs to the process that started it: it ends when that process ends (its stdin
closes; running agents get ``SIGTERM``, as a fresh agent did from the kernel on the launcher's
death), or after ten idle minutes.
"""
from __future__ import annotations

import os
import sys
import threading
import time
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
        self.used = time.monotonic()
        self.launched: set[int] = set()

    def busy(self) -> bool:
        """Whether a launch it forked still runs."""
        with self.cond:
            return bool(self.launched - set(self.codes))


def served(opts) -> bool:
    """Whether a launch with these :class:`~dtrain_lab.jobs.options.LaunchOptions` may use a server."""
    if os.environ.get("DTRAIN_AGENT_SERVER", "1").strip() == "0" or not sys.platform.startswith("linux"):
        return False
    return opts.start == "fork" and opts.nnodes == 1


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
            if len(_servers) >= MAX_SERVERS:   # room for this environment's: the idle one used longest ago goes
                idle = [k for k, s in _servers.items() if not s.busy()]
                if not idle:
                    return None
                _servers.pop(min(idle, key=lambda k: _servers[k].used)).close()
            try:
                server = _servers[key] = _Server(base)
            except OSError:
                return None
        server.used = time.monotonic()
        pid = server.fork({"argv": cmd[3:], "env": env, "cwd": os.getcwd(), "log": str(log), "report": str(report)})
        if pid is not None:
            server.launched.add(pid)
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
