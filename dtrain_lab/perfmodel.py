"""Formulas of the course: the α-β cost of collectives, bus bandwidth, Amdahl's law.

α-β model (Hockney 1994; for collectives Thakur, Rabenseifner & Gropp 2005, "Optimization of
Collective Communication Operations in MPICH"): sending one message of ``n`` bytes costs
``α + n·β`` — a fixed latency α (seconds) plus ``β`` seconds per byte (β = 1 / bandwidth).

A ring of ``p`` ranks does an all-reduce as a reduce-scatter then an all-gather, ``p-1`` steps
each; in every step each rank sends one chunk of ``n/p`` bytes to its neighbour, all links busy at
once:

    T_ring_allreduce(n, p)  = 2(p-1)·α + 2·(p-1)/p · n·β
    T_reduce_scatter(n, p) = T_all_gather(n, p) = (p-1)·α + (p-1)/p · n·β
    T_broadcast (pipelined ring/chain, large n)  ≈ (p-1)·α + n·β
    T_naive_allreduce (gather to rank 0, then broadcast, one message at a time through rank 0)
                            = 2(p-1)·(α + n·β)

The bandwidth term of the ring does not grow with ``p`` (2·(p-1)/p < 2), which is why rings scale;
its latency term does, which is why small messages favour trees (NCCL picks per size).

Bus bandwidth (nccl-tests, doc/PERFORMANCE.md): ``algbw = S / t`` and ``busbw = algbw · factor`` with
factor 2(p-1)/p for all-reduce, (p-1)/p for all-gather and reduce-scatter (S = the whole gathered
array), 1 for broadcast and reduce. busbw is comparable with the hardware link speed whatever ``p``.
"""
from __future__ import annotations

import math

COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce", "all_to_all", "send_recv")
ALGORITHMS = ("ring", "naive")


def _check(nbytes: float, p: int, alpha: float, beta: float) -> None:
    if p < 1 or int(p) != p:
        raise ValueError(f"p (world size) must be a positive integer, got {p!r} / p（world size）必须是正整数")
    if nbytes < 0 or alpha < 0 or beta < 0:
        raise ValueError("nbytes, alpha and beta must be ≥ 0 / nbytes、alpha、beta 不能为负")


def collective_time(op: str, nbytes: float, p: int, alpha: float, beta: float, algorithm: str = "ring") -> float:
    """Predicted seconds for one collective on ``nbytes`` per rank (the whole array for
    reduce-scatter / all-gather), under the α-β model with the given algorithm."""
    _check(nbytes, p, alpha, beta)
    if op not in COLLECTIVES:
        raise ValueError(f"op must be one of {COLLECTIVES}, got {op!r}")
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {algorithm!r}")
    if p == 1:
        return 0.0
    if op == "send_recv":
        return alpha + nbytes * beta
    if algorithm == "naive":
        if op in ("all_reduce",):
            return 2 * (p - 1) * (alpha + nbytes * beta)
        if op in ("broadcast", "reduce"):
            return (p - 1) * (alpha + nbytes * beta)
        # all_gather / reduce_scatter / all_to_all through one root: p-1 messages of n/p in, then out
        return 2 * (p - 1) * (alpha + nbytes / p * beta)
    if op in ("broadcast", "reduce"):  # pipelined along the ring: the root's link carries all n bytes
        return (p - 1) * alpha + nbytes * beta
    steps = 2 * (p - 1) if op == "all_reduce" else p - 1
    return steps * alpha + busbw_factor(op, p) * nbytes * beta


def busbw_factor(op: str, p: int) -> float:
    """nccl-tests' correction factor from algorithm bandwidth to bus bandwidth."""
    if op == "all_reduce":
        return 2 * (p - 1) / p
    if op in ("reduce_scatter", "all_gather", "all_to_all"):
        return (p - 1) / p
    if op in ("broadcast", "reduce", "send_recv"):
        return 1.0
    raise ValueError(f"unknown collective {op!r}")


def bus_bandwidth(op: str, nbytes: float, seconds: float, p: int) -> tuple[float, float]:
    """(algbw, busbw) in bytes/s for one measured collective."""
    if seconds <= 0:
        raise ValueError("seconds must be > 0")
    algbw = nbytes / seconds
    return algbw, algbw * busbw_factor(op, p)


def ring_bytes_sent(nbytes: float, p: int) -> float:
    """Bytes each rank sends in a ring all-reduce of ``nbytes``: 2·(p-1)/p · n."""
    return 0.0 if p == 1 else 2 * (p - 1) / p * nbytes


def fit_alpha_beta(sizes: list[float], seconds: list[float]) -> tuple[float, float]:
    """Fit ``t = α + n·β`` to measured (size, time) points; returns (α, β), both ≥ 0, β > 0.

    Theil-Sen: β is the median of the slopes between all pairs of points, α the median of
    ``t - n·β``. Unlike least squares, one disturbed measurement (another process took the core)
    cannot tilt the line. If noise still leaves no positive slope, β falls back to ``t/n`` of the
    largest message (the bandwidth bound with α = 0), so the fitted bandwidth is never infinite.
    """
    n = len(sizes)
    if n < 2 or n != len(seconds):
        raise ValueError("need at least two (size, time) pairs")
    if len(set(sizes)) < 2:
        raise ValueError("sizes must not all be equal")
    slopes = sorted((seconds[j] - seconds[i]) / (sizes[j] - sizes[i])
                    for i in range(n) for j in range(i + 1, n) if sizes[j] != sizes[i])
    beta = _median(slopes)
    if not beta > 0:
        k = max(range(n), key=lambda i: sizes[i])
        beta = seconds[k] / sizes[k]
    alpha = _median([t - x * beta for x, t in zip(sizes, seconds)])
    return max(alpha, 0.0), beta


def _median(values: list[float]) -> float:
    v = sorted(values)
    m = len(v) // 2
    return v[m] if len(v) % 2 else (v[m - 1] + v[m]) / 2


def amdahl_speedup(parallel_fraction: float, n: int) -> float:
    """Amdahl's law: S(n) = 1 / ((1-P) + P/n)."""
    if not 0 <= parallel_fraction <= 1:
        raise ValueError("parallel_fraction must be in [0, 1]")
    if n < 1:
        raise ValueError("n must be ≥ 1")
    return 1.0 / ((1 - parallel_fraction) + parallel_fraction / n)


def human_bytes(n: float) -> str:
    if n <= 0:
        return "0 B"
    units = ["B", "KiB", "MiB", "GiB", "TiB"]
    i = min(int(math.log(n, 1024)), len(units) - 1)
    return f"{n / 1024 ** i:.3g} {units[i]}"


def fit_collective(op: str, sizes: list[float], seconds: list[float], p: int) -> tuple[float, float]:
    """Fit the per-message α and per-byte β of the ring model to measured times of ``op`` on ``p``
    ranks: a straight line t = a + n·b, then a = steps·α and b = busbw_factor·β."""
    if p < 2:
        raise ValueError("fitting needs p ≥ 2")
    a, b = fit_alpha_beta(sizes, seconds)
    steps = 2 * (p - 1) if op == "all_reduce" else (p - 1)
    factor = busbw_factor(op, p) if op not in ("broadcast", "reduce") else 1.0
    return a / steps, b / factor
