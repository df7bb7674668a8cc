"""``ring_vs_all_reduce`` and ``busbw``: our send/recv ring all-reduce against gloo's ``dist.all_reduce``.

Both are timed in the same job by :mod:`dtrain_lab.demos.bandwidth`, in alternating blocks after a
real warm-up (see its docstring). Per size the row reports the median and the fastest block of each,
and the **paired ratio**: ring block / the gloo block run next to it in the same round, median over
rounds — adjacent blocks share the machine's load at that moment, so their ratio is the least
disturbed figure. No mean over sizes is given: a geometric mean of ratios that vary with the size
says nothing about any size.

What to expect: gloo's all-reduce is one C++ call (a ring, or halving-doubling for some sizes) per
buffer; ours runs 2(p-1) ``isend``/``irecv`` steps from Python with a reduction between them, so at
small sizes the per-step overhead makes it slower (about 1.1–1.3× when the machine is quiet); at large
sizes both are bound by the same memory copies and loopback TCP. On a loaded machine both spread.
"""
from __future__ import annotations

import statistics

from dtrain_lab.jobs.launch import launch


def paired_ratios(a: list[float], b: list[float]) -> list[float]:
    """Block-by-block ratios a/b of two variants timed in the same rounds."""
    return [x / y for x, y in zip(a, b)]


def rows_from_report(metrics: dict, nproc: int) -> tuple[dict, dict]:
    rows = metrics["rows"]
    ref = {x["bytes"]: x for x in rows if x["op"] == "all_reduce"}
    ring = {x["bytes"]: x for x in rows if x["op"] == "ring_all_reduce"}
    per_size = []
    for n in sorted(ref):
        paired = paired_ratios(ring[n]["samples"], ref[n]["samples"])
        per_size.append({"bytes": n, "ring_s": ring[n]["seconds"], "all_reduce_s": ref[n]["seconds"],
                         "ring_min_s": ring[n]["min_s"], "all_reduce_min_s": ref[n]["min_s"],
                         "ratio": statistics.median(paired), "ratio_of_min": ring[n]["min_s"] / ref[n]["min_s"],
                         "paired": paired})
    ratio_row = {"name": "ring_vs_all_reduce", "per_size": per_size, "nproc": nproc, "backend": metrics["backend"],
                 "repeats": metrics["repeats"]}
    bw_row = {"name": "busbw", "backend": metrics["backend"], "nproc": nproc,
              "points": [{"bytes": n, "busbw_MBps": ref[n]["busbw"] / 1e6, "seconds": ref[n]["seconds"],
                          "min_s": ref[n]["min_s"], "iters": ref[n]["iters"]} for n in sorted(ref)]}
    return ratio_row, bw_row


def collectives(max_bytes: int, nproc: int = 2, repeats: int = 7) -> tuple[dict, dict]:
    r = launch("dtrain_lab.demos.bandwidth", nproc=nproc, args=[max_bytes, "all_reduce,ring_all_reduce", repeats],
               timeout=600, quiet=True)
    if not r.ok:
        raise RuntimeError(r.summary())
    return rows_from_report(r.metrics[0], nproc)
