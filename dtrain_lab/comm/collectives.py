"""Collectives written from point-to-point send/recv: the ring all-reduce and its two halves.

Ring all-reduce (Patarasuk & Yuan 2009, "Bandwidth optimal all-reduce algorithms for clusters of
workstations"; the algorithm NCCL's ring and Horovod use): the tensor is cut into ``p`` chunks.

* reduce-scatter, ``p-1`` steps: in step ``s`` rank ``r`` sends chunk ``(r-s) mod p`` to its right
  neighbour and adds the chunk ``(r-s-1) mod p`` it receives from its left one. Afterwards rank
  ``r`` holds the complete sum of chunk ``(r+1) mod p``.
* all-gather, ``p-1`` steps: rank ``r`` passes on the complete chunk it got last; after ``p-1``
  steps every rank has every complete chunk.

Each rank sends 2·(p-1)/p·n bytes in total, whatever ``p``: see :mod:`dtrain_lab.perfmodel`.

Every send is paired with a receive in one ``batch_isend_irecv``: with blocking ``send`` on every
rank first, all ranks could wait for a receiver at once (a deadlock once messages exceed the
transport's buffers) — lesson 10 shows it.

Every function takes ``group`` (default: the world) and is a no-op on a world of one. The ring
functions take an optional ``trace`` list: each send is appended to it as it is posted (phase, step,
source, destination, chunk, elements), which is what lesson 01 draws the ring from.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from dtrain_lab.comm import groups
from dtrain_lab.comm.groups import Group
from dtrain_lab.i18n import LabError

PHASES = ("reduce_scatter", "all_gather")
RING_OPS = ("sum", "avg")


def _exchange(send: torch.Tensor, recv: torch.Tensor, right: int, left: int, group: Group) -> None:
    """Send ``send`` to ``right`` while receiving ``recv`` from ``left``, without deadlock."""
    ops = []
    if send.numel():
        ops.append(dist.P2POp(dist.isend, send, right, group))
    if recv.numel():
        ops.append(dist.P2POp(dist.irecv, recv, left, group))
    if ops:
        for req in dist.batch_isend_irecv(ops):
            req.wait()


def _chunks(flat: torch.Tensor, p: int) -> list[torch.Tensor]:
    # tensor_split: sizes differ by at most one element, so any length works (even < p)
    return list(torch.tensor_split(flat, p))


def ring_steps(rank: int, p: int, phase: str) -> list[tuple[int, int]]:
    """(chunk sent to the right, chunk received from the left) at each of the ``p-1`` steps of
    ``phase`` ("reduce_scatter" or "all_gather") for ``rank``: the whole schedule of the ring."""
    if phase == "reduce_scatter":
        return [((rank - s) % p, (rank - s - 1) % p) for s in range(p - 1)]
    if phase == "all_gather":
        return [((rank + 1 - s) % p, (rank - s) % p) for s in range(p - 1)]
    raise LabError("comm_bad_choice", name="phase", value=phase, choices=", ".join(PHASES))


def _neighbours(group: Group, r: int, p: int) -> tuple[int, int]:
    """Global ranks of the right and left neighbours of group rank ``r`` on the ring."""
    return groups.global_rank(group, (r + 1) % p), groups.global_rank(group, (r - 1) % p)


def _record(trace: list | None, phase: str, step: int, group: Group, r: int, right: int, idx: int,
            chunk: torch.Tensor) -> None:
    if trace is not None:
        trace.append({"phase": phase, "step": step, "src": groups.global_rank(group, r), "dst": right,
                      "chunk": idx, "numel": chunk.numel()})


def ring_reduce_scatter_(chunks: list[torch.Tensor], group: Group = None, trace: list | None = None) -> int:
    """In place: after it, ``chunks[(rank+1) % p]`` holds the sum over ranks. Returns that index.
    ``trace``: a list each send is appended to (see the module docstring)."""
    r, p = groups.rank_size(group)
    right, left = _neighbours(group, r, p)
    for step, (send_idx, recv_idx) in enumerate(ring_steps(r, p, "reduce_scatter")):
        _record(trace, "reduce_scatter", step, group, r, right, send_idx, chunks[send_idx])
        buf = torch.empty_like(chunks[recv_idx])
        _exchange(chunks[send_idx], buf, right, left, group)
        chunks[recv_idx].add_(buf)  # received partial sum + my own contribution
    return (r + 1) % p


def ring_all_gather_(chunks: list[torch.Tensor], group: Group = None, trace: list | None = None) -> None:
    """In place: rank ``r`` starts with complete chunk ``(r+1) % p``; ends with all of them."""
    r, p = groups.rank_size(group)
    right, left = _neighbours(group, r, p)
    for step, (send_idx, recv_idx) in enumerate(ring_steps(r, p, "all_gather")):
        _record(trace, "all_gather", step, group, r, right, send_idx, chunks[send_idx])
        buf = torch.empty_like(chunks[recv_idx])
        _exchange(chunks[send_idx], buf, right, left, group)
        chunks[recv_idx].copy_(buf)  # a complete chunk: overwrite


def simulate_ring(values: list[list[float]]) -> tuple[list[list[float]], list[str]]:
    """Run the ring all-reduce schedule on plain Python lists, one list per rank (one number per
    chunk), and describe each step: the same :func:`ring_steps` the real implementation follows."""
    p = len(values)
    state = [list(v) for v in values]
    log = []
    for phase in ("reduce_scatter", "all_gather"):
        for step in range(p - 1):
            moves = [(r, *ring_steps(r, p, phase)[step]) for r in range(p)]
            sent = {r: state[r][si] for r, si, _ in moves}  # everyone sends at once
            for r, _, ri in moves:
                left = (r - 1) % p
                state[r][ri] = state[r][ri] + sent[left] if phase == "reduce_scatter" else sent[left]
            log.append(f"{phase:<14} step {step + 1}: " + "  ".join(
                f"r{r}:{[round(x, 6) for x in state[r]]}" for r in range(p)))
    return state, log


def ring_all_reduce(tensor: torch.Tensor, op: str = "sum", group: Group = None,
                    trace: list | None = None) -> torch.Tensor:
    """All-reduce ``tensor`` in place with a ring of send/recv; same result as ``dist.all_reduce``
    (up to floating-point summation order). ``op`` is ``"sum"`` or ``"avg"``; ``trace`` records
    every send this rank posts."""
    if op not in RING_OPS:
        raise LabError("comm_bad_choice", name="op", value=op, choices=", ".join(RING_OPS))
    p = groups.size(group)
    if p == 1:
        return tensor
    work = tensor if tensor.is_contiguous() else tensor.contiguous()
    chunks = _chunks(work.view(-1), p)
    ring_reduce_scatter_(chunks, group, trace)
    ring_all_gather_(chunks, group, trace)
    if op == "avg":
        work.div_(p)
    if work is not tensor:
        tensor.copy_(work)
    return tensor


def naive_all_reduce(tensor: torch.Tensor, group: Group = None) -> torch.Tensor:
    """The textbook baseline: every rank sends its whole tensor to rank 0, which sums and sends the
    result back, one message at a time. Rank 0's link carries 2·(p-1)·n bytes: it does not scale."""
    r, p = groups.rank_size(group)
    if p == 1:
        return tensor
    root = groups.global_rank(group, 0)
    if r == 0:
        buf = torch.empty_like(tensor)
        for src in range(1, p):
            dist.recv(buf, groups.global_rank(group, src), group=group)
            tensor.add_(buf)
        for dst in range(1, p):
            dist.send(tensor, groups.global_rank(group, dst), group=group)
    else:
        dist.send(tensor, root, group=group)
        dist.recv(tensor, root, group=group)
    return tensor
