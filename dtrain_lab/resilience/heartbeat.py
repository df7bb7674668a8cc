"""Heartbeats: every rank writes ``hb.<rank>`` (step, time, pid) each step (:func:`heartbeat`); a
:class:`Watchdog` names a rank whose heartbeat is older than ``stale_after``."""
from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

from dtrain_lab.i18n import LabError, both
from dtrain_lab.resilience.faults import env_rank


def heartbeat(directory: str | os.PathLike, step: int, rank: int | None = None) -> None:
    """Record that ``rank`` is alive at ``step``: ``directory/hb.<rank>`` = JSON (step, time, pid,
    attempt), replaced atomically, so a reader never sees half a file. Call it once per step."""
    rank = env_rank() if rank is None else rank
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    body = json.dumps({"rank": rank, "step": int(step), "time": time.time(), "pid": os.getpid(),
                       "attempt": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)})
    tmp = d / f".hb.{rank}.{os.getpid()}"
    tmp.write_text(body)
    os.replace(tmp, d / f"hb.{rank}")


def read_heartbeats(directory: str | os.PathLike) -> dict[int, dict]:
    out = {}
    d = Path(directory)
    if not d.is_dir():
        return out
    for p in d.glob("hb.*"):
        try:
            info = json.loads(p.read_text())
            out[int(info["rank"])] = info
        except (OSError, ValueError, KeyError):
            continue
    return out


def stalled(directory: str | os.PathLike, world_size: int, stale_after: float, *,
            now: float | None = None, since: float | None = None) -> list[dict]:
    """Ranks whose last heartbeat is older than ``stale_after`` seconds: ``{"rank", "step", "age"}``.

    A rank with no heartbeat yet counts from ``since`` (default: never reported) with ``step=None``.
    """
    now = time.time() if now is None else now
    beats = read_heartbeats(directory)
    out = []
    for r in range(world_size):
        info = beats.get(r)
        if info is None:
            if since is not None and now - since > stale_after:
                out.append({"rank": r, "step": None, "age": now - since})
            continue
        age = now - float(info["time"])
        if age > stale_after:
            out.append({"rank": r, "step": info["step"], "age": age})
    return out


class Watchdog:
    """A daemon thread that checks the heartbeats every ``interval`` seconds and reports each rank
    whose heartbeat is older than ``stale_after`` (once per stall), naming the rank and its last step.

    ``on_stall(info)`` is called with ``{"rank", "step", "age", "message"}``; the default prints the
    bilingual message to stderr. Run it on rank 0 (or in the launcher); use as a context manager.
    """

    def __init__(self, directory: str | os.PathLike, world_size: int, stale_after: float = 60.0,
                 interval: float | None = None, on_stall: Callable[[dict], Any] | None = None):
        if not stale_after > 0:
            raise LabError("bad_timeout", name="stale_after", value=stale_after)
        self.directory, self.world_size, self.stale_after = Path(directory), int(world_size), float(stale_after)
        self.interval = float(interval) if interval else max(0.05, self.stale_after / 4)
        self.on_stall = on_stall or (lambda info: print(info["message"], file=sys.stderr, flush=True))
        self.reports: list[dict] = []
        self._reported: set[tuple[int, Any]] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._since = time.time()

    def check(self, now: float | None = None) -> list[dict]:
        """Report the ranks stalled at ``now`` (default: the current time) that were not reported yet."""
        new = []
        for info in stalled(self.directory, self.world_size, self.stale_after, now=now, since=self._since):
            key = (info["rank"], info["step"])
            if key in self._reported:
                continue
            self._reported.add(key)
            step = "—" if info["step"] is None else info["step"]
            info["message"] = both("rec_stalled", rank=info["rank"], step=step, age=info["age"])
            self.reports.append(info)
            new.append(info)
            self.on_stall(info)
        return new

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            with contextlib.suppress(Exception):
                self.check()

    def start(self) -> "Watchdog":
        self._since = time.time()
        self._thread = threading.Thread(target=self._run, name="dtrain-watchdog", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> "Watchdog":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
