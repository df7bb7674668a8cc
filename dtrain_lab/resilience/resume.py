"""Exact resume: everything training needs to continue where it stopped, bit-identically.

:func:`capture` records the model, optimizer, LR scheduler, the RNG states of *every* rank (torch
CPU, CUDA when present, NumPy when imported, Python ``random``), the data position (epoch + index
into this epoch's :class:`ResumableDistributedSampler` order) and the step; :func:`restore` puts it
all back. Interrupted-and-resumed training ends with bit-identical parameters (tested with
``torch.equal``).
"""
from __future__ import annotations

import dataclasses
import random
import sys
from typing import Any

import torch
import torch.distributed as dist

from dtrain_lab import caps
from dtrain_lab.comm import groups
from dtrain_lab.comm.groups import Group
from dtrain_lab.i18n import LabError
from dtrain_lab.resilience.common import check_step, warn_both


# ------------------------------------------------------------------------------------ RNG states
def rng_state() -> dict:
    """This process's RNG states: Python ``random``, torch CPU, CUDA (when initialised), NumPy
    (when imported). Only tensors, ints, strings and tuples: loadable with ``weights_only=True``."""
    out: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if caps.have("cuda") and torch.cuda.is_initialized():
        out["cuda"] = torch.cuda.get_rng_state_all()
    np = sys.modules.get("numpy")
    if np is not None:
        name, keys, pos, has_gauss, gauss = np.random.get_state()
        out["numpy"] = (str(name), torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(gauss))
    return out


def set_rng_state(state: dict) -> None:
    random.setstate(_as_tuple(state["python"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and caps.have("cuda"):
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
            sampler_or_loader_position: Any = None, step: int = 0, *, extra: dict | None = None,
            group: Group = None) -> dict:
    """Everything needed to continue training exactly where it is, as a dict for :func:`save`.

    Collective in a distributed job: the RNG states of all ranks are gathered (each rank draws its
    own dropout masks, so each rank's generator must come back), so call it on every rank of
    ``group`` (the world by default). The model must be replicated (DDP); for sharded models use
    :func:`~dtrain_lab.resilience.sharded.dcp_save`.
    ``sampler_or_loader_position``: a :class:`DataPosition`, ``{"epoch", "index"}``, or a
    :class:`ResumableDistributedSampler` at an epoch boundary.
    """
    step = check_step(step)
    pos = sampler_or_loader_position
    if isinstance(pos, ResumableDistributedSampler):
        pos = DataPosition(pos.epoch, pos.start_index)
    data = None if pos is None else _position(pos).as_dict()
    mine = rng_state()
    world = groups.size(group)
    if world > 1:
        rngs: list = [None] * world
        dist.all_gather_object(rngs, mine, group=group)
    else:
        rngs = [mine]
    state = TrainState(step=step, model=_unwrap(model).state_dict(),
                       optimizer=None if optimizer is None else optimizer.state_dict(),
                       scheduler=None if scheduler is None else scheduler.state_dict(),
                       data=data, rng=rngs, world_size=world, extra=extra)
    return state.as_dict()


def restore(state: dict, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None,
            scheduler: Any = None, sampler: ResumableDistributedSampler | None = None, *,
            group: Group = None) -> tuple[int, DataPosition | None]:
    """Put back what :func:`capture` recorded; returns ``(step, data position)``.

    Restores this rank's own RNG state (its rank in ``group``; a resume on a different world size
    gets ``rank % saved`` and a warning: training then continues, but not bit-identically).
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
        if len(rngs) != groups.size(group):
            warn_both("rec_world_changed", saved=len(rngs), now=groups.size(group))
        set_rng_state(rngs[groups.rank(group) % len(rngs)])
    pos = None if state.get("data") is None else _position(state["data"])
    if sampler is not None and pos is not None:
        sampler.load_position(pos)
    return int(state["step"]), pos
