"""Lab 04 — top-k sparsification with error feedback: the contract (what a submission may import).

Two exercises, each a function the learner writes in the lab notebook
(``solutions/_source/lab_04_compression.md``):

1. ``sparse_allreduce(values, indices, numel, group=None)``: every rank holds ``k`` values and their
   ``k`` positions in a gradient of ``numel`` entries (``k`` the same on every rank, the positions
   not); return the dense average over the ranks. The positions differ from rank to rank, so this
   is two all-gathers (values, indices) and a scatter-add, never an all-reduce of the indices.
2. ``topk_ef_step(grad, residual, k, group=None) -> (update, new_residual)``: top-k with error
   feedback (Stich, Cordonnier & Jaggi, "Sparsified SGD with Memory", NeurIPS 2018): add the
   residual, keep the ``k`` entries of largest magnitude, exchange them as in exercise 1, and keep
   what was not sent: ``new_residual = (grad + residual) − sent``.

The learner's file ends with a ``run()`` that hands the function to a driver here
(:func:`sparse_cases`, :func:`ef_cases`). Every rank's values and gradients are private to it and
drawn for every grade (:func:`make_inputs`): the average exists only after the ranks communicate.
The checks (``dtrain_lab.grading.checks.lab04``) compare with the course's reference outside the
sandbox; inside it ``dtrain_lab.parallel.compression`` cannot be imported (it would be the answer).
"""
from __future__ import annotations

import torch

from dtrain_lab.grading import contract

LAB = "lab_04"
# the notebook's illustration (the graded hand-made case keeps these positions, with values of its own)
HAND_VALUES = [[1.5, -2.0], [0.5, 4.0], [-1.0, 2.5]]
HAND_INDICES = [[1, 6], [6, 3], [0, 1]]          # rank 0 and rank 1 both chose 6; 1 + 6 = 7: nobody chose 7
SHARED_INDICES = [2, 5, 11, 14]

# "large": a dense exchange of this case alone sends megabytes, which the kernel's byte counters of the
# job's network namespace see from outside (checks.lab04._bytes_from_outside); k values and k indices
# are a few hundred bytes
LARGE = 1 << 18
SPARSE_CASES = [("hand-made", 8, 2), ("same positions on every rank", 16, 4), ("random", 1000, 10),
                ("large", LARGE, 32)]
EF_CASES = [("hand-made", 6, 2, 4), ("random", 200, 10, 4), ("large", LARGE, 32, 2)]    # (name, numel, k, steps)
MIN_GAP = 1e-3    # the k-th and (k+1)-th largest magnitudes of every top-k input differ by at least this


def _values(g: torch.Generator, n: int) -> torch.Tensor:
    """``n`` values of distinct magnitudes (multiples of 1/64 between 0.25 and 4, random signs)."""
    mags = (torch.randperm(240, generator=g)[:n].double() + 16) / 64
    signs = torch.randint(0, 2, (n,), generator=g).double() * 2 - 1
    return (mags * signs).float()


def _ef_ok(grads: torch.Tensor, k: int) -> bool:
    """The top-k selection of every step (with error feedback) is unambiguous, by a clear margin."""
    residual = torch.zeros(grads.shape[1])
    for g in grads:
        x = g + residual
        mags, idx = x.abs().topk(min(k + 1, len(x)))
        if len(mags) > k and float(mags[k - 1] - mags[k]) < MIN_GAP:
            return False
        idx = idx[:k]
        residual = x.clone()
        residual[idx] = 0
    return True


def _ef_grads(seed: int, name: str, numel: int, k: int, steps: int, rank: int) -> torch.Tensor:
    for attempt in range(100):
        g = contract.torch_generator(seed, f"ef:{name}:{attempt}", rank)
        if name == "hand-made":   # the same gradient every step: error feedback sends every entry sooner or later
            grads = _values(g, numel).repeat(steps, 1)
        else:
            grads = torch.randn(steps, numel, generator=g)
        if _ef_ok(grads, k):
            return grads
    raise RuntimeError("no unambiguous top-k gradients drawn")   # never seen: 100 draws


def make_inputs(seed: int, world: int) -> list[dict]:
    """Every rank's private values/indices (exercise 1) and gradients (exercise 2)."""
    out = []
    for r in range(world):
        g = contract.torch_generator(seed, "sparse", r)
        sparse = {
            "hand-made": [_values(g, 2), torch.tensor(HAND_INDICES[r % 3])],
            "same positions on every rank": [_values(g, 4), torch.tensor(SHARED_INDICES)],
            "random": [_values(g, 10), torch.randperm(1000, generator=g)[:10]],
            "large": [_values(g, 32), torch.randperm(LARGE, generator=g)[:32]],
        }
        ef = {name: _ef_grads(seed, name, numel, k, steps, r) for name, numel, k, steps in EF_CASES}
        out.append({"sparse": sparse, "ef": ef})
    return out


def _device():
    from dtrain_lab.jobs import runtime

    return runtime.current().device


def sparse_input(name: str, rank: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(values, indices)`` of this rank in case ``name`` (float32 and int64, ``k`` each)."""
    values, indices = contract.mine(make_inputs, rank)["sparse"][name]
    return values.clone(), indices.clone()


def sparse_cases(sparse_allreduce) -> dict:
    """Driver of exercise 1: ``{case name: sparse_allreduce(values, indices, numel)}``."""
    out = {}
    for name, numel, _ in SPARSE_CASES:
        values, indices = sparse_input(name)
        out[name] = sparse_allreduce(values.to(_device()), indices.to(_device()), numel)
    return out


def ef_grad(name: str, step: int, rank: int | None = None) -> torch.Tensor:
    """This rank's gradient at ``step`` of case ``name``."""
    return contract.mine(make_inputs, rank)["ef"][name][step].clone()


def ef_cases(topk_ef_step) -> dict:
    """Driver of exercise 2: for each case, ``steps`` calls of ``topk_ef_step`` starting from a zero
    residual, each fed the residual the previous call returned. ``{case: [(update, residual), ...]}``."""
    out = {}
    for name, numel, k, steps in EF_CASES:
        residual = torch.zeros(numel, device=_device())
        record = []
        for step in range(steps):
            update, residual = topk_ef_step(ef_grad(name, step).to(_device()), residual, k)
            record.append((update.detach().cpu().clone(), residual.detach().cpu().clone()))
        out[name] = record
    return out
