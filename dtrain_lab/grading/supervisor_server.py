"""Forks the supervisors of graded jobs from one Python that has imported torch; stdlib and torch only.

Run by the grader (:mod:`dtrain_lab.grading.supervisors`) as ``python -I -S supervisor_server.py
SYS_PATH_JSON``, with one environment variable (:data:`zygote.SLOT`). It imports torch once, and then
for every job the grader starts (the job's outer sandbox built by bubblewrap around a placeholder)
it forks a child that enters that sandbox (:func:`zygote.enter_outer`) and runs
:func:`supervisor.main` on the job's plan there: the supervisor a fresh ``python supervisor.py PLAN``
would have been, with torch imported for its ranks (:mod:`dtrain_lab.grading.zygote`). It reads no
plan itself: its memory holds torch and nothing of any job.

Protocol, one JSON object per line: ``{"plan", "outer", "log"}`` on stdin; ``{"pid": N}`` (or
``{"error": text}``) then ``{"exit": N, "code": C}`` on stdout. It ends when stdin closes (the
grader ended: every supervisor still running is killed, and its ranks with it) or after ``IDLE_S``
idle seconds.
"""
import ctypes
import importlib.util
import json
import os
import select
import signal
import sys

IDLE_S = 600.0
HERE = os.path.dirname(os.path.abspath(__file__))


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, os.path.join(HERE, name + ".py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _write(obj) -> None:
    os.write(1, (json.dumps(obj) + "\n").encode())


def _child(request: dict, server: int, zygote, supervisor) -> None:
    """The forked child: enter the outer sandbox, become the supervisor. Never returns."""
    code = 125
    try:
        os.setsid()
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)   # PR_SET_PDEATHSIG
        if os.getppid() != server:
            os._exit(125)
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_DFL)
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.closerange(3, 1 << 16)
        if zygote.enter_outer(int(request["outer"])):   # a PID namespace of its own: the supervisor is a fork
            pid = os.fork()
            if pid:
                status = os.waitpid(pid, 0)[1]
                code = os.waitstatus_to_exitcode(status)
                os._exit(128 - code if code < 0 else code & 0xFF)
        supervisor._zygote = zygote
        supervisor.main(request["plan"])
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException as exc:  # noqa: BLE001 - in the job's supervisor.log
        try:
            os.write(2, f"supervisor server: {type(exc).__name__}: {exc}\n".encode(errors="replace"))
        except OSError:
            pass
    os._exit(code & 0xFF)


def main() -> None:
    zygote = _load("zygote")
    zygote.prepare()
    supervisor = _load("supervisor")
    sys.path[:] = json.loads(sys.argv[1])
    import torch  # noqa: F401
    import torch.distributed  # noqa: F401

    server = os.getpid()
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    children: set = set()

    def stop_all(*_):
        for pid in children:
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                pass
        os._exit(0)

    signal.signal(signal.SIGTERM, stop_all)
    pending, idle = b"", 0.0
    _write({"ready": server, "usable": zygote.usable()})
    while True:
        ready, _, _ = select.select([0, wake_r], [], [], 1.0)
        if wake_r in ready:
            try:
                while os.read(wake_r, 512):
                    pass
            except BlockingIOError:
                pass
        while children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            children.discard(pid)
            _write({"exit": pid, "code": os.waitstatus_to_exitcode(status)})
        if 0 in ready:
            data = os.read(0, 1 << 16)
            if not data:   # the grader is gone
                stop_all()
            pending += data
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                try:
                    request = json.loads(line)
                    pid = os.fork()
                except Exception as exc:  # noqa: BLE001
                    _write({"error": f"{type(exc).__name__}: {exc}"})
                    continue
                if pid == 0:
                    _child(request, server, zygote, supervisor)
                children.add(pid)
                _write({"pid": pid})
        idle = 0.0 if children or ready else idle + 1.0
        if idle >= IDLE_S:
            os._exit(0)


if __name__ == "__main__":
    main()
