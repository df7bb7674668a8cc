"""Fault injection driven by environment variables (:data:`FAIL_ENV`), so that the same program
crashes in a test and runs normally otherwise: :func:`maybe_fail` in the training loop,
:func:`fault_point` inside a checkpoint save."""
from __future__ import annotations

import contextlib
import os
import signal
import sys
import time

from dtrain_lab.i18n import LabError, both, tr


FAIL_ENV = {   # variable -> catalogue key of its meaning (describe_fail_env() renders them)
    "DTRAIN_FAIL_AT_STEP": "rec_fail_at_step",
    "DTRAIN_FAIL_RANK": "rec_fail_rank",
    "DTRAIN_FAIL_MODE": "rec_fail_mode",
    "DTRAIN_FAIL_CODE": "rec_fail_code",
    "DTRAIN_FAIL_ONCE_FILE": "rec_fail_once_file",
    "DTRAIN_FAIL_STALL_S": "rec_fail_stall_s",
}
"""Several faults: ``;``-separated values, e.g. ``DTRAIN_FAIL_AT_STEP="6;12"``,
``DTRAIN_FAIL_RANK="1;0"``, ``DTRAIN_FAIL_MODE="sigkill;ckpt"`` (a single value applies to every
fault); fault ``i`` uses the once-file ``<DTRAIN_FAIL_ONCE_FILE>.<i>``."""


def describe_fail_env(lang: str | None = None) -> dict[str, str]:
    """``{variable: what it does}`` in the learner's language."""
    return {name: tr(key, lang) for name, key in FAIL_ENV.items()}

FAIL_MODES = ("exit", "sigkill", "ckpt", "stall")
_FAIL_DEFAULTS = {"DTRAIN_FAIL_RANK": "0", "DTRAIN_FAIL_MODE": "exit", "DTRAIN_FAIL_CODE": "13",
                  "DTRAIN_FAIL_STALL_S": "3600"}


def _fail_config() -> list[dict]:
    """The faults the environment asks for (empty list: none)."""
    raw = os.environ.get("DTRAIN_FAIL_AT_STEP", "").strip()
    if not raw:
        return []
    steps = [v.strip() for v in raw.split(";")]
    cols = {}
    for name, default in _FAIL_DEFAULTS.items():
        vals = [v.strip() or default for v in (os.environ.get(name, "").strip() or default).split(";")]
        if len(vals) == 1:
            vals = vals * len(steps)
        if len(vals) != len(steps):
            raise LabError("rec_bad_fail_env", detail=f"{name}={os.environ.get(name)!r} ({len(steps)} faults)")
        cols[name] = vals
    once = os.environ.get("DTRAIN_FAIL_ONCE_FILE") or None
    faults = []
    for i, at in enumerate(steps):
        try:
            cfg = {"at": int(at), "rank": int(cols["DTRAIN_FAIL_RANK"][i]), "code": int(cols["DTRAIN_FAIL_CODE"][i]),
                   "stall": float(cols["DTRAIN_FAIL_STALL_S"][i])}
        except ValueError:
            raise LabError("rec_bad_fail_env", detail=", ".join(f"{k}={os.environ.get(k)!r}" for k in FAIL_ENV
                                                                if k in os.environ)) from None
        mode = cols["DTRAIN_FAIL_MODE"][i].lower()
        if mode not in FAIL_MODES:
            raise LabError("rec_bad_fail_mode", value=mode, choices=", ".join(FAIL_MODES))
        cfg["mode"] = mode
        cfg["once"] = None if once is None else (once if len(steps) == 1 else f"{once}.{i}")
        faults.append(cfg)
    return faults


def _claim_once(path: str | None) -> bool:
    """True if this process may fail now: no ``once`` file, or we created it just now."""
    if path is None:
        return True
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    os.write(fd, f"{os.getpid()} {time.time()}\n".encode())
    os.fsync(fd)
    os.close(fd)
    return True


on_fault = None
"""A program may set this to a function: it is called with ``{"mode", "rank", "step", "where"}`` just
before an injected fault fires (lesson 09 records which rank died where, before it dies)."""


def _die(cfg: dict, step: int, rank: int, where: str) -> None:
    if on_fault is not None:
        on_fault({"mode": cfg["mode"], "rank": rank, "step": step, "where": where})
    sys.stderr.write(both("rec_injected", mode=cfg["mode"], rank=rank, step=step, where=where) + "\n")
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()
    if cfg["mode"] == "exit":
        os._exit(cfg["code"])
    if cfg["mode"] == "stall":
        time.sleep(cfg["stall"])
        return
    os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(60)   # pragma: no cover - SIGKILL is not deliverable late


def env_rank() -> int:
    try:
        return int(os.environ.get("RANK", "0"))
    except ValueError:
        return 0


def maybe_fail(step: int, rank: int | None = None) -> None:
    """Fail here if the fault-injection variables (:data:`FAIL_ENV`) say so; otherwise do nothing.

    Modes ``exit``, ``sigkill`` and ``stall`` fire at ``step == DTRAIN_FAIL_AT_STEP`` on
    ``DTRAIN_FAIL_RANK``; mode ``ckpt`` fires inside :func:`~dtrain_lab.resilience.checkpoint.save`
    (see :func:`fault_point`).
    """
    rank = env_rank() if rank is None else rank
    for cfg in _fail_config():
        if cfg["mode"] != "ckpt" and rank == cfg["rank"] and step == cfg["at"] and _claim_once(cfg["once"]):
            _die(cfg, step, rank, "step")
            return


def fault_point(where: str, step: int) -> None:
    """Called by :func:`~dtrain_lab.resilience.checkpoint.save` between the temporary file and the
    rename (``where="ckpt_rename"``): with ``DTRAIN_FAIL_MODE=ckpt`` the process SIGKILLs itself
    there at the first save whose step is >= ``DTRAIN_FAIL_AT_STEP`` (on ``DTRAIN_FAIL_RANK``)."""
    if where != "ckpt_rename":
        return
    rank = env_rank()
    for cfg in _fail_config():
        if cfg["mode"] == "ckpt" and rank == cfg["rank"] and step >= cfg["at"] and _claim_once(cfg["once"]):
            _die(cfg, step, rank, where)
            return
