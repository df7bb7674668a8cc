"""Every per-grade draw of private inputs tells the known wrong answers from the right one.

The grader draws each graded run's inputs from a random seed (``make_inputs(seed, world)`` in
``dtrain_lab/grading/labNN.py``). A wrong answer is caught only if the draw has some property (the
ranks' counts differ, a token is dropped, ...); a draw without it lets the wrong answer pass by luck
(CI failures in labs 13 and 10). For each such property: it holds for every seed, at every world size
the exercise is graded at, computed here independently of the contract's helpers; and where it is
cheap, the wrong answer's value is computed from the inputs and differs from the right one.

In-process, no launching, no grading: a few seconds in all.
"""
import runpy
from pathlib import Path

import pytest
import torch

from dtrain_lab.grading import lab02, lab05, lab08, lab10, lab13
from dtrain_lab.grading.checks import lab02 as checks02, lab05 as checks05, lab08 as checks08

SEEDS = range(300)
WRONG = Path(__file__).parent / "submissions"


def _close(a, b, tol=1e-6) -> bool:
    return abs(a - b) <= tol * max(1.0, abs(a), abs(b))


def _wrong_function(path: str, name: str):
    """The function a known wrong submission defines (its run() is not called)."""
    return runpy.run_path(str(WRONG / path))[name]


# ------------------------------------------------------------------ lab 10
@pytest.mark.parametrize("world", [2, 3])
def test_lab10_uneven_batches_counts_differ_and_min_loses_data(world):
    for seed in SEEDS:
        inputs = lab10.make_inputs(seed, world)
        counts = [len(i["batches"]) for i in inputs]
        # the docstring's promise: the number differs from rank to rank (so the learner's loop hangs)
        assert len(set(counts)) == world, (seed, counts)
        right = sum(sum(i["batches"]) for i in inputs)
        shortest = min(counts)                     # uneven_batches_wrong.py: all_reduce MIN of the counts
        wrong = sum(sum(i["batches"][:shortest]) for i in inputs)
        assert not _close(wrong, right), (seed, counts)


