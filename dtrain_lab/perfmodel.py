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

The naive algorithms go through one root, one message at a time over the root's link:

    T_naive_allreduce      = 2(p-1)·(α + n·β)      every peer's n bytes in, the n-byte sum out to each
    T_naive_all_gather     = (p-1)·(α + n/p·β) + (p-1)·(α + n·β)
                                                    each peer's shard in, the whole n-byte array out to each
    T_naive_reduce_scatter = (p-1)·(α + n·β) + (p-1)·(α + n/p·β)
                                                    each peer's whole n-byte array in, its reduced shard out
    T_naive_all_to_all     = 2(p-1)·(α + (p-1)/p·n·β)   what each peer sends to others in, what it gets out

One direction of an all-gather or reduce-scatter through a root carries all n bytes per peer: the
naive cost is (p-1)(1+1/p)·n·β, not the 2(p-1)/p·n·β one would get by moving shards only.

The bandwidth term of the ring does not grow with ``p`` (2·(p-1)/p < 2), which is why rings scale;
its latency term does, which is why small messages favour trees (NCCL picks per size).

Bus bandwidth (nccl-tests, doc/PERFORMANCE.md): ``algbw = S / t`` and ``busbw = algbw · factor`` with
factor 2(p-1)/p for all-reduce, (p-1)/p for all-gather and reduce-scatter (S = the whole gathered
array), 1 for broadcast and reduce. busbw is comparable with the hardware link speed whatever ``p``.
"""
from __future__ import annotations

import math

from dtrain_lab.i18n import LabError, tr

COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce", "all_to_all", "send_recv")
ALGORITHMS = ("ring", "naive")


def _check(nbytes: float, p: int, alpha: float, beta: float) -> None:
    if isinstance(p, bool) or not isinstance(p, (int, float)) or p < 1 or int(p) != p:
        raise LabError("perf_bad_p", value=p)
    if nbytes < 0 or alpha < 0 or beta < 0:
        raise LabError("perf_negative", nbytes=nbytes, alpha=alpha, beta=beta)


def collective_time(op: str, nbytes: float, p: int, alpha: float, beta: float, algorithm: str = "ring") -> float:
    """Predicted seconds for one collective on ``nbytes`` per rank (the whole array for
    reduce-scatter / all-gather), under the α-β model with the given algorithm."""
    _check(nbytes, p, alpha, beta)
    if op not in COLLECTIVES:
        raise LabError("perf_bad_op", value=op, choices=", ".join(COLLECTIVES))
    if algorithm not in ALGORITHMS:
        raise LabError("perf_bad_algorithm", value=algorithm, choices=", ".join(ALGORITHMS))
    if p == 1:
        return 0.0
    if op == "send_recv":
        return alpha + nbytes * beta
    if algorithm == "naive":
        if op in ("all_reduce",):
            return 2 * (p - 1) * (alpha + nbytes * beta)
        if op in ("broadcast", "reduce"):
            return (p - 1) * (alpha + nbytes * beta)
        if op == "all_to_all":     # what each peer sends to the others in, what it receives out
            return 2 * (p - 1) * (alpha + (p - 1) / p * nbytes * beta)
        # all_gather / reduce_scatter through one root: the shards one way, the whole array the other
        return (p - 1) * (alpha + nbytes / p * beta) + (p - 1) * (alpha + nbytes * beta)
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
    raise LabError("perf_bad_op", value=op, choices=", ".join(COLLECTIVES))


def bus_bandwidth(op: str, nbytes: float, seconds: float, p: int) -> tuple[float, float]:
    """(algbw, busbw) in bytes/s for one measured collective."""
    if not seconds > 0:
        raise LabError("perf_bad_seconds", value=seconds)
    algbw = nbytes / seconds
    return algbw, algbw * busbw_factor(op, p)


RING_OPS = ("all_reduce", "reduce_scatter", "all_gather")


def ring_bytes_sent(nbytes: float, p: int, op: str = "all_reduce") -> float:
    """Bytes each rank sends in a ring ``op`` on a buffer of ``nbytes`` (the whole array for
    reduce-scatter and all-gather): all-reduce 2·(p-1)/p · n; reduce-scatter and all-gather (p-1)/p · n
    (p-1 steps, one chunk of n/p each). The one ring-byte formula of the library: ZeRO's ``comm_bytes``
    and the counted collectives (:mod:`dtrain_lab.comm.counted`) use it. Exact for integer ``nbytes``
    divisible by ``p`` (the numerator is multiplied out before the one division)."""
    if op not in RING_OPS:
        raise LabError("perf_bad_op", value=op, choices=", ".join(RING_OPS))
    _check(nbytes, p, 0.0, 0.0)
    steps = 2 * (p - 1) if op == "all_reduce" else p - 1
    return 0.0 if p == 1 else steps * nbytes / p


def fit_alpha_beta(sizes: list[float], seconds: list[float]) -> tuple[float, float]:
    """Fit ``t = α + n·β`` to measured (size, time) points; returns (α, β), both ≥ 0, β > 0.

    Theil-Sen: β is the median of the slopes between all pairs of points, α the median of
    ``t - n·β``. Unlike least squares, one disturbed measurement (another process took the core)
    cannot tilt the line. If noise still leaves no positive slope, β falls back to ``t/n`` of the
    largest message (the bandwidth bound with α = 0), so the fitted bandwidth is never infinite.
    """
    n = len(sizes)
    if n < 2 or n != len(seconds) or len(set(sizes)) < 2:
        raise LabError("perf_fit_points", sizes=n, seconds=len(seconds))
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
        raise LabError("perf_bad_fraction", value=parallel_fraction)
    if n < 1:
        raise LabError("perf_bad_p", value=n)
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
        raise LabError("perf_fit_p", value=p)
    a, b = fit_alpha_beta(sizes, seconds)
    steps = 2 * (p - 1) if op == "all_reduce" else (p - 1)
    factor = busbw_factor(op, p) if op not in ("broadcast", "reduce") else 1.0
    return a / steps, b / factor


# ------------------------------------------------------------------------------------ ZeRO / FSDP
# Rajbhandari, Rasley, Ruwase & He, "ZeRO: Memory Optimizations Toward Training Trillion Parameter
# Models" (SC 2020). Section 5: model-state memory per device; section 7: communication volume.

ZERO_STAGES = (0, 1, 2, 3)
ZERO_PRECISIONS = ("mixed", "fp32")
# bytes per parameter of (params, grads, optimizer state) — paper section 3.1 / 5
_ZERO_BYTES = {"mixed": (2, 2, 12),   # fp16/bf16 params and grads; fp32 master + Adam m + v (K = 12)
               "fp32": (4, 4, 8)}     # fp32 params and grads; Adam m + v, no master copy


def _zero_check(num_params, stage, world_size) -> None:
    if isinstance(num_params, bool) or not isinstance(num_params, (int, float)) \
            or not math.isfinite(num_params) or num_params <= 0:
        raise LabError("zero_bad_params", value=num_params)
    if isinstance(stage, bool) or stage not in ZERO_STAGES:
        raise LabError("zero_bad_stage", value=stage)
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise LabError("zero_bad_world", value=world_size)


def zero_memory(num_params: float, stage: int, world_size: int, *, precision: str = "mixed",
                k: float | None = None) -> dict:
    """Model-state bytes per device under ZeRO stage ``stage`` on ``world_size`` data-parallel ranks.

    ZeRO paper, section 5 (Ψ = ``num_params``, N = ``world_size``). Mixed-precision Adam keeps
    2Ψ bytes of fp16 parameters, 2Ψ of fp16 gradients and KΨ of optimizer state with K = 12 (an fp32
    master copy, Adam's m and v: 4 + 4 + 4). ``precision="fp32"``: 4Ψ + 4Ψ + 8Ψ (m and v, no master).

    * stage 0 (plain data parallel): nothing divided — (2 + 2 + K)Ψ
    * stage 1 (P_os): optimizer state / N — 2Ψ + 2Ψ + KΨ/N
    * stage 2 (P_os+g): gradients and optimizer state / N — 2Ψ + (2 + K)Ψ/N
    * stage 3 (P_os+g+p): everything / N — (2 + 2 + K)Ψ/N

    ``k`` overrides the optimizer bytes per parameter (e.g. 4 for SGD with momentum in fp32).
    Returns ``{"params", "grads", "optimizer", "total"}`` in bytes; activations, temporary
    buffers and fragmentation are not model states and are not counted. The paper's example:
    Ψ = 7.5e9, N = 64 gives 120 GB, 31.4 GB, 16.6 GB and 1.9 GB (1 GB = 1e9 bytes).
    """
    _zero_check(num_params, stage, world_size)
    if precision not in ZERO_PRECISIONS:
        raise LabError("zero_bad_precision", value=precision, choices=", ".join(ZERO_PRECISIONS))
    bp, bg, bo = _ZERO_BYTES[precision]
    if k is not None:
        if isinstance(k, bool) or not isinstance(k, (int, float)) or not math.isfinite(k) or k < 0:
            raise LabError("zero_bad_k", value=k)
        bo = k
    n = world_size
    params = bp * num_params / (n if stage >= 3 else 1)
    grads = bg * num_params / (n if stage >= 2 else 1)
    optimizer = bo * num_params / (n if stage >= 1 else 1)
    return {"params": params, "grads": grads, "optimizer": optimizer, "total": params + grads + optimizer}


def zero_comm_volume(num_params: float, stage: int, world_size: int, bytes_per_elem: float = 2) -> dict:
    """Bytes each rank sends per training step for the gradients/parameters of a ZeRO stage.

    ZeRO paper, section 7 (communication analysis), counted from the ring algorithms: a
    reduce-scatter and an all-gather of a Ψ-element buffer each send (N-1)/N · Ψ elements per rank;
    an all-reduce is both.

    * stage 0 (DDP): one all-reduce of the gradients — 2Ψ·(N-1)/N
    * stages 1 and 2: reduce-scatter the gradients, all-gather the updated parameters —
      2Ψ·(N-1)/N, the same as DDP (the paper's "2Ψ", its N → ∞ limit)
    * stage 3: all-gather the parameters in forward, again in backward, reduce-scatter the
      gradients — 3Ψ·(N-1)/N, 1.5× DDP (the paper's "3Ψ")

    Returns ``{"all_reduce", "reduce_scatter", "all_gather", "total", "paper", "vs_ddp"}``:
    bytes sent by each kind of collective and in all, the paper's N → ∞ figure (2Ψ or 3Ψ times
    ``bytes_per_elem``), and ``total`` divided by DDP's.
    """
    _zero_check(num_params, stage, world_size)
    if isinstance(bytes_per_elem, bool) or not isinstance(bytes_per_elem, (int, float)) or not bytes_per_elem > 0:
        raise LabError("zero_bad_bytes", value=bytes_per_elem)
    n = world_size
    one = (n - 1) / n * num_params * bytes_per_elem        # one reduce-scatter or one all-gather
    if stage == 0:
        parts = {"all_reduce": 2 * one, "reduce_scatter": 0.0, "all_gather": 0.0}
        paper = 2 * num_params * bytes_per_elem
    elif stage in (1, 2):
        parts = {"all_reduce": 0.0, "reduce_scatter": one, "all_gather": one}
        paper = 2 * num_params * bytes_per_elem
    else:
        parts = {"all_reduce": 0.0, "reduce_scatter": one, "all_gather": 2 * one}
        paper = 3 * num_params * bytes_per_elem
    total = sum(parts.values())
    return {**parts, "total": total, "paper": paper, "vs_ddp": (total / (2 * one)) if n > 1 else 1.0}


def weights_only_bytes(num_params: float, bytes_per_param: float = 4) -> float:
    """Bytes of the weights alone (4 per parameter in fp32): what "a 7B model needs 28 GB" counts.
    Training also holds gradients and optimizer state, see :func:`zero_memory`."""
    _zero_check(num_params, 0, 1)
    return bytes_per_param * num_params


def memory_table(num_params: float, world_size: int, *, k: float | None = None) -> list[dict]:
    """Model-state bytes per device for ZeRO stages 0–3 in both precisions: the rows of the lesson's
    table. Each row: ``stage``, ``precision``, ``params``, ``grads``, ``optimizer``, ``total``
    (bytes) and ``total_gb`` (1 GB = 1e9 bytes).

    It corrects a table that circulates widely: "a 7B model needs 28 GB on one card, 14 GB with
    ZeRO-2, 7 GB with ZeRO-3". 28 GB is the fp32 *weights only* (4 × 7e9 bytes). Training with
    mixed-precision Adam holds 16 bytes per parameter of model states — 112 GB for 7B before any
    activation — and ZeRO divides by the number of ranks N, not by 2 or 4: ZeRO-3 on N = 8 ranks
    needs 112/8 = 14 GB per card, on N = 64 about 1.75 GB.
    """
    rows = []
    for precision in ZERO_PRECISIONS:
        for stage in ZERO_STAGES:
            m = zero_memory(num_params, stage, world_size, precision=precision,
                            k=k if precision == "mixed" else None)
            rows.append({"stage": stage, "precision": precision, **m, "total_gb": m["total"] / 1e9})
    return rows


def format_memory_table(rows: list[dict], lang: str | None = None) -> str:
    """``memory_table`` rows as a Markdown table, headers in the learner's language (GB = 1e9 B)."""
    out = [tr("perf_memory_table_head", lang), "|---|---|---|---|---|---|"]
    names = {"mixed": tr("perf_precision_mixed", lang), "fp32": "fp32"}
    for r in rows:
        out.append(f"| ZeRO-{r['stage']} | {names[r['precision']]} | " +
                   " | ".join(f"{r[key] / 1e9:.3g} GB" for key in ("params", "grads", "optimizer", "total")) + " |")
    return "\n".join(out)
