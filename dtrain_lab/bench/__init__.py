"""Benchmarks: ratios and counts against a reference measured in the same run, never absolute targets.

    python -m dtrain_lab.bench            # or: make bench, dtrain-lab bench
    python -m dtrain_lab.bench --quick    # fewer repeats, smaller messages
    python -m dtrain_lab.bench --only collectives,zero

How every timed row is taken: the compared variants run in the same job, in blocks that alternate
(forward order in even rounds, reversed in odd ones) after a warm-up, and the row gives the median
and the fastest block; what drifts on a shared machine then hits every variant alike.

Rows (``--only`` names in brackets):

* ``launch_overhead`` [launch] — :mod:`~dtrain_lab.bench.rows`: wall and CPU time of ``dtrain_lab.launch``
  (ranks forked from the agent, and fresh Pythons) / a bare ``torchrun`` of the same script, alternating.
* ``launch_output`` [output] — :mod:`~dtrain_lab.bench.rows`: a job whose 2 ranks print 40 MB, through
  ``dtrain_lab.launch`` / bare ``torchrun --redirects 3`` writing it to files, alternating.
* ``ring_vs_all_reduce``, ``busbw`` [collectives] — :mod:`~dtrain_lab.bench.collectives`: our
  send/recv ring all-reduce against gloo's, per size (paired blocks); gloo's bus bandwidth.
* ``ddp_step_time`` [ddp] — ``dtrain_lab.demos.ddp_step_time``: our DDP / PyTorch's, same run;
  ``ddp_overlap`` [ddp] — :mod:`~dtrain_lab.bench.ddp_overlap`: a model of 13 buckets, overlap on
  and off, with the compute and the communication each timed alone.
* ``compression`` [compression] — bytes and final loss of compressed all-reduces / uncompressed.
* ``zero_memory`` [zero] — :mod:`~dtrain_lab.bench.memory`: the peak of live tensor bytes on a rank
  (:mod:`~dtrain_lab.bench.memtrack`) for ZeRO 1, 2 (without and with reduce-in-backward), 3 and
  FSDP2, against the paper's formula, each difference explained.
* ``pipeline_bubble``, ``pipeline_activations`` [pipeline] — measured idle fraction and activation
  bytes of 2 pipeline stages against the formulas.
* ``plan_memory`` [plan] — :mod:`~dtrain_lab.bench.plan_memory`: the planner's predicted peak per
  rank against a 4-rank run of the same layouts.
* ``restart_reliability`` [restarts] — :mod:`~dtrain_lab.bench.restarts`: clean resumes out of N
  trials per way of starting the process group: counts.

Writes ``bench-results/bench.json`` and prints a table. CPU/gloo figures here say nothing about NCCL
on GPUs. The test suite tests the rows' arithmetic and counting (``tests/test_bench.py``), never
runs a measurement.
"""
__all__ = ["main", "table"]


def __getattr__(name: str):      # the ranks' programs under bench/ import this package: keep it light
    if name == "main":
        from dtrain_lab.bench.cli import main
        return main
    if name == "table":
        from dtrain_lab.bench.table import table
        return table
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
