"""Lab 02 — gradient buckets: the references and checks, run in the grader's process.

References computed here without any collective: DDP's bucket rule (:func:`reference_buckets`, the
rule of ``dtrain_lab.parallel.ddp.DDP._build_buckets``, a test checks they agree; PyTorch's reducer
makes the same buckets, one dtype each, when it rebuilds them in gradient-ready order after the first
iteration, and lists them in another order when the dtypes are mixed) and single-process training on
the global batch, which is every rank's private shard put together (PyTorch's DDP equals it:
``tests/test_ddp.py``). No rank had the other ranks' shards:
a gradient equal to the global batch's is proof that the ranks communicated.

The ranks' traces of collectives are checked too (self-reported, so they explain rather than prove):
one all-reduce per bucket and step, of the bucket's size, in bucket order. Exercise 3's overlap is
observed inside the rank (how many all-reduces had been issued when backward reached the input): a
submission that rewrites the driver could forge it, which the instructor guide says.
"""
from __future__ import annotations

import math
import operator

import torch
import torch.nn.functional as F

from dtrain_lab.i18n import rendered
from dtrain_lab.grading import lab02 as contract
from dtrain_lab.grading import patterns
from dtrain_lab.grading.channel import short
from dtrain_lab.grading.exercise import Exercise, problem

LAB = contract.LAB
HIDE = ("dtrain_lab.parallel.ddp", "dtrain_lab.parallel.ddp_parts")   # the course's DDP would be the answer


def _nbytes(p: torch.Tensor) -> int:
    return p.numel() * p.element_size()


# ------------------------------------------------------------------ 1. the bucket rule
def reference_buckets(params, cap_bytes: int) -> list[list[int]]:
    """DDP's rule (``dtrain_lab.parallel.ddp.DDP._build_buckets``): a bucket is one flat buffer, so it
    holds one dtype on one device. Walk the parameters in **reverse** registration order (backward
    produces the gradients of the last layers first) and keep one open bucket per (dtype, device):
    append each parameter to the open bucket of its dtype and device, and close that bucket as soon as
    it holds at least ``cap_bytes`` bytes; the buckets still open at the end are kept too. A parameter
    larger than the cap therefore closes the bucket it joins (it does not get a bucket of its own).
    Each bucket lists its indices in the order they were added, and the buckets are ordered by their
    first parameter in the reverse walk (with one dtype: the order they were closed in).

    PyTorch's ``torch.distributed._compute_bucket_assignment_by_size`` (given the reversed parameters,
    ``[cap_bytes]`` and their indices, as DDP rebuilds its buckets after the first iteration) makes
    the same buckets; with mixed dtypes it lists them in another order (closed buckets in closing order,
    then the ones left open, in an order its implementation sets). ``tests/test_lab02_04.py`` checks both."""
    open_: dict[tuple, list] = {}
    buckets: list[list[int]] = []
    for i in reversed(range(len(params))):
        key = (params[i].dtype, params[i].device)
        current = open_.setdefault(key, [[], 0])
        current[0].append(i)
        current[1] += _nbytes(params[i])
        if current[1] >= cap_bytes:
            buckets.append(current[0])
            del open_[key]
    buckets += [current for current, _ in open_.values()]
    return sorted(buckets, key=lambda b: -b[0])


BUCKET_NUMELS = [sum(p.numel() for i, p in enumerate(contract.lab_model().parameters()) if i in b)
                 for b in contract.BUCKETS]


def _stream(params, cap, order, full) -> list[list[int]]:
    """One stream of buckets over ``order``, whatever the dtype: a bucket closes once ``full(size, cap)``."""
    buckets, current, size = [], [], 0
    for i in order:
        current.append(i)
        size += _nbytes(params[i])
        if full(size, cap):
            buckets.append(current)
            current, size = [], 0
    return buckets + ([current] if current else [])


def _forward_order(params, cap):
    """The same rule in registration order (a plausible slip)."""
    return _stream(params, cap, range(len(params)), operator.ge)


def _strictly_over(params, cap):
    """Closes a bucket only once it holds *more* than the cap."""
    return _stream(params, cap, reversed(range(len(params))), operator.gt)


