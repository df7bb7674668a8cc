"""Forks torchrun agents from one Python that has imported torch already; stdlib and torch only.

``python -m torch.distributed.run`` spends most of its CPU on ``import torch`` (about 1.4 s on this
course's 2-core machine), and a rank that builds its first ``torch.optim`` optimizer imports
``torch._dynamo`` (about 1.3 s more). :mod:`dtrain_lab.jobs.agents` starts this program once per
launching process (a notebook kernel, a test worker) and asks it for every launch that can use it.
It imports both once; each launch's agent is a fork of it that runs ``torch.distributed.run`` exactly
as ``python -m torch.distributed.run ARGS`` would (``runpy._run_module_as_main``: the same
``__main__``, ``sys.argv`` and ``sys.path[0]``), in its own session, with the launch's environment,
working folder and output file, and default signal handlers. torchrun then forks the ranks from that
agent (``--start-method fork``), so they have torch and ``torch._dynamo`` imported too.

Protocol, one JSON object per line: the client writes ``{"argv", "env", "cwd", "log"}`` on stdin; this
program answers ``{"pid": N}`` (or ``{"error": text}``) and, when that agent ends,
``{"exit": N, "code": C}`` (``C`` as :attr:`subprocess.Popen.returncode`: ``-S`` if killed by signal S).

It ends when its stdin closes (the launching process ended: every agent still running gets SIGTERM,
what the kernel sent before when a launcher died; see ``_procs.set_parent_death_signal``), or after
``IDLE_S`` seconds without an agent. Every agent also gets ``SIGTERM`` if this process dies.
"""
import ctypes
import json
import os
import runpy
import select
import signal
import sys
import traceback

IDLE_S = 600.0
SLOT = "DTRAIN_AGENT_ENV"   # the server's last variable: room for one launch's DTRAIN_* variables
SLOT_BYTES = 4096
_slot = [0, 0]              # address and size of "SLOT=..." in this process's original environment block
_BASE_PATH = sys.path[1:]   # sys.path[0] is this file's folder; an agent gets its own working folder there


def _write(obj) -> None:
    os.write(1, (json.dumps(obj) + "\n").encode())


def _find_slot() -> None:
    """Where ``SLOT=...`` lies in the environment block the kernel shows as ``/proc/PID/environ``."""
    libc = ctypes.CDLL(None)
    libc.getenv.restype = ctypes.c_void_p
    value = libc.getenv(SLOT.encode())
    if value:
        size = len(SLOT) + 1 + len(os.environ.get(SLOT, ""))
        _slot[:] = [value - len(SLOT) - 1, size]


def _show_environment(env: dict) -> None:
    """Make ``/proc/PID/environ`` of this agent (and of every process it forks) list the launch's
    ``DTRAIN_*`` variables, as it would for a fresh ``python``: that file shows the block a process
    was exec'd with, and the launcher finds every process of a job (a double-forked daemon too) by
    ``DTRAIN_JOB_ID`` there. The other variables are the server's, which equal the launch's (the
    client chooses the server by them). The slot is overwritten in place, padded to its size."""
    address, size = _slot
    block = "".join(f"{k}={v}\0" for k, v in env.items() if k.startswith("DTRAIN_")).encode()
    pad = b"DTRAIN_PAD="
    if not address or len(block) + len(pad) > size:
        raise OSError("the launch's DTRAIN_* variables do not fit the agent server's slot")
    ctypes.memmove(address, block + pad + b"x" * (size - len(block) - len(pad)), size)


def _agent(request: dict, server: int) -> None:
    """In the forked child: become ``python -m torch.distributed.run ARGV``. Never returns."""
    code = 1
    try:
        os.setsid()
        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
        except OSError:
            pass
        if os.getppid() != server:
            os._exit(1)
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.closerange(3, 65536)   # the server's pipes are not the agent's
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        _show_environment(request["env"])
        sys.path[:] = [os.getcwd()] + _BASE_PATH
        sys.modules.pop("torch.distributed.run", None)   # runpy runs it afresh as __main__ (its imports stay)
        sys.argv = ["torchrun", *request["argv"]]   # argv[0] becomes run.py's path, as with python -m
        runpy._run_module_as_main("torch.distributed.run", alter_argv=True)  # type: ignore[attr-defined]
        code = 0
    except SystemExit as exc:
        if exc.code is None:
            code = 0
        elif isinstance(exc.code, int):
            code = exc.code
        else:
            print(exc.code, file=sys.stderr)
            code = 1
    except BaseException:  # noqa: BLE001 - printed as at top level, like torchrun's own traceback
        try:
            sys.excepthook(*sys.exc_info())
        except BaseException:  # noqa: BLE001
            traceback.print_exc()
        code = 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001
                pass
        os._exit(code & 0xFF)


def _stop_all(agents: set) -> None:
    for pid in agents:
        try:
            os.killpg(pid, signal.SIGTERM)   # torchrun stops its workers on SIGTERM
        except OSError:
            pass


def main() -> None:
    import torch  # noqa: F401
    import torch._dynamo  # noqa: F401 - what a rank's first optimizer would import
    import torch.distributed.run  # noqa: F401

    _find_slot()
    server = os.getpid()
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.signal(signal.SIGTERM, lambda *_: (_stop_all(agents), os._exit(0)))
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # Ctrl-C in a terminal is the launcher's to handle
    agents: set = set()
    pending = b""
    idle = 0.0
    _write({"ready": server})
    while True:
        ready, _, _ = select.select([0, wake_r], [], [], 1.0)
        if wake_r in ready:
            try:
                while os.read(wake_r, 512):
                    pass
            except BlockingIOError:
                pass
        while agents:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            agents.discard(pid)
            _write({"exit": pid, "code": os.waitstatus_to_exitcode(status)})
        if 0 in ready:
            data = os.read(0, 1 << 16)
            if not data:   # the launching process is gone
                _stop_all(agents)
                os._exit(0)
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
                    _agent(request, server)
                agents.add(pid)
                _write({"pid": pid})
        idle = 0.0 if agents or ready else idle + 1.0
        if idle >= IDLE_S:
            os._exit(0)


if __name__ == "__main__":
    main()
