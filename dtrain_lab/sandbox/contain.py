"""Keep every process of a job in one tree, and kill that tree: the course's containment primitive.
Standard library only; Linux (elsewhere the tree is what the process group and the children give).

A job (a launch, a graded job) has one **init**: a process that is a *child subreaper*
(``prctl(PR_SET_CHILD_SUBREAPER)``), starts the job's first process and waits for it. The kernel
re-parents an orphan to its nearest living subreaper ancestor, so while the init lives every process
the job ever started is its descendant: a double-forked, ``setsid`` daemon included, whatever its
environment or process group says. :func:`kill_tree` kills them all, from outside; the init also kills
what is left by itself once the job's first process has ended (:func:`init`), so nothing outlives it.

This needs no privilege, no namespace and no cgroup, so it works the same for a learner's launch, a
normal user's self-check and the grader. It is containment, not isolation: a process of the job could
kill the init (it runs as the same user) and then escape. Where the code is not trusted it also runs
in a bubblewrap sandbox (:mod:`dtrain_lab.sandbox.bwrap`), whose PID namespaces end with it. A
per-job cgroup (``cgroup.kill``) would be a drop-in replacement for :func:`kill_tree` where cgroup v2
is delegated to the user.

Run as a program (``python -I -S -c … dtrain_lab.sandbox.contain -- CMD ARGS``, see
:func:`dtrain_lab.sandbox.python_m`) it is the init of ``CMD``.
"""
from __future__ import annotations

import os
import signal
import sys
import time
from typing import Callable

PR_SET_CHILD_SUBREAPER = 36
# what an init passes on to the job's first process (torchrun stops its workers on SIGTERM)
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR2)


def subreaper(on: bool = True) -> bool:
    """Make this process a child subreaper (or stop it being one); False where the kernel refused."""
    from dtrain_lab.sandbox.child import prctl

    return sys.platform.startswith("linux") and prctl(PR_SET_CHILD_SUBREAPER, int(on)) == 0


def _children(pid: int) -> list[int]:
    out = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out += [int(c) for c in f.read().split()]
        except OSError:
            continue
    return out


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0].decode()
    except (OSError, IndexError):
        return "X"


def descendants(pid: int, live: bool = True) -> list[int]:
    """Every descendant of ``pid`` (children first, breadth first); ``live``: zombies left out."""
    seen, order, queue = {pid}, [], [pid]
    while queue:
        for child in _children(queue.pop(0)):
            if child not in seen:
                seen.add(child)
                order.append(child)
                queue.append(child)
    if live:
        order = [p for p in order if _state(p) not in ("Z", "X")]
    return order


def kill_tree(pid: int, include_root: bool = True, rounds: int = 50) -> int:
    """SIGKILL every live descendant of ``pid`` until none is left (a process can fork while a round
    runs; its child stays in the tree, and the next round finds it), then ``pid`` itself if
    ``include_root``. Returns how many processes were killed."""
    killed: set[int] = set()
    for _ in range(rounds):
        victims = descendants(pid)
        if not victims:
            break
        for p in victims:
            try:
                os.kill(p, signal.SIGKILL)
                killed.add(p)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.005)
    if include_root and _state(pid) not in ("Z", "X"):
        try:
            os.kill(pid, signal.SIGKILL)
            killed.add(pid)
        except (ProcessLookupError, PermissionError):
            pass
    return len(killed)


def reap(keep: set | frozenset = frozenset()) -> None:
    """Collect the exit status of this process's ended children that are not in ``keep`` (orphans a
    subreaper adopted): a subreaper that never does fills the process table with zombies."""
    for child in _children(os.getpid()):
        if child not in keep and _state(child) == "Z":
            try:
                os.waitpid(child, os.WNOHANG)
            except ChildProcessError:
                pass


def status_code(status: int) -> int:
    """A wait status as a shell reports it: the exit code, or ``128 + N`` for signal N."""
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code


def init(start: Callable[[], int], forward: tuple = FORWARDED, report: str | None = None) -> None:
    """Be a job's init: a subreaper that starts the job's first process (``start()`` forks it and
    returns its pid), passes ``forward`` signals on to it, reaps every orphan, and once that process
    has ended kills whatever of the job is left (how many: written to the file ``report``, if
    given); then ends as that process ended (the same exit code, or the same signal). Never returns."""
    from dtrain_lab.sandbox import child

    subreaper(True)
    main = start()
    child.pass_signals(main, forward)
    status = None
    while status is None:
        try:
            pid, st = os.waitpid(-1, 0)
        except ChildProcessError:
            break
        except InterruptedError:
            continue
        if pid == main:
            status = st
    left = kill_tree(os.getpid(), include_root=False)
    if report:
        try:
            with open(report, "w") as f:
                f.write(str(left))
        except OSError:
            pass
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            break
        except InterruptedError:
            continue
    child.end_like(256 if status is None else status)   # (256: the wait status of exit code 1)


def _exec(argv: list[str]) -> int:
    pid = os.fork()
    if pid == 0:
        try:
            for sig in FORWARDED:
                signal.signal(sig, signal.SIG_DFL)
            os.execvp(argv[0], argv)
        except OSError as exc:
            os.write(2, f"dtrain_lab.sandbox.contain: {argv[0]}: {exc.strerror}\n".encode())
        os._exit(127)
    return pid


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    report = None
    if args[:1] == ["--report"] and len(args) > 1:
        report, args = args[1], args[2:]
    if args[:1] == ["--"]:
        args = args[1:]
    if not args:
        raise SystemExit("usage: … dtrain_lab.sandbox.contain [--report FILE] -- COMMAND [ARGS]")
    init(lambda: _exec(args), report=report)


if __name__ == "__main__":
    main()
