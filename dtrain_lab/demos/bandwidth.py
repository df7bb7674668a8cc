"""Measure collectives against message size on this machine: time, algbw, busbw — compared variants
timed in alternating blocks.

    torchrun --standalone --nproc-per-node 2 -m dtrain_lab.demos.bandwidth [max_bytes] [ops] [repeats]

``ops`` is a comma-separated list (default ``all_reduce,ring_all_reduce``: gloo's own all-reduce and our
send/recv ring, :func:`dtrain_lab.comm.collectives.ring_all_reduce`); sizes go from 4 KiB up to
``max_bytes`` by factors of 4. How the timing avoids flattering one side:

* **One fixed buffer of zeros per size**, reused by every call: a sum of zeros stays zero, so nothing
  grows to ``inf`` however many calls run (a buffer of ones doubles at every all-reduce on 2 ranks).
* **Warm-up**: every (size, op) pair runs for ``WARMUP_S`` seconds first — the first second of a job
  is slow (page faults, TCP slow start, lazy initialisation), whichever op comes first.
* **Iteration count from a batch, not from one call**: the ranks run ``k`` calls, agree on the
  slowest rank's time, and double ``k`` until a block lasts ``BLOCK_S``; every rank uses the same
  ``k`` (a rank that ran one call more would hang its peers).
* **Alternating blocks**: ``repeats`` rounds; in each, every size runs one block of every op, in
  forward order in even rounds and reversed in odd ones, so that drifting load (other processes on
  the same cores) hits every variant alike. A block's time is the slowest rank's; a row's ``seconds``
  is the median over blocks, ``min_s`` the fastest.

Rows: ``op``, ``bytes``, ``seconds`` (median per call), ``min_s``, ``samples`` (per-call seconds of
every block, in order), ``iters`` (calls per block), ``algbw``/``busbw`` (bytes/s, nccl-tests'
definitions, from the median). Numbers are this machine's: gloo over loopback TCP between CPU
processes here. NCCL over NVLink or InfiniBand is orders of magnitude faster and has other crossover
points: never carry these figures over to GPUs.
"""
from __future__ import annotations

import statistics
import sys
import time

import torch
import torch.distributed as dist

from dtrain_lab import caps
from dtrain_lab.comm import groups
from dtrain_lab.comm.collectives import naive_all_reduce, ring_all_reduce
from dtrain_lab.jobs import runtime
from dtrain_lab.perfmodel import bus_bandwidth

WARMUP_S = 0.25          # per (size, op), before anything is timed
BLOCK_S = 0.05           # a timed block lasts at least this long
MAX_ITERS = 4096


def _buffers(op: str, numel: int, p: int, device) -> tuple[torch.Tensor, torch.Tensor | None]:
    buf = torch.zeros(numel, dtype=torch.float32, device=device)
    if op == "all_gather":
        return buf[: numel // p].clone(), buf
    if op == "reduce_scatter":
        return buf, torch.zeros(numel // p, dtype=torch.float32, device=device)
    return buf, None


def _call(op: str, buf: torch.Tensor, out: torch.Tensor | None) -> None:
    if op == "all_reduce":
        dist.all_reduce(buf)
    elif op == "ring_all_reduce":
        ring_all_reduce(buf)
    elif op == "naive_all_reduce":
        naive_all_reduce(buf)
    elif op == "broadcast":
        dist.broadcast(buf, src=0)
    elif op == "all_gather":
        dist.all_gather_single(out, buf)
    elif op == "reduce_scatter":
        dist.reduce_scatter_single(out, buf)
    else:
        raise SystemExit(f"unknown op {op!r}")


def _block(op: str, bufs, k: int, device) -> float:
    """Seconds per call of ``k`` calls, the slowest rank's."""
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(k):
        _call(op, *bufs)
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()
    t = torch.tensor([time.perf_counter() - t0], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item()) / k


def _calibrate(op: str, bufs, device) -> int:
    """Warm up for WARMUP_S, then the number of calls that makes a block last BLOCK_S (same on all ranks)."""
    k, spent = 1, 0.0
    while spent < WARMUP_S:               # warm-up: every rank runs the same doubling sequence
        spent += _block(op, bufs, k, device) * k
        k = min(2 * k, MAX_ITERS)
    k = 1
    while k < MAX_ITERS and _block(op, bufs, k, device) * k < BLOCK_S:
        k *= 2
    return k


def measure(ops: list[str], sizes: list[int], repeats: int, device) -> list[dict]:
    p = groups.size()
    bufs, iters, samples = {}, {}, {}
    for size in sizes:
        numel = max(p, size // 4)
        numel -= numel % p                 # all_gather/reduce_scatter need a multiple of p
        for op in ops:
            bufs[op, size] = _buffers(op, numel, p, device)
            iters[op, size] = _calibrate(op, bufs[op, size], device)
            samples[op, size] = []
    for r in range(repeats):
        for size in sizes:
            for op in (ops if r % 2 == 0 else ops[::-1]):
                samples[op, size].append(_block(op, bufs[op, size], iters[op, size], device))
    rows = []
    for op in ops:
        for size in sizes:
            nbytes = bufs[op, size][0].numel() * 4 * (p if op == "all_gather" else 1)
            med = statistics.median(samples[op, size])
            algbw, busbw = bus_bandwidth(op.replace("ring_", "").replace("naive_", ""), nbytes, med, p)
            rows.append({"op": op, "bytes": nbytes, "seconds": med, "min_s": min(samples[op, size]),
                         "samples": samples[op, size], "iters": iters[op, size], "algbw": algbw, "busbw": busbw})
    return rows


def main() -> None:
    rt = runtime.current()
    if not caps.have("cuda"):
        torch.set_num_threads(1)          # CPU ranks share the machine's cores
    max_bytes = int(float(sys.argv[1])) if len(sys.argv) > 1 else 16 << 20
    ops = sys.argv[2].split(",") if len(sys.argv) > 2 else ["all_reduce", "ring_all_reduce"]
    repeats = int(sys.argv[3]) if len(sys.argv) > 3 else 5
    sizes = []
    n = 4 << 10
    while n <= max_bytes:
        sizes.append(n)
        n *= 4
    rows = measure(ops, sizes, repeats, rt.device)
    runtime.report(rows=rows, world_size=rt.world_size, backend=rt.backend, repeats=repeats,
                   block_s=BLOCK_S, warmup_s=WARMUP_S)
    runtime.print0(f"measured {len(rows)} points ({', '.join(ops)}) on {rt.world_size} ranks with {rt.backend}, "
                   f"{repeats} alternating blocks each")


if __name__ == "__main__":
    runtime.entrypoint(main)
