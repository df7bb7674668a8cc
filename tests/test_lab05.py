"""Lab 05 (a ZeRO-1 optimizer): every learner stub is "not yet"
(tests/test_learner_copies.py), plausible wrong answers fail with feedback
in the learner's language, and the grader's references and hints are what they claim to be.

Solutions and stubs come from the lab's source, solutions/_source/lab_05_zero.md; wrong answers live in
tests/submissions/lab05. A graded launch costs 6-15 s: the solutions are graded (sandboxed, launched) by
the solution notebooks in both languages, which nbval re-executes (tests/test_solution_cells.py checks
that every exercise's pass is stored there); four wrong answers are graded once each (they fail on the
first world size); the other hints are checked in this process, on results simulated from PyTorch's own
Adam and clip_grad_norm_, without launching.
"""
import importlib
import importlib.util
import re

import pytest
import torch

from conftest import ROOT, grade, lab_programs
from dtrain_lab.grading import lab05, registry
from dtrain_lab.grading.checks import lab05 as checks
from dtrain_lab.grading.exercise import Run

WRONG = ROOT / "tests" / "submissions" / "lab05"
HAN = r"[\u4e00-\u9fff]"

PROGRAMS = lab_programs("lab05", "lab_05_zero.md")
EXERCISES = sorted(e.id for e in registry.all_exercises() if e.lab == "lab_05")

# wrong answers graded by launching: (exercise, language, outcome, phrases the feedback must hold)
LAUNCHED_WRONG = {
    "zero1_full_state.py": ("lab05.zero1", "zh", "wrong", ["整个模型", "ceil(157/2) = 79", "All-Gather"]),
    "zero1_no_average.py": ("lab05.zero1", "en", "wrong", ["this rank's own gradient", "Reduce-scatter first"]),
    "zero1_unpadded.py": ("lab05.zero1", "en", "crash", ["same size on every rank", "pad the flat vector"]),
    "zero1_zero_fill.py": ("lab05.zero1", "en", "wrong", ["have no gradient", "step count"]),
    "clip_per_shard.py": ("lab05.clip", "en", "wrong", ["norm of this rank's shard", "squared norm"]),
}


def a_run(world: int, seed: int = 7) -> Run:
    return Run(world_size=world, seed=seed, inputs=lab05.make_inputs(seed, world))


def unflat(flat: torch.Tensor) -> list:
    out, offset = [], 0
    for p in lab05.lab_model().parameters():
        out.append(flat[offset:offset + p.numel()].view_as(p).clone())
        offset += p.numel()
    return out


def simulated(flats: list, state_numel: int) -> dict:
    """What train() returns when the parameters after each step are ``flats``."""
    state = [("self.state['exp_avg']", state_numel), ("self.state['exp_avg_sq']", state_numel)]
    return {"steps": [{"params": unflat(f), "state": state} for f in flats]}


def text(problems, lang: str) -> str:
    return "\n".join(p[lang] for p in problems)


# ------------------------------------------------------------------ structure, no launch
def test_exercises_cells_titles_and_ignored_files():
    assert sorted(PROGRAMS) == EXERCISES == ["lab05.clip", "lab05.shard_bounds", "lab05.zero1"]
    for ex_id in EXERCISES:
        ex = registry.get(ex_id)
        assert ex.filename == ex_id.replace(".", "_", 1) + ".py" and ex.entry == "run"
        assert ex.timeout <= 20 and ex.title["en"] and re.search(HAN, ex.title["zh"])
        assert "# YOUR CODE HERE" in PROGRAMS[ex_id]["learner"]
        assert "YOUR CODE HERE" not in PROGRAMS[ex_id]["solution"]
        assert "def run():" in PROGRAMS[ex_id]["learner"]
    assert registry.get("lab05.shard_bounds").world_sizes == (1,)
    assert registry.get("lab05.zero1").world_sizes == registry.get("lab05.clip").world_sizes == (2, 3)
    for kind in ("labs", "solutions"):
        assert "lab05_*.py" in (ROOT / kind / ".gitignore").read_text().split()
    # the lab's point: a parameter count no world size of the grader divides
    assert lab05.NUMEL == 157 and all(lab05.NUMEL % n for n in (2, 3))


