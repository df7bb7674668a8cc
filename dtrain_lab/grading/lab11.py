"""Lab 11 — NCCL configuration: the contract of its one launched exercise (what a submission may import).

Five of the lab's six exercises are ``.env`` files that the grader reads and never runs; their
checks, and the machines they describe, live outside the sandbox (``dtrain_lab.grading.checks.lab11``).

The sixth, ``eval_timeout``, is a program: every rank's ``run()`` returns the mean metric over the
validation set. The validation set is **rank 0's alone** (it loaded it; the other ranks hold none of
it), drawn for every graded run from a seed no rank sees: rank 0 must share either the samples or
the result, and whoever evaluates pays :data:`SECONDS_PER_SAMPLE` per sample, so that rank 0 alone
needs longer than the grader's process-group timeout (:data:`PG_TIMEOUT_S`).
"""
from __future__ import annotations

import time

from dtrain_lab.grading import contract

LAB = "lab_11"
VAL_SIZE = 16
SECONDS_PER_SAMPLE = 0.5      # the whole validation set: 8 s on one rank
PG_TIMEOUT_S = 4.0            # the grader's process-group timeout, standing for PyTorch's default 10 minutes


def make_inputs(seed: int, world: int) -> list[dict]:
    """Every rank's private inputs: rank 0 holds the validation samples, the others nothing."""
    g = contract.rng(seed, "val", 0)
    samples = [round(g.uniform(0.0, 1.0), 6) for _ in range(VAL_SIZE)]
    return [{"val": samples if r == 0 else None} for r in range(world)]


def val_samples() -> list[float]:
    """Rank 0 only: the ``VAL_SIZE`` validation samples (plain numbers)."""
    held = contract.mine(make_inputs)["val"]
    if held is None:
        from dtrain_lab.i18n import LabError

        raise LabError("lab11_val_on_rank0")
    return list(held)


def val_score(sample: float) -> float:
    """The metric of one validation sample (a stand-in for a forward pass and a metric)."""
    return round(float(sample) ** 2, 9)


def evaluate(samples) -> float:
    """The summed metric over ``samples`` (numbers from :func:`val_samples`, a list or a tensor);
    costs ``SECONDS_PER_SAMPLE`` per sample, like a real model."""
    values = samples.reshape(-1).tolist() if hasattr(samples, "reshape") else list(samples)
    time.sleep(SECONDS_PER_SAMPLE * len(values))
    return sum(val_score(v) for v in values)
