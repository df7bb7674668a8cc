"""Pipeline parallelism: GPipe and 1F1B schedules, checked, simulated and executed over send/recv.

A model too big for one device is cut into ``p`` consecutive *stages*, one per rank; stage ``s``
receives activations from ``s-1`` and sends its output to ``s+1`` (and gradients the other way in
backward). Run naively, one batch at a time, only one stage computes at any moment. Splitting the
batch into ``m`` *micro-batches* lets the stages work on different micro-batches at once.

* **GPipe** (Huang et al. 2019, "GPipe: Efficient Training of Giant Neural Networks using Pipeline
  Parallelism"): every stage runs the ``m`` forwards, then the ``m`` backwards. With equal stages the
  idle share of the ``p`` devices (the *bubble*) is ``(p-1)/(m+p-1)``, and every stage holds the
  activations of all ``m`` micro-batches before the first backward.
* **1F1B** (PipeDream-Flush, Narayanan et al. 2021, "Memory-Efficient Pipeline-Parallel DNN
  Training"; the schedule of Megatron-LM): stage ``s`` runs ``min(p-s-1, m)`` warm-up forwards, then
  alternates one forward and one backward, then finishes the remaining backwards. Same bubble, but
  stage ``s`` holds at most ``min(p-s, m)`` micro-batches' activations instead of ``m``.

Both are *synchronous* ("flush") schedules: gradients of all micro-batches are accumulated and the
optimizer steps once, so the result equals training on the whole batch (:func:`run_schedule`).

What is here:

* in :mod:`dtrain_lab.parallel.pp_schedule`: :class:`Action`, :func:`schedule` (per-stage lists of
  actions), :func:`validate` (each micro-batch's F and B once per stage, F before B, and a
  step-by-step simulation of the send/recv between neighbours that finds deadlocks and out-of-order
  messages), :func:`peak_in_flight`; :func:`bubble_fraction`, :func:`simulate_timeline` (the ideal
  timeline from the dependencies), :func:`idle_fraction` (of a simulated or a measured timeline);
* in :mod:`dtrain_lab.parallel.pp_stage`, the executor: :func:`split_sequential`,
  :class:`PipelineStage`, :func:`run_schedule` (over ``dist.isend``/``dist.recv`` between neighbour
  ranks; records when each action computed and the activation bytes it kept), :func:`train_step`.

Everything is importable from here.

Launch a demo with ``torchrun --standalone --nproc-per-node 2 -m dtrain_lab.demos.pp_run``.
``torch.distributed.pipelining`` (``PipelineStage``, ``ScheduleGPipe``, ``Schedule1F1B``) is
PyTorch's implementation of the same schedules; ``dtrain_lab.demos.pp_run`` runs both side by side.
"""
from __future__ import annotations

from dtrain_lab.parallel.pp_schedule import (SCHEDULES, Action, PipelineError, as_action, bubble_fraction,
                                             format_schedule, idle_fraction, peak_in_flight, schedule,
                                             simulate_timeline, validate)
from dtrain_lab.parallel.pp_stage import PipelineStage, run_schedule, split_sequential, train_step

__all__ = ["Action", "SCHEDULES", "schedule", "validate", "peak_in_flight", "bubble_fraction",
           "simulate_timeline", "idle_fraction", "format_schedule", "split_sequential", "PipelineStage",
           "run_schedule", "train_step", "PipelineError", "as_action"]
