"""The interface of a gradient-compression hook and the hooks that do not compress much.

A compression method is a **DDP communication hook**, ``hook(state, bucket) -> Future[Tensor]``, the
interface of PyTorch's ``DistributedDataParallel.register_comm_hook`` that our
:class:`dtrain_lab.parallel.ddp.DDP` implements too. Here: the hook's state (:class:`CommState`: the
process group and the byte counters, every collective issued through
:class:`dtrain_lab.comm.counted.Comm`), the uncompressed baseline, fp16 and bf16, and the
per-parameter memory that top-k (:mod:`dtrain_lab.parallel.compress_topk`) and PowerSGD
(:mod:`dtrain_lab.parallel.compress_powersgd`) keep. The lesson's overview is in
:mod:`dtrain_lab.parallel.compression`.
"""
# No ``from __future__ import annotations``: PyTorch DDP compares a hook's return annotation with
# torch.futures.Future[torch.Tensor] and refuses a string.

import math

import torch

from dtrain_lab.comm import groups
from dtrain_lab.comm.counted import Comm, wire_bytes
from dtrain_lab.comm.groups import Group

__all__ = ["CommState", "payload_bytes", "wire_bytes", "done_future", "allreduce_hook", "cast_allreduce",
           "fp16_hook", "bf16_hook", "bucket_layout", "flat_memory", "store_memory"]

HOOK_OPS = ("all_reduce", "all_gather")   # the collectives a compression hook issues


def payload_bytes(t: torch.Tensor) -> int:
    """Logical payload of one tensor passed to a collective: ``numel × element_size``."""
    return groups.nbytes(t)


class CommState:
    """State of a communication hook: the process group and the byte counters.

    * ``bytes_sent`` — logical payload this rank passed into collectives (all-reduce: the tensor;
      all-gather: its own chunk, not the gathered list);
    * ``baseline_bytes`` — what the uncompressed all-reduce of the same buckets would have passed;
    * ``bytes_by_op`` — ``bytes_sent`` split by collective; ``collectives`` — calls issued;
    * ``steps`` — steps completed (a step ends with the bucket whose ``is_last()`` is true);
      ``step_bytes`` — ``bytes_sent`` of each completed step, in order.

    Every collective goes through ``self.comm`` (:class:`~dtrain_lab.comm.counted.Comm`), which counts
    it. :meth:`reset` zeroes the counters only (a compressor's own memory — residuals, ``Q`` — stays).
    """

    def __init__(self, process_group: Group = None):
        self.process_group = process_group
        self.comm = Comm(process_group)
        self.reset()

    def reset(self) -> None:
        self.comm.reset()
        self.baseline_bytes = 0
        self.steps = 0
        self.step_bytes: list[int] = []
        self._step_start = 0

    @property
    def world_size(self) -> int:
        return self.comm.size

    @property
    def bytes_sent(self) -> int:
        return int(self.comm.total("payload"))

    @property
    def bytes_by_op(self) -> dict[str, int]:
        return {op: int(self.comm.payload[op]) for op in HOOK_OPS}

    @property
    def collectives(self) -> int:
        return int(self.comm.total("calls"))

    def ratio(self) -> float:
        """``bytes_sent / baseline_bytes`` (payload), NaN before any bucket."""
        return self.bytes_sent / self.baseline_bytes if self.baseline_bytes else math.nan

    def wire_bytes_sent(self) -> float:
        """Bytes this rank put on the wire, assuming ring algorithms (see :func:`wire_bytes`)."""
        return self.comm.total("wire")

    def baseline_wire_bytes(self) -> float:
        return wire_bytes("all_reduce", self.baseline_bytes, self.world_size)

    def summary(self) -> dict:
        return {"bytes_sent": self.bytes_sent, "baseline_bytes": self.baseline_bytes, "ratio": self.ratio(),
                "bytes_by_op": self.bytes_by_op, "collectives": self.collectives, "steps": self.steps,
                "wire_bytes": self.wire_bytes_sent(), "baseline_wire_bytes": self.baseline_wire_bytes()}

    # -- the only two places where the hooks talk to the network
    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        """Blocking sum all-reduce of ``t`` in place, counted."""
        self.comm.all_reduce(t)
        return t

    def all_gather(self, t: torch.Tensor) -> list[torch.Tensor]:
        """Blocking all-gather of ``t`` (same shape on every rank), counted as ``t``'s bytes."""
        return self.comm.all_gather_list(t)

    def bucket_done(self, bucket) -> None:
        """Account one bucket handed to a hook (baseline bytes, end of step)."""
        self.baseline_bytes += payload_bytes(bucket.buffer())
        if bucket.is_last():
            self.steps += 1
            self.step_bytes.append(self.bytes_sent - self._step_start)
            self._step_start = self.bytes_sent


def done_future(t: torch.Tensor) -> torch.futures.Future[torch.Tensor]:
    """A future already holding ``t``: our hooks use blocking collectives (simple to read; no
    overlap of the compression with backward)."""
    fut: torch.futures.Future = torch.futures.Future()
    fut.set_result(t)
    return fut


# ------------------------------------------------------------------------------------ baseline, fp16, bf16
def allreduce_hook(state: CommState, bucket) -> torch.futures.Future[torch.Tensor]:
    """No compression: divide by the world size, all-reduce (PyTorch's ``default_hooks.allreduce_hook``)."""
    buf = bucket.buffer()
    buf.div_(state.world_size)
    state.all_reduce(buf)
    state.bucket_done(bucket)
    return done_future(buf)


def cast_allreduce(tensor: torch.Tensor, dtype: torch.dtype, state: CommState) -> torch.Tensor:
    """Average ``tensor`` over the ranks through ``dtype``: cast, divide by the world size (before the
    sum, so that fp16's range — max 65504 — is not exceeded by the sum), all-reduce, cast back into
    ``tensor`` in place. PyTorch's ``_compress_hook`` does the same operations in the same order."""
    low = tensor.to(dtype).div_(state.world_size)
    state.all_reduce(low)
    return tensor.copy_(low)


def fp16_hook(state: CommState, bucket) -> torch.futures.Future[torch.Tensor]:
    """All-reduce the bucket in ``float16``: half the bytes of float32 (10-bit mantissa, max 65504)."""
    out = cast_allreduce(bucket.buffer(), torch.float16, state)
    state.bucket_done(bucket)
    return done_future(out)


def bf16_hook(state: CommState, bucket) -> torch.futures.Future[torch.Tensor]:
    """All-reduce the bucket in ``bfloat16``: half the bytes, float32's range, 7-bit mantissa."""
    out = cast_allreduce(bucket.buffer(), torch.bfloat16, state)
    state.bucket_done(bucket)
    return done_future(out)


# ------------------------------------------------------------------------------------ per-parameter memory
def bucket_layout(bucket) -> tuple[list[torch.Tensor], list[int]]:
    params = list(bucket.parameters())
    return params, [p.numel() for p in params]


def flat_memory(store: dict[int, torch.Tensor], params, numels, like: torch.Tensor) -> torch.Tensor:
    """The bucket-shaped flat view of per-parameter memories (zeros where none yet)."""
    parts = [store[id(p)].reshape(-1) if id(p) in store else torch.zeros(n, dtype=like.dtype, device=like.device)
             for p, n in zip(params, numels)]
    return torch.cat(parts) if parts else like.new_zeros(0)


def store_memory(store: dict[int, torch.Tensor], params, numels, flat: torch.Tensor) -> None:
    offset = 0
    for p, n in zip(params, numels):
        store[id(p)] = flat[offset:offset + n].clone()
        offset += n
