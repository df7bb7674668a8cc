"""After a job: which rank raised what, and which rank failed first.

The evidence, best first: the ``error.<rank>.<attempt>.json`` files the runtime writes when a rank
raises (with the time, so the first failure is known); a C++ ``std::terminate`` message in a rank's
stderr (no Python exception is recorded then); the last exception line of a traceback; and
torchrun's own failure summary (``Root Cause ... rank : R``, ``exitcode``, ``Signal N (SIGXXX)``).
A peer's "connection closed" is a consequence of another rank's failure, never its cause
(:func:`dtrain_lab.jobs.diagnose.is_secondary_error`).
"""
from __future__ import annotations

import glob
import json
import re
from pathlib import Path

from dtrain_lab.jobs.diagnose import is_secondary_error
from dtrain_lab.jobs.result import RankResult

_ROOT_CAUSE_RE = re.compile(r"Root Cause.*?rank\s*:\s*(\d+)", re.S)
_EXC_LINE_RE = re.compile(r"^([A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit|Warning)|[A-Z]\w*Error)(:.*)?$")


def parse_root_cause(agent_output: str) -> int | None:
    m = _ROOT_CAUSE_RE.search(agent_output)
    return int(m.group(1)) if m else None


def last_exception_line(stderr: str) -> str | None:
    if "Traceback (most recent call last)" not in stderr:
        return None
    for line in reversed(stderr.splitlines()):
        if _EXC_LINE_RE.match(line.strip()):
            return line.strip()[:500]
    return None


def native_abort(stderr: str) -> str | None:
    """The message of a C++ exception that ended a rank through std::terminate (no Python traceback)."""
    m = re.search(r"terminate called after throwing an instance of '([^']+)'\s*\n\s*what\(\):\s*(.+)", stderr or "")
    if not m:
        return None
    return f"{m.group(1)} (C++ abort): {m.group(2).strip()}"


def signal_or_code(agent_output: str, rank: int | None = None) -> str | None:
    """How torchrun says rank ``rank`` ended (its failure block: ``rank : R``, ``exitcode : -11``,
    ``Signal 11 (SIGSEGV)``): "killed by SIGSEGV" or "exit code N"."""
    text = agent_output
    if rank is not None:
        m = re.search(rf"^\s*rank\s*:\s*{rank}\b.*$", agent_output, re.M)
        if m:  # this rank's block: up to the next "[i]:" header or separator
            rest = agent_output[m.end():]
            end = re.search(r"^\s*(\[\d+\]:|[-=]{10,})", rest, re.M)
            text = rest[: end.start()] if end else rest
    m = re.search(r"exitcode\s*:\s*(-?\d+)", text)
    if not m:
        return None
    sig = re.search(r"Signal (\d+) \((\w+)\)", text)
    if sig:
        return f"killed by {sig.group(2)}"
    return f"exit code {m.group(1)}"


def read_errors(job_dir: Path) -> list[tuple[float, int, dict]]:
    """``(time, rank, info)`` of every exception a rank recorded in ``job_dir``."""
    errors = []
    for path in glob.glob(str(job_dir / "error.*.json")):
        try:
            with open(path) as f:
                info = json.load(f)
            r = int(Path(path).name.split(".")[1])
            errors.append((info.get("time", 0.0), r, info))
        except (OSError, ValueError, json.JSONDecodeError):
            continue
    return errors


def attach_exceptions(ranks: dict[int, RankResult], errors: list[tuple[float, int, dict]]) -> list[int]:
    """Give every rank its exception (recorded, else a C++ abort, else a traceback's last line).
    Returns the ranks that died in C++ with no Python exception recorded."""
    for _, r, info in errors:
        if r in ranks:
            ranks[r].exception = f"{info.get('type')}: {info.get('message')}"
            ranks[r].traceback = info.get("traceback")
    recorded = {r for _, r, _ in errors}
    aborted = []
    for rr in ranks.values():
        if rr.exception is None:
            native = native_abort(rr.stderr)
            if native:
                rr.exception = native
                if rr.rank not in recorded:
                    aborted.append(rr.rank)
            else:
                rr.exception = last_exception_line(rr.stderr)
    return aborted


def mark_stopped(ranks: dict[int, RankResult], job_dir: Path, failed_rank: int | None) -> None:
    """Give every rank that ended neither by itself nor by an exception of its own a note saying so.

    After one rank fails, torchrun stops the others (SIGTERM, then SIGKILL): a rank that had not yet
    noticed its peer's failure records nothing. Such a rank started, has no ``exit.*`` mark (written by
    a rank that ends by itself) for its last attempt and no exception."""
    if failed_rank is None:
        return
    for rr in ranks.values():
        if rr.exception is not None or rr.rank == failed_rank:
            continue
        attempts = [int(p.name.split(".")[2]) for p in job_dir.glob(f"started.{rr.rank}.*")
                    if p.name.split(".")[2].isdigit()]
        if attempts and not (job_dir / f"exit.{rr.rank}.{max(attempts)}").exists():
            rr.exception = f"stopped from outside after rank {failed_rank} failed (no exception of its own)"


def first_failure(ranks: dict[int, RankResult], errors: list[tuple[float, int, dict]], aborted: list[int],
                  agent_output: str) -> tuple[int | None, str | None]:
    """The rank that failed first and its exception, for a job that failed (not hung)."""
    rank = exception = None
    if errors:
        # a peer's "connection closed" is a consequence of another rank's failure: prefer causes
        causes = [e for e in errors if not is_secondary_error(str(e[2].get("message", "")))]
        if not causes and aborted:   # the others only saw the aborted rank's sockets close
            rank = min(aborted)
            exception = ranks[rank].exception
        else:
            _, rank, info = min(causes or errors, key=lambda e: e[0])
            exception = f"{info.get('type')}: {info.get('message')}"
    else:
        rank = parse_root_cause(agent_output)
        if rank is None:
            rank = next((r for r in sorted(ranks) if ranks[r].exception), None)
        if rank is not None and rank in ranks:
            exception = ranks[rank].exception
    if exception is None and rank is not None:
        exception = signal_or_code(agent_output, rank)
    return rank, exception