@pytest.mark.parametrize("world", [2, 3])
def test_lab10_accum_steps_differ_and_unsynchronised_steps_are_wrong(world):
    acc = lab10.ACCUM
    for seed in SEEDS:
        inputs = lab10.make_inputs(seed, world)
        steps = [len(i["micro"]) // acc for i in inputs]
        # equal step counts: the learner's loop (an all-reduce every ACCUM micro-batches) would not hang
        # and would give the right list
        assert len(set(steps)) == world, (seed, steps)
        n = min(steps)
        right = [sum(sum(i["micro"][s * acc:(s + 1) * acc]) / acc for i in inputs) / world for s in range(n)]
        for i in inputs:                           # accum_steps_wrong.py: every rank its own average
            own = [sum(i["micro"][s * acc:(s + 1) * acc]) / acc for s in range(len(i["micro"]) // acc)]
            assert len(own) != len(right) or not all(_close(a, b) for a, b in zip(own, right)), seed


@pytest.mark.parametrize("world", [2, 3])
def test_lab10_other_wrong_answers_differ_from_the_right_values(world):
    for seed in SEEDS:
        inputs = lab10.make_inputs(seed, world)
        # 1: a rank's own loss is not the mean
        mean = sum(i["loss"] for i in inputs) / world
        assert all(not _close(i["loss"], mean) for i in inputs), seed
        # 2: rank 0's samples alone are not the whole validation set
        assert not _close(sum(v for _, v in inputs[0]["val"]), sum(v for i in inputs for _, v in i["val"])), seed
        # 4: a failing step exists; contributing 0 for it (the others' values still count) is not skipping it
        failing = [(r, i["fail_step"]) for r, i in enumerate(inputs) if i["fail_step"] is not None]
        assert len(failing) == 1 and 0 <= failing[0][1] < lab10.STEPS, (seed, failing)
        rank, step = failing[0]
        others = sum(i["steps"][step] for r, i in enumerate(inputs) if r != rank)
        assert others > 1e-3, seed
        # 5: in the reversed order a rank's "loss" sum takes another rank's "correct" count
        assert all(not _close(i["stats"]["loss"], i["stats"]["correct"]) for i in inputs), seed
        # 7: the earlier checkpoints the writer leaves first are not the real one, nor a prefix of it
        ck = inputs[0]["checkpoint"]
        assert 1 <= len(ck["earlier"]) and all(not ck["text"].startswith(e) for e in ck["earlier"]), seed


def test_lab10_send_send_messages_differ():
    for seed in SEEDS:
        a, b = (i["message"] for i in lab10.make_inputs(seed, 2))
        assert a["fill"] != b["fill"], seed          # returning one's own message is wrong


@pytest.mark.parametrize("world", [3, 4])
def test_lab10_hierarchical_leaders_sum_is_not_the_world_sum(world):
    for seed in SEEDS:
        inputs = lab10.make_inputs(seed, world)
        total = [sum(i["grad"][k] for i in inputs) for k in range(lab10.GRAD_NUMEL)]
        leaders = [sum(inputs[r]["grad"][k] for r in range(0, world, lab10.RANKS_PER_NODE))
                   for k in range(lab10.GRAD_NUMEL)]
        assert not all(_close(a, b) for a, b in zip(total, leaders)), seed


# ------------------------------------------------------------------ lab 13
@pytest.mark.parametrize("world", [2, 3])
def test_lab13_routing_has_unequal_counts_a_dropped_token_and_rows_out_of_expert_order(world):
    """The routing of every seed (lab13.routing, what make_inputs hands out); the expert outputs, (D, D)
    matmuls of every token, are computed for the first seeds only (D = 256 makes them the cost)."""
    per = lab13.EXPERTS_PER_RANK
    for seed in SEEDS:
        _, routed = lab13.routing(seed, world)
        dests = [torch.tensor(d) for d in routed]
        counts = [[int(((d >= 0) & (d // per == j)).sum()) for j in range(world)] for d in dests]
        assert any(counts[i][j] != counts[j][i] for i in range(world) for j in range(world)), (seed, counts)
        assert any(bool((d < 0).any()) for d in dests), seed       # else leaving dropped rows unzeroed passes
        # some rank's kept tokens are out of expert order: else scattering the results back in expert
        # order, without undoing the sort, passes
        kept = [[e for e in d.tolist() if e >= 0] for d in dests]
        assert any(k != sorted(k) for k in kept), seed
        if seed >= 20:
            continue
        inputs = lab13.make_inputs(seed, world)
        assert all(torch.equal(i["dest"], d) for i, d in zip(inputs, dests))
        weights = torch.cat([i["weights"] for i in inputs])
        unsorted = False
        for i in inputs:
            x, d = i["x"], i["dest"]
            right = torch.zeros_like(x)
            kept = [t for t, e in enumerate(d.tolist()) if e >= 0]
            for t in kept:
                right[t] = torch.tanh(x[t] @ weights[d[t]])
            by_expert = sorted(kept, key=lambda t: (int(d[t]), t))
            wrong = torch.zeros_like(x)            # results scattered back in expert order, not undone
            wrong[kept] = right[by_expert]
            unsorted |= not torch.allclose(wrong, right)
        assert unsorted, seed


# ------------------------------------------------------------------ lab 02 exercise 1 (pure function, one rank)
_BYTES = {"float16": 2, "float32": 4, "float64": 8}


def _buckets(sizes, cap, *, order=-1, close=lambda size, n, cap: size >= cap, before=False, nbytes=None,
             by_dtype=True, closing_order=False):
    """A bucket rule written here: DDP's (reverse order, one open bucket per dtype, close once at least the cap,
    buckets ordered by their first parameter in the walk) and its slips."""
    idx = list(range(len(sizes)))[::order]
    buckets, open_ = [], {}
    for i in idx:
        n = sizes[i][0] * (nbytes or _BYTES[sizes[i][1]])
        key = sizes[i][1] if by_dtype else None
        current = open_.setdefault(key, [[], 0])
        if before and current[0] and current[1] + n > cap:
            buckets.append(current[0])
            current = open_[key] = [[], 0]
        current[0].append(i)
        current[1] += n
        if not before and close(current[1], n, cap):
            buckets.append(open_.pop(key)[0])
    buckets += [current for current, _ in open_.values() if current]
    return buckets if closing_order else sorted(buckets, key=lambda b: idx.index(b[0]))


_BUCKET_SLIPS = {
    "forward order": dict(order=1),
    "closed only above the cap": dict(close=lambda size, n, cap: size > cap),
    "closed before exceeding the cap": dict(before=True),
    "4 bytes whatever the dtype": dict(nbytes=4),
}


def test_lab02_bucket_cases_catch_every_slip():
    subs = {p: _wrong_function(f"lab02/{p}", "build_buckets")
            for p in ("buckets_forward.py", "buckets_own_bucket.py", "buckets_one_stream.py", "buckets_closing_order.py")}
    slips = {f"{name}, {'per dtype' if by_dtype else 'one stream'}": dict(kw, by_dtype=by_dtype)
             for name, kw in _BUCKET_SLIPS.items() for by_dtype in (True, False)}
    slips["one stream whatever the dtype"] = dict(by_dtype=False)
    slips["buckets in closing order"] = dict(closing_order=True)
    for seed in SEEDS:
        cases = lab02.make_inputs(seed, 1)[0]["bucket_cases"]
        for _, sizes, cap in cases:                # the rule written here is the checks' reference
            assert _buckets(sizes, cap) == checks02.reference_buckets(lab02.case_params(sizes), cap)
        for name, kw in slips.items():
            assert any(_buckets(sizes, cap, **kw) != _buckets(sizes, cap) for _, sizes, cap in cases), (seed, name)
        # the mixed-dtypes case alone tells the two dtype slips from the right rule
        mixed = {name: (sizes, cap) for name, sizes, cap in cases}["mixed dtypes"]
        assert _buckets(*mixed, by_dtype=False) != _buckets(*mixed) != _buckets(*mixed, closing_order=True), seed
        for name, f in subs.items():
            assert any(f(lab02.case_params(sizes), cap) != _buckets(sizes, cap) for _, sizes, cap in cases), (seed, name)


# ------------------------------------------------------------------ lab 05 exercise 1 (pure function, one rank)
def _bounds(numel, world, *, clamp_start=True, clamp_end=True):
    size = -(-numel // world)
    out = []
    for r in range(world):
        start = min(r * size, numel) if clamp_start else r * size
        out.append((start, min(start + size, numel) if clamp_end else start + size))
    return out


def _floor(numel, world):
    size = numel // world
    return [(r * size, numel if r == world - 1 else (r + 1) * size) for r in range(world)]


def _split(numel, world):
    size, extra = divmod(numel, world)
    starts = [r * size + min(r, extra) for r in range(world)]
    return [(s, s + size + (r < extra)) for r, s in enumerate(starts)]


_BOUND_SLIPS = {
    "floor, the rest to the last rank": _floor,
    "tensor_split's sizes": _split,
    "nothing clamped": lambda n, w: _bounds(n, w, clamp_start=False, clamp_end=False),
    "only the end clamped": lambda n, w: [(r * -(-n // w), e) for r, (_, e) in enumerate(_bounds(n, w))],
}


def test_lab05_bound_cases_catch_every_slip():
    sub = _wrong_function("lab05/bounds_floor.py", "shard_bounds")
    for seed in SEEDS:
        cases = lab05.make_inputs(seed, 1)[0]["bound_cases"]
        for n, w in cases:
            assert _bounds(n, w) == [checks05.reference_bounds(n, r, w) for r in range(w)]
        for name, slip in _BOUND_SLIPS.items():
            assert any(slip(n, w) != _bounds(n, w) for n, w in cases), (seed, name)
        assert any([tuple(sub(n, r, w)) for r in range(w)] != _bounds(n, w) for n, w in cases), seed


# ------------------------------------------------------------------ lab 08 exercise 1 (pure function, one rank)
def test_lab08_schedule_cases_catch_every_wrong_schedule():
    subs = {p.stem: _wrong_function(f"lab08/{p.name}", "schedule_1f1b") for p in sorted((WRONG / "lab08").glob("schedule_*.py"))}
    assert len(subs) >= 5
    for seed in SEEDS:
        cases = lab08.make_inputs(seed, 1)[0]["schedule_cases"]
        assert any(m < p for p, m in cases) and any(m % p for p, m in cases if p > 1), (seed, cases)
        for name, f in subs.items():
            assert any(checks08.schedule_problem(f(p, m), p, m) is not None for p, m in cases), (seed, name)
