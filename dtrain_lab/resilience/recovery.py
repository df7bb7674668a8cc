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

The pieces live in :mod:`~dtrain_lab.resilience.checkpoint`, :mod:`~dtrain_lab.resilience.sharded`,
:mod:`~dtrain_lab.resilience.resume`, :mod:`~dtrain_lab.resilience.faults` and
:mod:`~dtrain_lab.resilience.heartbeat`; this module gathers their names under one roof
(``recovery.save``, ``recovery.capture``, ...), as the lessons use them.
"""
from __future__ import annotations

from dtrain_lab.resilience.checkpoint import (DEFAULT_KEEP, FOOTER, MAGIC, NAME_RE, checkpoint_path, checkpoints,
                                              latest, load, save, verify)
from dtrain_lab.resilience.common import CheckpointError
from dtrain_lab.resilience.faults import FAIL_ENV, FAIL_MODES, describe_fail_env, fault_point, maybe_fail
from dtrain_lab.resilience.heartbeat import Watchdog, heartbeat, read_heartbeats, stalled
from dtrain_lab.resilience.resume import (DataPosition, ResumableDistributedSampler, TrainState, capture, restore,
                                          rng_state, set_rng_state)
from dtrain_lab.resilience.sharded import COMMIT_FILE, dcp_committed, dcp_latest, dcp_load, dcp_save

__all__ = [
    "save", "load", "latest", "checkpoints", "verify", "checkpoint_path", "CheckpointError",
    "dcp_save", "dcp_load", "dcp_committed", "dcp_latest",
    "DataPosition", "ResumableDistributedSampler", "TrainState", "capture", "restore",
    "rng_state", "set_rng_state",
    "FAIL_ENV", "FAIL_MODES", "describe_fail_env", "maybe_fail", "fault_point",
    "heartbeat", "read_heartbeats", "stalled", "Watchdog",
    "DEFAULT_KEEP", "FOOTER", "MAGIC", "NAME_RE", "COMMIT_FILE",
]
