"""Surviving failures: atomic checkpoints, exact resume, fault injection and a heartbeat watchdog.

    from dtrain_lab.resilience import recovery

    state = recovery.capture(model, opt, sched, sampler.position(batches_done, bs), step)
    if rank == 0:                           # capture() is collective: call it on every rank
        recovery.save(state, "ckpt", step)  # ckpt/step_00000040.pt, atomically, keeps the last 3
    ...
    found = recovery.latest("ckpt")         # the newest checkpoint that verifies (or None)
    if found is not None:
        step, pos = recovery.restore(recovery.load(found), model, opt, sched, sampler)

What each piece guarantees, and how:

* **Atomic file checkpoints** (:func:`save`, :func:`load`, :func:`latest`). ``torch.save`` writes into
  a temporary file in the same folder; a footer (magic, payload length, SHA-256) follows the payload;
  the file is ``fsync``-ed, then ``os.replace``-d onto ``step_{N:08d}.pt`` and the folder is
  ``fsync``-ed. ``os.replace`` is atomic on POSIX: a crash at any instant leaves the old checkpoint
  whole and, at worst, a stray temporary file (ignored and cleaned up). The footer is the commit
  marker: a file that was truncated, half-copied or corrupted fails the length or checksum test in
  :func:`load`, and :func:`latest` then falls back to the previous checkpoint with a warning.
* **Sharded checkpoints** (:func:`dcp_save`, :func:`dcp_load`): ``torch.distributed.checkpoint``
  writes one file per rank plus ``.metadata``; a folder without our ``COMMIT`` file (written by rank
  0 after a barrier, listing every file with its size and SHA-256) is never loaded. Loading works on
  a different world size (DCP reshards ``DTensor``\\ s).
* **Exact resume** (:func:`capture`, :func:`restore`): model, optimizer, LR scheduler, the RNG
  states of *every* rank (torch CPU, CUDA when present, NumPy when imported, Python ``random``), the
  data position (epoch + index into this epoch's :class:`ResumableDistributedSampler` order) and the
  step. Interrupted-and-resumed training ends with bit-identical parameters (tested with
  ``torch.equal``).
* **Fault injection** (:func:`maybe_fail`), driven by environment variables, so that the same
  program crashes in a test and runs normally otherwise (see :data:`FAIL_ENV`).
* **Heartbeats** (:func:`heartbeat`, :class:`Watchdog`): every rank writes ``hb.<rank>`` (step,
  time, pid) each step; the watchdog names a rank whose heartbeat is older than ``stale_after``.

Elastic restarts (``launch(..., max_restarts=N)``): see :mod:`dtrain_lab.jobs.runtime` (``init``) for why
every restarted attempt must use its own key prefix in torchrun's shared TCPStore.
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import io
import json
import os
import random
import re
import signal
import struct
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import Any, Callable

import torch

from dtrain_lab.i18n import LabError, both

__all__ = [
    "save", "load", "latest", "checkpoints", "verify", "CheckpointError",
    "dcp_save", "dcp_load", "dcp_committed", "dcp_latest",
    "DataPosition", "ResumableDistributedSampler", "TrainState", "capture", "restore",
    "rng_state", "set_rng_state",
    "FAIL_ENV", "maybe_fail", "fault_point",
    "heartbeat", "read_heartbeats", "stalled", "Watchdog",
]

NAME_RE = re.compile(r"^step_(\d{8,})\.pt$")
MAGIC = b"DTRAINCK"
_FOOTER = struct.Struct("<8sQ32s")     # magic, payload length, sha256(payload)
DEFAULT_KEEP = 3
COMMIT_FILE = "COMMIT"


class CheckpointError(LabError):
    """A checkpoint that must not be loaded (missing, truncated, corrupted, uncommitted)."""


# ------------------------------------------------------------------------------------- helpers
def _fsync_dir(path: str | os.PathLike) -> None:
    """Make a rename/unlink inside ``path`` durable (no-op where directories cannot be opened)."""
    try:
        fd = os.open(str(path), os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _check_step(step: Any) -> int:
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise LabError("rec_bad_step", value=step)
    return step


def _warn(key: str, **fields) -> None:
    msg = both(key, **fields)
    warnings.warn(msg, RuntimeWarning, stacklevel=3)


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _world() -> int:
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def _barrier() -> None:
    import torch.distributed as dist

    if _world() > 1:
        dist.barrier()


# ------------------------------------------------------------------------- single-file checkpoints
def checkpoint_path(directory: str | os.PathLike, step: int) -> Path:
    return Path(directory) / f"step_{_check_step(step):08d}.pt"


def save(state: dict, directory: str | os.PathLike, step: int, *, keep: int | None = DEFAULT_KEEP) -> Path:
    """Write ``state`` to ``directory/step_{step:08d}.pt`` atomically; keep the newest ``keep`` good ones.

    Call it on one rank (rank 0) with the state :func:`capture` returned (or any dict ``torch.save``
    can write). Order: serialise -> write temp file (payload + footer) -> ``fsync`` ->
    :func:`fault_point` ``"ckpt_rename"`` -> ``os.replace`` -> ``fsync`` the folder -> prune.
    """
    if not isinstance(state, dict):
        raise LabError("rec_bad_state", type=type(state).__name__)
    step = _check_step(step)
    if keep is not None and (isinstance(keep, bool) or not isinstance(keep, int) or keep < 1):
        raise LabError("rec_bad_keep", value=keep)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    final = checkpoint_path(directory, step)
    buf = io.BytesIO()
    torch.save(state, buf)
    payload = buf.getvalue()
    footer = _FOOTER.pack(MAGIC, len(payload), hashlib.sha256(payload).digest())
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
    _fsync_dir(directory)
    if keep is not None:
        _prune(directory, keep)
    return final


def _read_verified(path: Path) -> bytes:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise CheckpointError("rec_unreadable", path=str(path), detail=str(exc)) from None
    if len(data) < _FOOTER.size:
        raise CheckpointError("rec_truncated", path=str(path), size=len(data))
    magic, length, digest = _FOOTER.unpack(data[-_FOOTER.size:])
    if magic != MAGIC:
        raise CheckpointError("rec_no_footer", path=str(path))
    payload = data[:-_FOOTER.size]
    if length != len(payload):
        raise CheckpointError("rec_truncated", path=str(path), size=len(data))
    if hashlib.sha256(payload).digest() != digest:
        raise CheckpointError("rec_checksum", path=str(path))
    return payload


def verify(path: str | os.PathLike) -> bool:
    """True when ``path`` is a whole, committed checkpoint (footer present, length and checksum right)."""
    try:
        _read_verified(Path(path))
        return True
    except CheckpointError:
        return False


def load(path: str | os.PathLike, *, weights_only: bool = True, map_location: Any = "cpu") -> dict:
    """Read a checkpoint written by :func:`save`, after checking its length and SHA-256.

    Raises :class:`CheckpointError` (bilingual) for a missing, truncated or corrupted file. The
    states :func:`capture` makes load with ``weights_only=True`` (no pickled code is run).
    """
    payload = _read_verified(Path(path))
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
    for step, path in reversed(checkpoints(directory)):
        try:
            _read_verified(path)
            return path
        except CheckpointError as exc:
            if warn:
                _warn("rec_skip_bad", path=str(path), reason=exc)
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
    _fsync_dir(directory)


# ------------------------------------------------------------------------------- DCP checkpoints
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


def dcp_save(state: dict, directory: str | os.PathLike, *, process_group=None) -> Path:
    """Save a (sharded) state dict with ``torch.distributed.checkpoint`` and commit it. Collective.

    Every rank writes its own shards into ``directory`` (``dcp.save``; DCP's coordinator writes
    ``.metadata``); after a barrier rank 0 writes ``COMMIT`` (every file's size and SHA-256) through
    a temporary file and ``os.replace``, then a second barrier. Use a new folder per checkpoint
    (e.g. ``root/step_00000040``, found again by :func:`dcp_latest`): an existing ``COMMIT`` is
    removed first, so an interrupted overwrite is never mistaken for a whole checkpoint.
    """
    import torch.distributed.checkpoint as dcp

    if not isinstance(state, dict):
        raise LabError("rec_bad_state", type=type(state).__name__)
    directory = Path(directory)
    if _rank() == 0:
        directory.mkdir(parents=True, exist_ok=True)
        commit = directory / COMMIT_FILE
        if commit.exists():
            commit.unlink()
            _fsync_dir(directory)
    _barrier()
    dcp.save(state, checkpoint_id=str(directory), process_group=process_group)
    _barrier()                                 # every rank's shard files and .metadata are written
    if _rank() == 0:
        tmp = directory / f"{COMMIT_FILE}.tmp"
        body = json.dumps({"world_size": _world(), "time": time.time(), "files": _manifest(directory)})
        with open(tmp, "w") as f:
            f.write(body)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, directory / COMMIT_FILE)
        _fsync_dir(directory)
    _barrier()
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


def dcp_load(state: dict, directory: str | os.PathLike, *, process_group=None, check_hashes: bool = True) -> dict:
    """Load a checkpoint written by :func:`dcp_save` into ``state`` in place (its tensors/DTensors
    give the layout wanted now: the world size may differ from the one that saved). Collective.
    Raises :class:`CheckpointError` if ``directory`` is not committed or a file does not match."""
    _dcp_verify(Path(directory), check_hashes)
    import torch.distributed.checkpoint as dcp

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
                _warn("rec_skip_bad", path=str(p), reason=exc)
    return None


# ------------------------------------------------------------------------------------ RNG states
def rng_state() -> dict:
    """This process's RNG states: Python ``random``, torch CPU, CUDA (when initialised), NumPy
    (when imported). Only tensors, ints, strings and tuples: loadable with ``weights_only=True``."""
    out: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["cuda"] = torch.cuda.get_rng_state_all()
    np = sys.modules.get("numpy")
    if np is not None:
        name, keys, pos, has_gauss, gauss = np.random.get_state()
        out["numpy"] = (str(name), torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(gauss))
    return out


def set_rng_state(state: dict) -> None:
    random.setstate(_as_tuple(state["python"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    if "numpy" in state:
        import numpy as np

        name, keys, pos, has_gauss, gauss = state["numpy"]
        np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))


def _as_tuple(x):
    if isinstance(x, (list, tuple)):
        return tuple(_as_tuple(v) for v in x)
    return x


# ------------------------------------------------------------------------------- data position
@dataclasses.dataclass(frozen=True)
class DataPosition:
    """Where the data stream stands: ``epoch`` and ``index``, the number of samples of this epoch's
    per-rank order (of a :class:`ResumableDistributedSampler`) already consumed."""

    epoch: int = 0
    index: int = 0

    def as_dict(self) -> dict:
        return {"epoch": self.epoch, "index": self.index}


class ResumableDistributedSampler(torch.utils.data.DistributedSampler):
    """``DistributedSampler`` that can start in the middle of an epoch.

    The per-rank order of an epoch is PyTorch's own (``seed + epoch`` shuffle, padding, striding);
    after :meth:`load_position` the first epoch iterated skips the samples already consumed. Typical
    loop (``batch_size`` samples per batch, ``drop_last`` as you like)::

        for epoch in range(sampler.epoch, epochs):
            sampler.set_epoch(epoch)              # same epoch: keeps the resume index
            for i, batch in enumerate(loader):
                ...
                pos = sampler.position(i + 1, batch_size)   # for capture()
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.start_index = 0

    def set_epoch(self, epoch: int) -> None:
        if epoch != self.epoch:
            self.start_index = 0
        super().set_epoch(epoch)

    def load_position(self, pos: DataPosition | dict) -> None:
        pos = _position(pos)
        if not 0 <= pos.index <= self.num_samples:
            raise LabError("rec_bad_position", index=pos.index, n=self.num_samples)
        super().set_epoch(pos.epoch)
        self.start_index = pos.index

    def position(self, batches_done: int, batch_size: int) -> DataPosition:
        """The position after ``batches_done`` batches of ``batch_size`` of the current iteration."""
        return DataPosition(self.epoch, min(self.num_samples, self.start_index + batches_done * batch_size))

    def __iter__(self):
        return iter(list(super().__iter__())[self.start_index:])

    def __len__(self) -> int:
        return self.num_samples - self.start_index


def _position(pos: Any) -> DataPosition:
    if isinstance(pos, DataPosition):
        return pos
    if isinstance(pos, dict) and set(pos) <= {"epoch", "index"}:
        return DataPosition(int(pos.get("epoch", 0)), int(pos.get("index", 0)))
    if isinstance(pos, (tuple, list)) and len(pos) == 2:
        return DataPosition(int(pos[0]), int(pos[1]))
    raise LabError("rec_bad_position_type", type=type(pos).__name__)


# ---------------------------------------------------------------------------------- train state
def _unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The module under a DDP wrapper (PyTorch's or ours): checkpoints load with or without it."""
    inner = getattr(model, "module", None)
    return inner if isinstance(inner, torch.nn.Module) else model


@dataclasses.dataclass
class TrainState:
    """What :func:`capture` returns, as a dict (``as_dict``) ready for :func:`save`."""

    step: int
    model: dict
    optimizer: dict | None = None
    scheduler: dict | None = None
    data: dict | None = None
    rng: list | None = None                    # one entry per rank
    world_size: int = 1
    extra: dict | None = None

    def as_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


def capture(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None, scheduler: Any = None,
            sampler_or_loader_position: Any = None, step: int = 0, *, extra: dict | None = None) -> dict:
    """Everything needed to continue training exactly where it is, as a dict for :func:`save`.

    Collective in a distributed job: the RNG states of all ranks are gathered (each rank draws its
    own dropout masks, so each rank's generator must come back), so call it on every rank. The
    model must be replicated (DDP); for sharded models use :func:`dcp_save`.
    ``sampler_or_loader_position``: a :class:`DataPosition`, ``{"epoch", "index"}``, or a
    :class:`ResumableDistributedSampler` at an epoch boundary.
    """
    step = _check_step(step)
    pos = sampler_or_loader_position
    if isinstance(pos, ResumableDistributedSampler):
        pos = DataPosition(pos.epoch, pos.start_index)
    data = None if pos is None else _position(pos).as_dict()
    mine = rng_state()
    if _world() > 1:
        import torch.distributed as dist

        rngs: list = [None] * _world()
        dist.all_gather_object(rngs, mine)
    else:
        rngs = [mine]
    state = TrainState(step=step, model=_unwrap(model).state_dict(),
                       optimizer=None if optimizer is None else optimizer.state_dict(),
                       scheduler=None if scheduler is None else scheduler.state_dict(),
                       data=data, rng=rngs, world_size=_world(), extra=extra)
    return state.as_dict()


def restore(state: dict, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None,
            scheduler: Any = None, sampler: ResumableDistributedSampler | None = None) -> tuple[int, DataPosition | None]:
    """Put back what :func:`capture` recorded; returns ``(step, data position)``.

    Restores this rank's own RNG state (a resume on a different world size gets ``rank % saved``
    and a warning: training then continues, but not bit-identically).
    """
    if not isinstance(state, dict) or "model" not in state or "step" not in state:
        raise LabError("rec_not_train_state")
    _unwrap(model).load_state_dict(state["model"])
    if optimizer is not None:
        if state.get("optimizer") is None:
            raise LabError("rec_missing_part", part="optimizer")
        optimizer.load_state_dict(state["optimizer"])
    if scheduler is not None:
        if state.get("scheduler") is None:
            raise LabError("rec_missing_part", part="scheduler")
        scheduler.load_state_dict(state["scheduler"])
    rngs = state.get("rng") or []
    if rngs:
        if len(rngs) != _world():
            _warn("rec_world_changed", saved=len(rngs), now=_world())
        set_rng_state(rngs[_rank() % len(rngs)])
    pos = None if state.get("data") is None else _position(state["data"])
    if sampler is not None and pos is not None:
        sampler.load_position(pos)
    return int(state["step"]), pos


# ------------------------------------------------------------------------------ fault injection
FAIL_ENV = {
    "DTRAIN_FAIL_AT_STEP": "fail at this step (the first save at or after it, for mode ckpt)",
    "DTRAIN_FAIL_RANK": "only this rank fails (default 0)",
    "DTRAIN_FAIL_MODE": "exit (os._exit(code)), sigkill, ckpt (SIGKILL between temp file and rename), "
                        "stall (sleep DTRAIN_FAIL_STALL_S seconds)",
    "DTRAIN_FAIL_CODE": "exit code of mode exit (default 13)",
    "DTRAIN_FAIL_ONCE_FILE": "a marker file: the failure happens only if it does not exist yet "
                             "(created first), i.e. once across elastic restarts",
    "DTRAIN_FAIL_STALL_S": "seconds a stall lasts (default 3600)",
}
"""Several faults: ``;``-separated values, e.g. ``DTRAIN_FAIL_AT_STEP="6;12"``,
``DTRAIN_FAIL_RANK="1;0"``, ``DTRAIN_FAIL_MODE="sigkill;ckpt"`` (a single value applies to every
fault); fault ``i`` uses the once-file ``<DTRAIN_FAIL_ONCE_FILE>.<i>``."""
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


def _die(cfg: dict, step: int, rank: int, where: str) -> None:
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


def _env_rank() -> int:
    try:
        return int(os.environ.get("RANK", "0"))
    except ValueError:
        return 0


def maybe_fail(step: int, rank: int | None = None) -> None:
    """Fail here if the fault-injection variables (:data:`FAIL_ENV`) say so; otherwise do nothing.

    Modes ``exit``, ``sigkill`` and ``stall`` fire at ``step == DTRAIN_FAIL_AT_STEP`` on
    ``DTRAIN_FAIL_RANK``; mode ``ckpt`` fires inside :func:`save` (see :func:`fault_point`).
    """
    rank = _env_rank() if rank is None else rank
    for cfg in _fail_config():
        if cfg["mode"] != "ckpt" and rank == cfg["rank"] and step == cfg["at"] and _claim_once(cfg["once"]):
            _die(cfg, step, rank, "step")
            return


def fault_point(where: str, step: int) -> None:
    """Called by :func:`save` between the temporary file and the rename (``where="ckpt_rename"``):
    with ``DTRAIN_FAIL_MODE=ckpt`` the process SIGKILLs itself there at the first save whose step
    is >= ``DTRAIN_FAIL_AT_STEP`` (on ``DTRAIN_FAIL_RANK``)."""
    if where != "ckpt_rename":
        return
    rank = _env_rank()
    for cfg in _fail_config():
        if cfg["mode"] == "ckpt" and rank == cfg["rank"] and step >= cfg["at"] and _claim_once(cfg["once"]):
            _die(cfg, step, rank, where)
            return


# ------------------------------------------------------------------------------------ heartbeats
def heartbeat(directory: str | os.PathLike, step: int, rank: int | None = None) -> None:
    """Record that ``rank`` is alive at ``step``: ``directory/hb.<rank>`` = JSON (step, time, pid,
    attempt), replaced atomically, so a reader never sees half a file. Call it once per step."""
    rank = _env_rank() if rank is None else rank
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

    def check(self) -> list[dict]:
        new = []
        for info in stalled(self.directory, self.world_size, self.stale_after, since=self._since):
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
