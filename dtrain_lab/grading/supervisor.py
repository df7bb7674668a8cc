"""Starts the ranks of one graded job and restarts them as torchrun would; standard library only.

Run by the grader as ``python -I -S supervisor.py PLAN.json``, inside the job's outer sandbox (the
network namespace the ranks share, only loopback in it) or, with ``--no-sandbox``, directly. It is
trusted code that runs no submission code itself: it starts every rank's command (its own inner
sandbox), with the rank's resource limits, its stdout/stderr into the rank's log files, and records
in ``status.jsonl`` when each attempt started and how each rank ended. Like torchrun, the first rank
that fails ends the attempt (the others are killed) and, if restarts are left, every rank starts
again with ``TORCHELASTIC_RESTART_COUNT`` one higher, on a fresh port.

The grader never trusts what the ranks say about how they ended: exit codes and times come from here.
"""
import json
import os
import resource
import signal
import socket
import subprocess
import sys
import time

LIMITS = {"AS": resource.RLIMIT_AS, "CPU": resource.RLIMIT_CPU, "FSIZE": resource.RLIMIT_FSIZE,
          "NPROC": resource.RLIMIT_NPROC, "CORE": resource.RLIMIT_CORE, "NOFILE": resource.RLIMIT_NOFILE}

_children = []


def _status(path, **item):
    item["t"] = time.time()
    with open(path, "a") as f:
        f.write(json.dumps(item) + "\n")


def _free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def _preexec(limits, user):
    def apply():
        os.setsid()
        for name, value in limits.items():
            try:
                resource.setrlimit(LIMITS[name], (value, value))
            except (ValueError, OSError):
                pass
        if user is not None:
            os.setgroups([])
            os.setresgid(user, user, user)
            os.setresuid(user, user, user)
    return apply


def _kill_all():
    for p in _children:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except OSError:
                pass
            try:
                p.kill()
            except OSError:
                pass
    for p in _children:
        try:
            p.wait(timeout=5)
        except Exception:  # noqa: BLE001
            pass


def _on_term(signum, frame):
    _kill_all()
    os._exit(0)


def run(plan):
    status = plan["status"]
    world = plan["world"]
    for attempt in range(plan["max_restarts"] + 1):
        port = plan.get("port_base", 0) + attempt if plan.get("port_base") else _free_port()
        _status(status, event="attempt", attempt=attempt, port=port)
        procs = {}
        for r in range(world):
            rank = plan["ranks"][r]
            def fill(text, attempt=attempt, port=port):
                return text.replace("{attempt}", str(attempt)).replace("{port}", str(port))

            env = {k: fill(v) for k, v in rank["env"].items()}
            argv = [fill(a) for a in rank["argv"]]
            out = open(rank["stdout"].replace("{attempt}", str(attempt)), "ab")
            err = open(rank["stderr"].replace("{attempt}", str(attempt)), "ab")
            p = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                 close_fds=True, preexec_fn=_preexec(plan["limits"], plan.get("user")))
            out.close()
            err.close()
            _children.append(p)
            procs[r] = p
        failed = False
        running = dict(procs)
        while running:
            for r, p in list(running.items()):
                code = p.poll()
                if code is None:
                    continue
                del running[r]
                _status(status, event="exit", attempt=attempt, rank=r, code=code)
                if code != 0:
                    failed = True
            if failed:
                break
            time.sleep(0.02)
        if failed:
            for r, p in running.items():
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except OSError:
                    pass
                p.kill()
                p.wait()
                _status(status, event="killed", attempt=attempt, rank=r)
            if attempt < plan["max_restarts"]:
                continue
            _status(status, event="end", ok=False)
            return 1
        _status(status, event="end", ok=True)
        return 0
    return 1


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, _on_term)
    with open(sys.argv[1]) as f:
        code = run(json.load(f))
    os._exit(code)
