"""Atomic single-file checkpoints: :func:`save`, :func:`load`, :func:`latest`.

``torch.save`` writes into a temporary file in the same folder; a footer (magic, payload length,
SHA-256) follows the payload; the file is ``fsync``-ed, then ``os.replace``-d onto
``step_{N:08d}.pt`` and the folder is ``fsync``-ed. ``os.replace`` is atomic on POSIX: a crash at any
instant leaves the old checkpoint whole and, at worst, a stray temporary file (ignored and cleaned
up). The footer is the commit marker: a file that was truncated, half-copied or corrupted fails the
length or checksum test in :func:`load`, and :func:`latest` then falls back to the previous
checkpoint with a warning.
"""
from __future__ import annotations

import contextlib
import hashlib
import io
import os
import re
import struct
import time
from pathlib import Path
from typing import Any

import torch

from dtrain_lab.i18n import LabError
from dtrain_lab.resilience.common import CheckpointError, check_step, fsync_dir, warn_both
from dtrain_lab.resilience.faults import fault_point

NAME_RE = re.compile(r"^step_(\d{8,})\.pt$")
MAGIC = b"DTRAINCK"
FOOTER = struct.Struct("<8sQ32s")     # magic, payload length, sha256(payload)
DEFAULT_KEEP = 3


def checkpoint_path(directory: str | os.PathLike, step: int) -> Path:
    return Path(directory) / f"step_{check_step(step):08d}.pt"


def save(state: dict, directory: str | os.PathLike, step: int, *, keep: int | None = DEFAULT_KEEP) -> Path:
    """Write ``state`` to ``directory/step_{step:08d}.pt`` atomically; keep the newest ``keep`` good ones.

    Call it on one rank (rank 0) with the state :func:`capture` returned (or any dict ``torch.save``
    can write). Order: serialise -> write temp file (payload + footer) -> ``fsync`` ->
    :func:`fault_point` ``"ckpt_rename"`` -> ``os.replace`` -> ``fsync`` the folder -> prune.
    """
    if not isinstance(state, dict):
        raise LabError("rec_bad_state", type=type(state).__name__)
    step = check_step(step)
    if keep is not None and (isinstance(keep, bool) or not isinstance(keep, int) or keep < 1):
        raise LabError("rec_bad_keep", value=keep)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    final = checkpoint_path(directory, step)
    buf = io.BytesIO()
    torch.save(state, buf)
    payload = buf.getvalue()
    footer = FOOTER.pack(MAGIC, len(payload), hashlib.sha256(payload).digest())
    tmp = directory / f".{final.name}.tmp.{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(payload + footer)
        while view:
            n = os.write(fd, view)
            view = view[n:]
        os.fsync(fd)
    finally:
        os.close(fd)
    fault_point("ckpt_rename", step)          # a crash here must leave the previous checkpoint whole
    os.replace(tmp, final)                    # the commit: one atomic rename
    fsync_dir(directory)
    if keep is not None:
        _prune(directory, keep)
    return final


def read_verified(path: Path) -> bytes:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise CheckpointError("rec_unreadable", path=str(path), detail=str(exc)) from None
    if len(data) < FOOTER.size:
        raise CheckpointError("rec_truncated", path=str(path), size=len(data))
    magic, length, digest = FOOTER.unpack(data[-FOOTER.size:])
    if magic != MAGIC:
        raise CheckpointError("rec_no_footer", path=str(path))
    payload = data[:-FOOTER.size]
    if length != len(payload):
        raise CheckpointError("rec_truncated", path=str(path), size=len(data))
    if hashlib.sha256(payload).digest() != digest:
        raise CheckpointError("rec_checksum", path=str(path))
    return payload


def verify(path: str | os.PathLike) -> bool:
    """True when ``path`` is a whole, committed checkpoint (footer present, length and checksum right)."""
    try:
        read_verified(Path(path))
        return True
    except CheckpointError:
        return False


def load(path: str | os.PathLike, *, weights_only: bool = True, map_location: Any = "cpu") -> dict:
    """Read a checkpoint written by :func:`save`, after checking its length and SHA-256.

    Raises :class:`CheckpointError` (bilingual) for a missing, truncated or corrupted file. The
    states :func:`capture` makes load with ``weights_only=True`` (no pickled code is run).
    """
    payload = read_verified(Path(path))
    return torch.load(io.BytesIO(payload), map_location=map_location, weights_only=weights_only)


def checkpoints(directory: str | os.PathLike) -> list[tuple[int, Path]]:
    """``(step, path)`` of every ``step_*.pt`` in ``directory``, oldest first (not verified)."""
    d = Path(directory)
    if not d.is_dir():
        return []
    found = []
    for p in d.iterdir():
        m = NAME_RE.match(p.name)
        if m and p.is_file():
            found.append((int(m.group(1)), p))
    return sorted(found)


def latest(directory: str | os.PathLike, *, warn: bool = True) -> Path | None:
    """The newest checkpoint in ``directory`` that verifies, or ``None``.

    A newer checkpoint that fails the check (truncated, corrupted, no footer) is skipped with a
    bilingual warning, and the previous one is returned. Stray temporary files of interrupted saves
    are ignored.
    """
    for _, path in reversed(checkpoints(directory)):
        try:
            read_verified(path)
            return path
        except CheckpointError as exc:
            if warn:
                warn_both("rec_skip_bad", path=str(path), reason=exc)
    return None


def _prune(directory: Path, keep: int) -> None:
    """Keep the newest ``keep`` checkpoints that verify; delete every older one (good or damaged)."""
    good = 0
    for _, p in reversed(checkpoints(directory)):
        if good >= keep:
            with contextlib.suppress(OSError):
                p.unlink()
        elif verify(p):
            good += 1
    now = time.time()
    for p in directory.glob(".step_*.pt.tmp.*"):   # temp files of saves killed long ago
        with contextlib.suppress(OSError):
            if now - p.stat().st_mtime > 60:
                p.unlink()
    fsync_dir(directory)
