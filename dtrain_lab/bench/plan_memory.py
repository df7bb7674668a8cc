"""Bench row ``plan_memory``: the planner's peak memory per rank against a real run of the same layout.

``dtrain_lab.demos.plan_run`` trains three 4-rank layouts of all five dimensions (tp2·dp2,
pp2·cp2, cp2·dp2·ep2 with MoE) and measures each rank's peak of live tensor storage in one step
(:class:`dtrain_lab.planner.memtrack.PeakMemory`); :func:`dtrain_lab.planner.plan` predicts it for the
same rank from a dry run on fake tensors. The row gives ``measured / predicted`` per rank; the
target is within 5 %. (Calls and bytes per dimension are compared exactly by tests/test_planner.py.)
Not wired into ``python -m dtrain_lab.bench`` by this module: the bench's owner adds
``plan_memory_row`` to its rows.
"""
from __future__ import annotations

from dtrain_lab.jobs.launch import launch

TARGET = 0.05


def predicted(preset: str, degrees: dict, rank: int, world_size: int = 4) -> dict:
    """The planner's figures for ``rank`` of a layout of ``demos.plan_run`` (same micro-batching)."""
    from dtrain_lab.demos.plan_run import M, MB, SEQ
    from dtrain_lab.planner import plan

    return plan(preset, world_size=world_size, rank=rank, precision="fp32", zero=0, microbatches=M,
                micro_batch=MB, seq_len=SEQ, **degrees).to_dict()


def plan_memory_row(nproc: int = 4) -> dict:
    from dtrain_lab.demos.plan_run import LAYOUTS

    r = launch("dtrain_lab.demos.plan_run", nproc=nproc, timeout=600, quiet=True)
    if not r.ok:
        raise RuntimeError(r.summary())
    layouts = {}
    for name, (preset, degrees) in LAYOUTS.items():
        ranks = []
        for rank in sorted(r.metrics):
            got = r.metrics[rank]["layouts"][name]
            pred = predicted(preset, {k: v for k, v in degrees.items() if k != "dp"} | {"dp": degrees["dp"]}, rank)
            ranks.append({"rank": rank, "stage": got["stage"], "measured": got["peak"],
                          "predicted": pred["memory"]["peak"], "ratio": got["peak"] / pred["memory"]["peak"]})
        worst = max(ranks, key=lambda x: abs(x["ratio"] - 1))
        layouts[name] = {"preset": preset, "degrees": degrees, "ranks": ranks, "worst_ratio": worst["ratio"],
                         "within_target": abs(worst["ratio"] - 1) <= TARGET}
    return {"name": "plan_memory", "nproc": nproc, "target": TARGET, "layouts": layouts}