def _close_before(params, cap):
    """Starts a new bucket when adding a parameter would exceed the cap (buckets never exceed it)."""
    buckets, current, size = [], [], 0
    for i in reversed(range(len(params))):
        n = _nbytes(params[i])
        if current and size + n > cap:
            buckets.append(current)
            current, size = [], 0
        current.append(i)
        size += n
    return buckets + ([current] if current else [])


def _as_if_float32(params, cap):
    """Counts 4 bytes per element whatever the dtype."""
    return reference_buckets([torch.empty(p.numel(), dtype=torch.float32) for p in params], cap)


def _one_stream(params, cap):
    """One stream of buckets whatever the dtype (a flat buffer holds one dtype)."""
    return _stream(params, cap, reversed(range(len(params))), operator.ge)


def _in_closing_order(params, cap):
    """One bucket per dtype, but listed as they were closed, then the ones left open (close to PyTorch's order)."""
    open_, buckets = {}, []
    for i in reversed(range(len(params))):
        current = open_.setdefault(params[i].dtype, [[], 0])
        current[0].append(i)
        current[1] += _nbytes(params[i])
        if current[1] >= cap:
            buckets.append(open_.pop(params[i].dtype)[0])
    return buckets + [current for current, _ in open_.values()]


# the two dtype slips first: on a mixed case, a single-stream slip's buckets can coincide with one stream's
_BUCKET_HINTS = [(_one_stream, "lab02_hint_one_stream"), (_in_closing_order, "lab02_hint_bucket_order"),
                 (_forward_order, "lab02_hint_forward_order"), (_strictly_over, "lab02_hint_strictly_over"),
                 (_close_before, "lab02_hint_close_before"), (_as_if_float32, "lab02_hint_float32")]


def _as_buckets(value):
    try:
        return [[int(i) for i in b] for b in value]
    except (TypeError, ValueError):
        return None


def _check_buckets(run, rank, result):
    """Every case of this grade against :func:`reference_buckets`; the first two wrong cases are
    shown, with the explanation of the first slip recognised."""
    if not isinstance(result, dict):
        return [problem("lab02_want_cases", got=short(result))]
    wrong, hint = [], None
    for name, sizes, cap in run.inputs[0]["bucket_cases"]:
        params = contract.case_params(sizes)
        want = reference_buckets(params, cap)
        got = _as_buckets(result.get(name))
        if got == want:
            continue
        wrong.append(problem("lab02_case_wrong", name=name, sizes=[_nbytes(p) for p in params], cap=cap, want=want,
                             got=short(result.get(name))))
        if hint is None:
            hint = next((problem(key) for rule, key in _BUCKET_HINTS if got == rule(params, cap)), None)
        if hint is None and got is not None and [sorted(b) for b in got] == [sorted(b) for b in want]:
            hint = problem("lab02_hint_order_within")
    out = wrong[:2]
    if len(wrong) > 2:
        out.append(problem("grade_more_cases", n=len(wrong) - 2))
    return out + ([hint] if hint else [])


# ------------------------------------------------------------------ 2. one all-reduce per bucket
def reference_training(inputs: list, steps: int = contract.STEPS, only: int | None = None) -> dict:
    """Single-process training on the global batch (every rank's shard, in rank order), or with
    ``only=r`` on rank r's shard alone: the gradients of each step and the final parameters."""
    model = contract.lab_model()
    params = list(model.parameters())
    grads = []
    for step in range(steps):
        parts = [inputs[only]] if only is not None else inputs
        x = torch.cat([i["x"][step] for i in parts])
        y = torch.cat([i["y"][step] for i in parts])
        model.zero_grad()
        F.mse_loss(model(x), y).backward()
        grads.append([p.grad.detach().clone() for p in params])
        with torch.no_grad():
            for p in params:
                p -= contract.LR * p.grad
    return {"grads": grads, "params": [p.detach().clone() for p in params]}


def _close(a, b) -> bool:
    if not isinstance(a, torch.Tensor) or a.shape != b.shape:
        return False
    return bool(torch.allclose(a.double(), b.double(), rtol=1e-5, atol=1e-6))


def _max_diff(a, b) -> float:
    try:
        return float((a.double() - b.double()).abs().max())
    except Exception:  # noqa: BLE001 - only used in a message
        return math.nan


