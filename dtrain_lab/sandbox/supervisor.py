"""Starts the ranks of one graded job and restarts them as torchrun would; standard library only.

It runs in a fork of the supervisor server (:mod:`dtrain_lab.sandbox.supervisor_server`, which
imported torch), inside the job's outer sandbox (the network namespace the ranks share, only loopback
in it) or, without a sandbox, directly. It is trusted code that runs no submission code itself: it
starts every rank (:mod:`dtrain_lab.sandbox.enter`: in its own inner sandbox, or a plain fork), with
the rank's resource limits and its stdout/stderr in the rank's log files, and records in
``status.jsonl`` when each attempt started and how each rank ended. Like torchrun, the first rank
that fails ends the attempt (the others are killed) and, if restarts are left, every rank starts
again with ``TORCHELASTIC_RESTART_COUNT`` one higher, on a fresh port.

Faults come from here too (``plan["faults"]``: ``{"attempt", "rank", "mark"}``): when the rank's
``marks`` file holds the line ``mark`` (the grader's code in the rank writes it, and then waits, at
the moment the fault belongs to: a training step, half-way through a checkpoint write), this process
SIGKILLs the rank from outside, and records it (``"event": "fault"``). The rank cannot stop that kill
or make it count as another attempt: a rank that never writes the mark is never killed, and the
verdict, which reads the faults and attempts from ``status.jsonl``, says that the fault never fired.

Bytes from outside (``plan["mode"] == "bwrap"``): the ranks share the outer sandbox's network
namespace, and only they and this process are in it, so the loopback counters of that namespace
(``/proc/self/net/dev``) count every byte they sent each other over TCP (``torch.distributed``, the
rendezvous store, a socket of their own), headers included. A rank cannot reset or lower them (it has
no capability over this namespace). This process reads them before the first rank starts and after
the last one ended, and records the difference (``"event": "wire"``). Without a sandbox the namespace
is the host's, shared with everything else, and nothing is recorded. What they do not see: files in
``/shared`` and Unix sockets.

It is a child subreaper (:mod:`dtrain_lab.sandbox.contain`): without a sandbox, whatever a rank
starts stays in its tree, and is killed with the attempt. The grader never trusts what the ranks say
about how they ended: exit codes and times come from here.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import time

from dtrain_lab.sandbox import contain, enter

_ranks: list = []


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


def _kill_all(running) -> None:
    for p in running:
        p.kill()
    for p in running:
        try:
            p.wait(timeout=5)
        except Exception:  # noqa: BLE001
            pass
    contain.kill_tree(os.getpid(), include_root=False)   # orphans this subreaper adopted
    contain.reap()


def _on_term(signum, frame):
    _kill_all(_ranks)
    os._exit(0)


def _start(plan: dict, r: int, attempt: int, port: int, cap: int):
    rank = plan["ranks"][r]

    def fill(text):
        return text.replace("{attempt}", str(attempt)).replace("{port}", str(port))

    spec = {"rank": r, "home": rank["home"], "module": rank["module"], "args": [fill(a) for a in rank["args"]],
            "sys_path": plan["sys_path"], "uid": rank.get("uid")}
    env = {k: fill(v) for k, v in rank["env"].items()}
    out, err = fill(rank["stdout"]), fill(rank["stderr"])
    if plan["mode"] == "bwrap":
        spec.update(placeholder=[fill(a) for a in rank["placeholder"]], bwrap=plan["bwrap"])
        return enter.start(spec, env, plan["limits"], out, err, cap)
    return enter.start_plain(spec, env, plan["limits"], out, err)


MARKS_CAP = 4096   # bytes of a rank's marks file read (the rank writes it: hostile input)


def _marked(path: str, mark: str) -> bool:
    try:
        with open(path, "rb") as f:
            return mark.encode() in f.read(MARKS_CAP).split(b"\n")
    except OSError:
        return False


def _fire(plan: dict, attempt: int, procs: dict, pending: list, status) -> None:
    """Kill each rank whose fault of this attempt is due (its mark is there); drop the fired ones."""
    for fault in list(pending):
        r = fault["rank"]
        path = plan["ranks"][r]["marks"].replace("{attempt}", str(attempt))
        if procs[r].returncode is None and _marked(path, fault["mark"]):
            procs[r].kill()
            pending.remove(fault)
            _status(status, event="fault", attempt=attempt, rank=r, mark=fault["mark"])


def loopback() -> tuple[int, int] | None:
    """``(bytes, packets)`` sent on ``lo`` in this process's network namespace so far, or None."""
    try:
        with open("/proc/self/net/dev") as f:
            for line in f:
                name, _, counters = line.partition(":")
                if name.strip() == "lo":
                    fields = counters.split()
                    return int(fields[8]), int(fields[9])
    except (OSError, ValueError, IndexError):
        pass
    return None


def _end(status, ok: bool, wire0) -> None:
    wire1 = loopback() if wire0 is not None else None
    if wire1 is not None:
        _status(status, event="wire", bytes=wire1[0] - wire0[0], packets=wire1[1] - wire0[1])
    _status(status, event="end", ok=ok)


def _hold(path: str, seconds: float = 30.0) -> None:
    """Wait until the grader has put this process in the job's cgroup (it then creates ``path``):
    every rank started after that is born inside."""
    deadline = time.monotonic() + seconds
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.005)


def run(plan: dict) -> int:
    if plan.get("hold"):
        _hold(plan["hold"])
    status = plan["status"]
    world = plan["world"]
    cap = enter.last_cap()
    wire0 = loopback() if plan["mode"] == "bwrap" else None
    for attempt in range(plan["max_restarts"] + 1):
        port = plan.get("port_base", 0) + attempt if plan.get("port_base") else _free_port()
        _status(status, event="attempt", attempt=attempt, port=port)
        procs = {}
        for r in range(world):
            try:
                procs[r] = _start(plan, r, attempt, port, cap)
            except OSError as exc:   # the grader's machine, not the submission: the grade is an error
                _status(status, event="start_failed", attempt=attempt, rank=r, error=f"{type(exc).__name__}: {exc}"[:500])
                _kill_all(list(procs.values()))
                _end(status, False, wire0)
                return 1
            _ranks.append(procs[r])
            _status(status, event="started", attempt=attempt, rank=r)
        failed = False
        running = dict(procs)
        pending = [f for f in plan.get("faults", ()) if f["attempt"] == attempt and f["rank"] in procs]
        while running:
            if pending:
                _fire(plan, attempt, procs, pending, status)
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
            contain.reap(keep={p.pid for p in running.values()})
            time.sleep(0.02)
        for r, p in running.items():
            p.kill()
            p.wait()
            _status(status, event="killed", attempt=attempt, rank=r)
        contain.kill_tree(os.getpid(), include_root=False)   # nothing of this attempt outlives it
        contain.reap()
        if failed:
            if attempt < plan["max_restarts"]:
                continue
            _end(status, False, wire0)
            return 1
        _end(status, True, wire0)
        return 0
    return 1


def main(plan_path: str) -> None:
    contain.subreaper(True)
    signal.signal(signal.SIGTERM, _on_term)
    with open(plan_path) as f:
        code = run(json.load(f))
    os._exit(code)
