"""Unsandboxed ranks of a root grader, never as root; standard library only.

Where no sandbox can be built and the grader runs submissions anyway (the Gradescope autograder built
with ``--allow-unsandboxed``), every job's ranks run as a uid of their own, fresh for every job, that no
account uses (:func:`fresh_uid`): they cannot signal the grader, write its results or read its files,
and no two jobs share a process count or a keyring. The rank takes that uid in
:func:`dtrain_lab.sandbox.enter._run_rank` (no groups, ``no_new_privs``); the grader gives it its job
files (:mod:`dtrain_lab.grading.runner`). :func:`unreachable_as` says beforehand whether such a uid can
read what a rank imports; where it cannot, the autograder refuses instead.
"""
from __future__ import annotations

import importlib.util
import os
import secrets
import sysconfig
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parents[1]      # .../dtrain_lab
_ON = [False]


def run_unsandboxed_as_others(on: bool = True) -> None:
    """From now on, in this process, unsandboxed ranks of a root grader run as a fresh uid per job."""
    _ON[0] = bool(on)


def enabled() -> bool:
    return _ON[0]


def fresh_uid() -> int:
    """A uid no account has (above every uid a system allocates, below 2**31)."""
    return 0x40000000 + secrets.randbelow(0x3FFF0000)


def _imported_from() -> list[Path]:
    paths = [PACKAGE_DIR] + [Path(p) for p in {sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib",
                                                                                 "purelib", "platlib")}]
    spec = importlib.util.find_spec("torch")
    if spec is not None and spec.origin:
        paths.append(Path(spec.origin).parent)
    return [p for p in paths if p.exists()]


def unreachable_as(uid: int) -> str | None:
    """What a rank running as ``uid`` could not read among what it imports (this Python's library, the
    course, torch and the installed packages); None if it can read all of it. Checked in a forked
    child that takes that uid, as the rank will."""
    paths = _imported_from()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:   # pragma: no cover - the child
        try:
            os.close(r)
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
            bad = next((str(p) for p in paths if not os.access(p, os.R_OK | os.X_OK)), "")
            os.write(w, bad.encode()[:2000])
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        bad = f.read().decode(errors="replace")
    os.waitpid(pid, 0)
    return bad or None