# ------------------------------------------------------------------ references and hints, no launch
def test_reference_bounds_pad_the_last_shards_only():
    cases = [tuple(c) for seed in range(3) for c in lab05.make_inputs(seed, 1)[0]["bound_cases"]] + [(1, 5), (100, 7)]
    for numel, world in cases:
        size = lab05.shard_size(numel, world)
        bounds = [checks.reference_bounds(numel, r, world) for r in range(world)]
        assert size * world >= numel > (size - 1) * world or numel == 0   # size = ceil(numel / world)
        assert bounds[0][0] == 0 and bounds[-1][1] == numel
        assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))          # contiguous, no overlap
        assert all(0 <= e - s <= size for s, e in bounds)
        full = [r for r, (s, e) in enumerate(bounds) if e - s == size]
        assert full == list(range(len(full)))                                  # padding only at the end
    assert [checks.reference_bounds(10, r, 4) for r in range(4)] == [(0, 3), (3, 6), (6, 9), (9, 10)]
    assert [checks.reference_bounds(2, r, 4) for r in range(4)] == [(0, 1), (1, 2), (2, 2), (2, 2)]


def test_bounds_hints():   # outside the grader bounds_cases() uses the practice inputs (seed 0)
    spec = importlib.util.spec_from_file_location("bounds_floor", WRONG / "bounds_floor.py")
    floor = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(floor)
    run = Run(world_size=1, seed=0, inputs=lab05.make_inputs(0, 1))
    check = checks._check_bounds
    solution = {}
    exec(PROGRAMS["lab05.shard_bounds"]["solution"], solution)   # our own solution, no launch
    assert check(run, 0, lab05.bounds_cases(solution["shard_bounds"])) == []
    found = check(run, 0, lab05.bounds_cases(floor.shard_bounds))
    assert "numel // world_size" in text(found, "en") and "ceil(numel / world_size)" in text(found, "zh")
    assert "numel=157, world_size=2" in text(found, "en")
    slips = {checks._split_bounds: "tensor_split", checks._unclamped_bounds: "not clamped to numel",
             checks._end_clamped_only: "clamp start to numel too"}
    for rule, phrase in slips.items():
        assert phrase in text(check(run, 0, lab05.bounds_cases(rule)), "en"), rule.__name__

    def raises(numel, rank, world):
        return (numel // (numel - numel), 0) if numel == 0 else checks.reference_bounds(numel, rank, world)
    found = check(run, 0, lab05.bounds_cases(raises))
    assert "ZeroDivisionError" in text(found, "zh") and len(found) == 1


def test_reference_leaves_frozen_and_unused_parameters_alone_like_torch_optim():
    """The reference is torch.optim.Adam itself: the frozen scale never moves, extra moves only in the
    steps that use it, and a zero gradient instead of None (the classic sharded-optimizer bug) moves both."""
    run = a_run(2)
    ref = checks.reference_training(run.inputs)
    filled = checks.reference_training(run.inputs, zero_fill=True)
    start = lab05.lab_model()
    flat0 = checks._flat(start.parameters())
    scale = slice(0, 3)
    extra = slice(lab05.NUMEL - 15, lab05.NUMEL)
    assert all(torch.equal(f[scale], flat0[scale]) for f in ref)                 # frozen: never touched
    assert torch.equal(ref[1][extra], ref[0][extra]) and torch.equal(ref[3][extra], ref[2][extra])  # odd steps
    assert not torch.equal(ref[2][extra], ref[1][extra])
    assert not torch.equal(filled[0][scale], flat0[scale])                        # weight decay shrinks it
    assert not checks._close(filled[1][extra], ref[1][extra])


@pytest.mark.parametrize("world", [2, 3])
def test_training_hints_on_simulated_results(world):
    """Results simulated from torch.optim.Adam: right, summed gradients, one shard updated, nothing
    updated, zero-filled missing gradients, full-size state; each gets its own explanation."""
    run = a_run(world)
    size = lab05.shard_size(lab05.NUMEL, world)
    ref = checks.reference_training(run.inputs)
    before = checks._flat(lab05.lab_model().parameters())
    for rank in range(world):
        start, end = checks.reference_bounds(lab05.NUMEL, rank, world)
        assert checks._check_training(run, rank, simulated(ref, size)) == []
        assert checks._check_training(run, rank, simulated(ref, end - start)) == []
        summed = checks.reference_training(run.inputs, grad_scale=float(world))
        assert not checks._close(summed[0], ref[0])      # Adam hides the sum only up to eps: the grader sees it
        assert "sum of the ranks' gradients" in text(checks._check_training(run, rank, simulated(summed, size)), "en")
        own = before.clone()
        own[start:end] = ref[0][start:end]
        assert "all-gather every rank's new shard" in text(checks._check_training(run, rank, simulated([own], size)), "en")
        assert "一点也没变" in text(checks._check_training(run, rank, simulated([before], size)), "zh")
        filled = checks.reference_training(run.inputs, zero_fill=True)
        assert "have no gradient" in text(checks._check_training(run, rank, simulated(filled, size)), "en")
        full = text(checks._check_training(run, rank, simulated(ref, lab05.NUMEL)), "en")
        assert f"ceil(157/{world}) = {size}" in full and "314 elements" in full


def test_state_is_found_inside_an_inner_torch_optimizer():
    p = torch.nn.Parameter(torch.zeros(157, dtype=torch.float64))
    inner = torch.optim.Adam([p])
    p.grad = torch.ones_like(p)
    inner.step()
    holder = type("Holder", (), {})()
    holder.state, holder.inner = {}, inner
    found = lab05.state_tensors(holder)
    assert sorted(n for _, n in found) == [157, 157] and all(w.startswith("self.inner.state") for w, _ in found)
    assert "whole model" in text(checks._state_problems(found, 0, 2), "en")


@pytest.mark.parametrize("world", [2, 3])
def test_clip_references_and_hints(world):
    """clip_grad_norm_ on the full vector (every rank's shard) is the reference; per-shard norms, summed
    norms, an unclamped factor and a division by a zero norm are each explained."""
    run = a_run(world)
    for rank in range(world):
        for name in lab05.CLIP_CASES:
            norm, shard = checks.reference_clip(run, name, rank)
            assert checks._clip_problem(run, name, {"norm": norm, "shard": shard.clone()}, rank) is None
        size = lab05.shard_size(lab05.NUMEL, world)
        grad = run.inputs[rank]["clip"]["clipped"]["shard"]
        mx = run.inputs[0]["clip"]["clipped"]["max_norm"]
        local = float(grad.norm())
        p = checks._clip_problem(run, "clipped", {"norm": local, "shard": grad * min(1, mx / local)}, rank)
        assert "norm of this rank's shard" in p["en"] and "逐分片裁剪" in p["zh"]
        summed = sum(float(i["clip"]["clipped"]["shard"].norm()) for i in run.inputs)
        assert "Norms do not add" in checks._clip_problem(run, "clipped", {"norm": summed, "shard": grad}, rank)["en"]
        g2 = run.inputs[rank]["clip"]["not clipped"]["shard"]
        norm2 = float(checks._full_vector(run, "not clipped").norm())
        up = g2 * (run.inputs[0]["clip"]["not clipped"]["max_norm"] / norm2)
        assert "Clamp the factor" in checks._clip_problem(run, "not clipped", {"norm": norm2, "shard": up}, rank)["en"]
        nan = torch.full((size,), float("nan"), dtype=torch.float64)
        assert "1e-6" in checks._clip_problem(run, "zero gradient", {"norm": 0.0, "shard": nan}, rank)["en"]
    # clipping changes the training, and clipping without the +1e-6 passes
    ref = checks.reference_training(run.inputs, max_norm=lab05.MAX_NORM)
    assert not checks._close(ref[-1], checks.reference_training(run.inputs)[-1], checks.CLIP_RTOL, checks.CLIP_ATOL)
    no_eps = checks.reference_training(run.inputs, max_norm=lab05.MAX_NORM, clip_eps=0.0)
    assert all(checks._close(a, b, checks.CLIP_RTOL, checks.CLIP_ATOL) for a, b in zip(no_eps, ref))


# ------------------------------------------------------------------ graded (launched)
# The solutions' passing grades: solutions/{zh,en}/lab_*.ipynb, re-graded by nbval (test_solution_cells.py).
@pytest.mark.timeout(200)
@pytest.mark.parametrize("file", sorted(LAUNCHED_WRONG))
def test_wrong_answers_fail_with_an_explanation(file):
    ex_id, lang, outcome, phrases = LAUNCHED_WRONG[file]
    w = grade(ex_id, WRONG / file, lang=lang)
    assert not w.passed and w.outcome == outcome, w.feedback
    for phrase in phrases:
        assert phrase in w.feedback, (phrase, w.feedback)
    lines = w.feedback.split("\n", 1)[1]
    assert bool(re.search(HAN, lines)) == (lang == "zh"), w.feedback
