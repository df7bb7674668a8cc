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

Every function takes ``group`` (default: the world) and is a no-op on a world of one.
"""
from __future__ import annotations

import torch
import torch.distributed as dist


def _world(group) -> tuple[int, int]:
    if not dist.is_available() or not dist.is_initialized():
        return 0, 1
    return dist.get_rank(group), dist.get_world_size(group)


def _global(group, r: int) -> int:
    return r if group is None else dist.get_global_rank(group, r)


def _exchange(send: torch.Tensor, recv: torch.Tensor, right: int, left: int, group) -> None:
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
    raise ValueError(f"phase must be 'reduce_scatter' or 'all_gather', got {phase!r}")


def ring_reduce_scatter_(chunks: list[torch.Tensor], group=None) -> int:
    """In place: after it, ``chunks[(rank+1) % p]`` holds the sum over ranks. Returns that index."""
    r, p = _world(group)
    right, left = _global(group, (r + 1) % p), _global(group, (r - 1) % p)
    for send_idx, recv_idx in ring_steps(r, p, "reduce_scatter"):
        buf = torch.empty_like(chunks[recv_idx])
        _exchange(chunks[send_idx], buf, right, left, group)
        chunks[recv_idx].add_(buf)  # received partial sum + my own contribution
    return (r + 1) % p


def ring_all_gather_(chunks: list[torch.Tensor], group=None) -> None:
    """In place: rank ``r`` starts with complete chunk ``(r+1) % p``; ends with all of them."""
    r, p = _world(group)
    right, left = _global(group, (r + 1) % p), _global(group, (r - 1) % p)
    for send_idx, recv_idx in ring_steps(r, p, "all_gather"):
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


def ring_all_reduce(tensor: torch.Tensor, op: str = "sum", group=None) -> torch.Tensor:
    """All-reduce ``tensor`` in place with a ring of send/recv; same result as ``dist.all_reduce``
    (up to floating-point summation order). ``op`` is ``"sum"`` or ``"avg"``."""
    if op not in ("sum", "avg"):
        raise ValueError(f"op must be 'sum' or 'avg', got {op!r}")
    r, p = _world(group)
    if p == 1:
        return tensor
    work = tensor if tensor.is_contiguous() else tensor.contiguous()
    chunks = _chunks(work.view(-1), p)
    ring_reduce_scatter_(chunks, group)
    ring_all_gather_(chunks, group)
    if op == "avg":
        work.div_(p)
    if work is not tensor:
        tensor.copy_(work)
    return tensor


def naive_all_reduce(tensor: torch.Tensor, group=None) -> torch.Tensor:
    """The textbook baseline: every rank sends its whole tensor to rank 0, which sums and sends the
    result back, one message at a time. Rank 0's link carries 2·(p-1)·n bytes: it does not scale."""
    r, p = _world(group)
    if p == 1:
        return tensor
    root = _global(group, 0)
    if r == 0:
        buf = torch.empty_like(tensor)
        for src in range(1, p):
            dist.recv(buf, _global(group, src), group=group)
            tensor.add_(buf)
        for dst in range(1, p):
            dist.send(tensor, _global(group, dst), group=group)
    else:
        dist.send(tensor, root, group=group)
        dist.recv(tensor, root, group=group)
    return tensor


# ------------------------------------------------------------------------------------ measurement
def _sync(device) -> None:
    if torch.device(device).type == "cuda":  # GPU path: kernels are asynchronous
        torch.cuda.synchronize(device)


def _run_op(name: str, buf: torch.Tensor, out: torch.Tensor | None, group) -> None:
    if name == "all_reduce":
        dist.all_reduce(buf, group=group)
    elif name == "ring_all_reduce":
        ring_all_reduce(buf, group=group)
    elif name == "naive_all_reduce":
        naive_all_reduce(buf, group=group)
    elif name == "broadcast":
        dist.broadcast(buf, src=_global(group, 0), group=group)
    elif name == "all_gather":
        dist.all_gather_single(out, buf, group=group)
    elif name == "reduce_scatter":
        dist.reduce_scatter_single(out, buf, group=group)
    else:
        raise ValueError(f"unknown op {name!r}")


def measure_collective(name: str, nbytes: int, *, device="cpu", group=None, min_time: float = 0.05,
                       max_iters: int = 50, warmup: int = 3, repeats: int = 3) -> dict:
    """Time one collective on a float32 buffer of ``nbytes`` (per rank; for all_gather/reduce_scatter
    ``nbytes`` is the whole gathered array, as nccl-tests counts it). Every rank must call it with the
    same arguments. Returns seconds per call (best of ``repeats`` averages, slowest rank) and
    algbw/busbw."""
    from dtrain_lab.perfmodel import bus_bandwidth

    r, p = _world(group)
    numel = max(p, nbytes // 4)
    numel -= numel % p  # all_gather/reduce_scatter need a multiple of p
    buf = torch.ones(numel, dtype=torch.float32, device=device)
    out = None
    if name == "all_gather":
        buf, out = buf[: numel // p].clone(), torch.empty(numel, dtype=torch.float32, device=device)
    elif name == "reduce_scatter":
        out = torch.empty(numel // p, dtype=torch.float32, device=device)
    for _ in range(warmup):
        _run_op(name, buf, out, group)
    # choose the iteration count on rank 0 and share it, so that every rank runs the same number
    dist.barrier(group=group)
    _sync(device)
    t = torch.tensor([0.0], device=device)   # NCCL groups serve CUDA tensors only
    import time

    start = time.perf_counter()
    _run_op(name, buf, out, group)
    _sync(device)
    one = time.perf_counter() - start
    iters = torch.tensor([min(max_iters, max(1, int(min_time / max(one, 1e-6))))], device=device)
    dist.broadcast(iters, src=_global(group, 0), group=group)
    best = float("inf")
    for _ in range(repeats):  # best of a few repeats: the least disturbed by other processes
        dist.barrier(group=group)
        start = time.perf_counter()
        for _ in range(int(iters.item())):
            _run_op(name, buf, out, group)
        _sync(device)
        best = min(best, (time.perf_counter() - start) / int(iters.item()))
    t[0] = best
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    seconds = float(t.item())
    size = numel * 4
    algbw, busbw = bus_bandwidth(name.replace("ring_", "").replace("naive_", ""), size, seconds, p)
    return {"op": name, "bytes": size, "seconds": seconds, "iters": int(iters.item()),
            "algbw": algbw, "busbw": busbw}
