"""Starts the ranks of one graded job and restarts them as torchrun would; standard library only,
except in zygote mode (``plan["zygote"]``, bubblewrap), where it imports torch once and starts every rank
by entering the rank's sandbox from a fork of itself (:mod:`dtrain_lab.grading.zygote`).

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


_zygote = None   # the zygote module, once torch is imported (see _load_zygote)


def zygote_module():
    """dtrain_lab/grading/zygote.py, loaded by its path: python -I leaves this file's folder off sys.path."""
    import importlib.util

    where = importlib.util.spec_from_file_location("zygote", os.path.join(os.path.dirname(__file__), "zygote.py"))
    zygote = importlib.util.module_from_spec(where)
    where.loader.exec_module(zygote)
    return zygote


def _load_zygote(plan, status):
    """Zygote mode (plan["zygote"], bubblewrap only): import torch once, here, and start every rank by
    entering its sandbox (dtrain_lab/grading/zygote.py). Nothing of the course is imported."""
    global _zygote
    z = plan.get("zygote")
    if not z or _zygote is not None:   # the supervisor server set it: torch is imported already
        return
    try:
        zygote = zygote_module()
        zygote.prepare()
        if not zygote.usable():
            raise OSError("no environment slot")
        sys.path[:] = list(z["sys_path"])
        import torch  # noqa: F401
        import torch.distributed  # noqa: F401
        _zygote = zygote
    except Exception as exc:  # noqa: BLE001
        _status(status, event="zygote", ok=False, error=f"{type(exc).__name__}: {exc}"[:500])


def _start_zygote(plan, rank, fill, status, attempt, r):
    """A rank through the zygote, or None after recording why not (the caller starts it as before;
    later ranks too)."""
    global _zygote
    z = rank["zygote"]
    spec = {"placeholder": [fill(a) for a in z["placeholder"]], "bwrap": z["bwrap"], "home": z["home"], "module": z["module"],
            "args": [fill(a) for a in z["args"]], "sys_path": plan["zygote"]["sys_path"], "rank": r}
    try:
        p = _zygote.start(spec, {k: fill(v) for k, v in z["env"].items()}, plan["limits"],
                          rank["stdout"].replace("{attempt}", str(attempt)),
                          rank["stderr"].replace("{attempt}", str(attempt)))
    except OSError as exc:
        _zygote = None
        _status(status, event="zygote", ok=False, rank=r, error=str(exc)[:500])
        return None
    _status(status, event="zygote", ok=True, rank=r, attempt=attempt)
    return p


def run(plan):
    status = plan["status"]
    world = plan["world"]
    _load_zygote(plan, status)
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
            p = _start_zygote(plan, rank, fill, status, attempt, r) if _zygote else None
            if p is None:
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


def main(plan_path: str) -> None:
    signal.signal(signal.SIGTERM, _on_term)
    with open(plan_path) as f:
        code = run(json.load(f))
    os._exit(code)


if __name__ == "__main__":
    main(sys.argv[1])
