"""Sharded checkpoints with ``torch.distributed.checkpoint`` (DCP), committed so that a half-written
one is never loaded.

DCP writes one file per rank plus ``.metadata``; a folder without our ``COMMIT`` file (written by rank
0 after a barrier, listing every file with its size and SHA-256) is never loaded. Loading works on a
different world size (DCP reshards ``DTensor``\\ s).
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import time
from pathlib import Path

import torch.distributed.checkpoint as dcp

from dtrain_lab.comm import groups
from dtrain_lab.comm.groups import Group
from dtrain_lab.i18n import LabError
from dtrain_lab.resilience.common import CheckpointError, fsync_dir, warn_both

COMMIT_FILE = "COMMIT"


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _manifest(directory: Path) -> dict:
    return {p.name: {"size": p.stat().st_size, "sha256": _sha256_file(p)}
            for p in sorted(directory.iterdir()) if p.is_file() and p.name != COMMIT_FILE
            and not p.name.startswith(f"{COMMIT_FILE}.")}


def dcp_save(state: dict, directory: str | os.PathLike, *, process_group: Group = None) -> Path:
    """Save a (sharded) state dict with ``torch.distributed.checkpoint`` and commit it. Collective.

    Every rank writes its own shards into ``directory`` (``dcp.save``; DCP's coordinator writes
    ``.metadata``); after a barrier rank 0 writes ``COMMIT`` (every file's size and SHA-256) through
    a temporary file and ``os.replace``, then a second barrier (rank 0 and the barriers are those of
    ``process_group``, the world by default). Use a new folder per checkpoint
    (e.g. ``root/step_00000040``, found again by :func:`dcp_latest`): an existing ``COMMIT`` is
    removed first, so an interrupted overwrite is never mistaken for a whole checkpoint.
    """
    if not isinstance(state, dict):
        raise LabError("rec_bad_state", type=type(state).__name__)
    directory = Path(directory)
    me, world = groups.rank(process_group), groups.size(process_group)
    if me == 0:
        directory.mkdir(parents=True, exist_ok=True)
        commit = directory / COMMIT_FILE
        if commit.exists():
            commit.unlink()
            fsync_dir(directory)
    groups.barrier(process_group)
    dcp.save(state, checkpoint_id=str(directory), process_group=process_group)
    groups.barrier(process_group)                                 # every rank's shard files and .metadata are written
    if me == 0:
        tmp = directory / f"{COMMIT_FILE}.tmp"
        body = json.dumps({"world_size": world, "time": time.time(), "files": _manifest(directory)})
        with open(tmp, "w") as f:
            f.write(body)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, directory / COMMIT_FILE)
        fsync_dir(directory)
    groups.barrier(process_group)
    return directory


def dcp_committed(directory: str | os.PathLike, *, check_hashes: bool = True) -> bool:
    """True when ``directory`` holds a committed DCP checkpoint whose files match the ``COMMIT`` list."""
    try:
        _dcp_verify(Path(directory), check_hashes)
        return True
    except CheckpointError:
        return False


def _dcp_verify(directory: Path, check_hashes: bool = True) -> None:
    commit = directory / COMMIT_FILE
    try:
        info = json.loads(commit.read_text())
        files = info["files"]
    except (OSError, ValueError, KeyError, TypeError):
        raise CheckpointError("rec_dcp_uncommitted", path=str(directory)) from None
    if ".metadata" not in files:
        raise CheckpointError("rec_dcp_uncommitted", path=str(directory))
    for name, meta in files.items():
        p = directory / name
        if not p.is_file() or p.stat().st_size != meta["size"]:
            raise CheckpointError("rec_dcp_file", path=str(p))
        if check_hashes and _sha256_file(p) != meta["sha256"]:
            raise CheckpointError("rec_checksum", path=str(p))


def dcp_load(state: dict, directory: str | os.PathLike, *, process_group: Group = None,
             check_hashes: bool = True) -> dict:
    """Load a checkpoint written by :func:`dcp_save` into ``state`` in place (its tensors/DTensors
    give the layout wanted now: the world size may differ from the one that saved). Collective.
    Raises :class:`CheckpointError` if ``directory`` is not committed or a file does not match."""
    _dcp_verify(Path(directory), check_hashes)
    dcp.load(state, checkpoint_id=str(directory), process_group=process_group)
    return state


def dcp_latest(root: str | os.PathLike, *, warn: bool = True) -> Path | None:
    """The newest committed ``root/step_*`` folder (uncommitted or damaged ones skipped, with a warning)."""
    root = Path(root)
    if not root.is_dir():
        return None
    folders = sorted((int(m.group(1)), p) for p in root.iterdir()
                     if p.is_dir() and (m := re.match(r"^step_(\d+)$", p.name)))
    for _, p in reversed(folders):
        try:
            _dcp_verify(p)
            return p
        except CheckpointError as exc:
            if warn:
                warn_both("rec_skip_bad", path=str(p), reason=exc)
    return None