def _check_training(run, rank, result):
    if not isinstance(result, dict) or not isinstance(result.get("grads"), list) or "params" not in result:
        return [problem("lab02_want_driver", got=short(result))]
    ref = reference_training(run.inputs)
    local = reference_training(run.inputs, steps=1, only=rank)["grads"][0]
    world = run.world_size
    for step, (got, want) in enumerate(zip(result["grads"], ref["grads"])):
        if not isinstance(got, list):
            return [problem("lab02_want_driver", got=short(result))]
        for name, g, w, mine in zip(contract.PARAM_NAMES, got, want, local):
            if g is None:
                return [problem("lab02_grad_none", step=step + 1, name=name)]
            if _close(g, w):
                continue
            if _close(g, w * world):
                return [problem("lab02_grad_sum", name=name, world=world)]
            if step == 0 and _close(g, mine):
                return [problem("lab02_no_copy_back", name=name)]
            return [problem("lab02_grad_wrong", step=step + 1, name=name, diff=f"{_max_diff(g, w):.3g}")]
    if len(result["grads"]) != len(ref["grads"]):
        return [problem("grade_driver_steps")]
    for name, p, w in zip(contract.PARAM_NAMES, result["params"], ref["params"]):
        if not _close(p, w):
            return [problem("lab02_params_wrong", steps=contract.STEPS, name=name, diff=f"{_max_diff(p, w):.3g}")]
    return []


def _allreduce_sizes(calls) -> list[int]:
    return [math.prod(c.get("shape") or [0]) for c in calls if c.get("op") == "all_reduce"]


def _one_allreduce_per_bucket(run):
    """Every rank issued exactly one all-reduce per bucket and step, of the bucket's size, in
    bucket order: what bucketing is for. (A correct average from one all-reduce per parameter is
    still wrong here: it pays the per-message latency once per tensor.)"""
    want = BUCKET_NUMELS * contract.STEPS
    per_param = [p.numel() for p in contract.lab_model().parameters()]
    n_buckets = len(contract.BUCKETS)
    for rank, calls in sorted(run.traces.items()):
        sizes = _allreduce_sizes(calls)
        if sizes == want:
            continue
        if len(sizes) == len(per_param) * contract.STEPS and sorted(sizes) == sorted(per_param * contract.STEPS):
            return [problem("lab02_per_param", n=len(sizes), buckets=n_buckets)]
        if sorted(sizes) == sorted(want):
            return [problem("lab02_bucket_order", rank=rank, sizes=sizes[:n_buckets], numels=BUCKET_NUMELS)]
        more = "…" if len(sizes) > 12 else ""
        return [problem("lab02_bucket_count", buckets=n_buckets, numels=BUCKET_NUMELS, rank=rank, n=len(sizes),
                        per_step=f"{len(sizes) / contract.STEPS:g}", sizes=f"{sizes[:12]}{more}")]
    return []


# ------------------------------------------------------------------ 3. overlap with backward
def _check_overlap(run, rank, result):
    out = _check_training(run, rank, result)
    seen = result.get("in_backward") if isinstance(result, dict) else None
    if not isinstance(seen, list) or len(seen) != contract.STEPS or any(not isinstance(s, int) for s in seen):
        return out + [problem("lab02_no_overlap_record")]
    late = [i + 1 for i, s in enumerate(seen) if s < 1]
    if late:
        out.append(problem("lab02_not_overlapped", steps=", ".join(map(str, late))))
        if 1 not in late:
            out.append(problem("lab02_no_reset"))
    return out


def _exercise(name, title, checks, **kw) -> Exercise:
    return Exercise(id=f"lab02.{name}", lab=LAB, filename=f"lab02_{name}.py", timeout=20, title=title,
                    checks=checks, make_inputs=contract.make_inputs, hide=HIDE, **kw)


EXERCISES = [
    _exercise("buckets", rendered("lab02_title_buckets"), [_check_buckets],
              world_sizes=(1,), setup="dtrain_lab.grading.lab02:withhold_bucket_assignment"),
    _exercise("sync", rendered("lab02_title_sync"), [_check_training],
              job_checks=[_one_allreduce_per_bucket], world_sizes=(2, 3),
              pattern_checks=[patterns.only(("all_reduce",), "pattern_ddp_allreduce")]),
    _exercise("overlap", rendered("lab02_title_overlap"), [_check_overlap],
              job_checks=[_one_allreduce_per_bucket], world_sizes=(2, 3),
              pattern_checks=[patterns.only(("all_reduce",), "pattern_ddp_allreduce")]),
]
