"""Lab 05 (a ZeRO-1 optimizer): every solution passes, every learner stub is "not yet", plausible wrong
answers fail with feedback in the learner's language, and the grader's references and hints are
what they claim to be.

Solutions and stubs come from the lab's source, solutions/_source/lab_05_zero.md; wrong answers live
in tests/submissions/lab05. A graded launch costs 6-15 s, so each exercise's solution is graded once
(on all its world sizes) and four wrong answers are graded once each (they fail on the first world
size); the other hints are checked in this process, on results simulated from PyTorch's own Adam
and clip_grad_norm_, without launching.
"""
import importlib
import importlib.util
import re
from types import SimpleNamespace

import pytest
import torch

from conftest import ROOT, lab_programs
from dtrain_lab.grading import grade, grade_notebook, lab05, registry, submissions_in_notebook

WRONG = ROOT / "tests" / "submissions" / "lab05"
HAN = r"[\u4e00-\u9fff]"




PROGRAMS = lab_programs("lab05", "lab_05_zero.md")
EXERCISES = sorted(e.id for e in registry.all_exercises() if e.lab == "lab_05")

# wrong answers graded by launching: (exercise, language, outcome, phrases the feedback must hold)
LAUNCHED_WRONG = {
    "zero1_full_state.py": ("lab05.zero1", "zh", "wrong", ["整个模型", "ceil(139/2) = 70", "139 个元素", "All-Gather"]),
    "zero1_no_average.py": ("lab05.zero1", "en", "wrong", ["this rank's own gradient", "Reduce-scatter first"]),
    "zero1_unpadded.py": ("lab05.zero1", "en", "crash", ["same size on every rank", "pad the flat vector"]),
    "clip_per_shard.py": ("lab05.clip", "en", "wrong", ["norm of this rank's shard", "squared norm"]),
}


def submit(tmp_path, ex_id: str, code: str, tag: str):
    path = tmp_path / tag / registry.get(ex_id).filename
    path.parent.mkdir()
    path.write_text(code)
    return path


def rt(rank: int, world: int):
    return SimpleNamespace(rank=rank, world_size=world)


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
    assert lab05.NUMEL == 139 and all(lab05.NUMEL % n for n in (2, 3))


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_learner_copies_are_not_yet_without_launching(tmp_path, monkeypatch, lang):
    def refuse(*a, **kw):
        raise AssertionError("a stub was launched")
    monkeypatch.setattr(importlib.import_module("dtrain_lab.jobs.launch"), "launch", refuse)
    for ex_id in EXERCISES:
        v = grade(ex_id, submit(tmp_path, ex_id, PROGRAMS[ex_id]["learner"], f"{lang}-{ex_id}"), lang=lang)
        assert v.outcome == "error" and not v.passed and v.details.get("not_yet"), v.feedback
        assert bool(re.search(HAN, v.feedback)) == (lang == "zh"), v.feedback
    path = ROOT / "labs" / lang / "lab_05_zero.ipynb"
    assert set(submissions_in_notebook(path)) == set(EXERCISES)
    assert all(v.details.get("not_yet") for v in grade_notebook(path, lang=lang, workdir=str(tmp_path)))


# ------------------------------------------------------------------ references and hints, no launch
def test_reference_bounds_pad_the_last_shards_only():
    for numel, world in lab05.BOUND_CASES + [(1, 5), (100, 7)]:
        size = lab05.shard_size(numel, world)
        bounds = [lab05.reference_bounds(numel, r, world) for r in range(world)]
        assert size * world >= numel > (size - 1) * world or numel == 0   # size = ceil(numel / world)
        assert bounds[0][0] == 0 and bounds[-1][1] == numel
        assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))          # contiguous, no overlap
        assert all(0 <= e - s <= size for s, e in bounds)
        full = [r for r, (s, e) in enumerate(bounds) if e - s == size]
        assert full == list(range(len(full)))                                  # padding only at the end
    assert [lab05.reference_bounds(10, r, 4) for r in range(4)] == [(0, 3), (3, 6), (6, 9), (9, 10)]
    assert [lab05.reference_bounds(2, r, 4) for r in range(4)] == [(0, 1), (1, 2), (2, 2), (2, 2)]


def test_bounds_hints():
    spec = importlib.util.spec_from_file_location("bounds_floor", WRONG / "bounds_floor.py")
    floor = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(floor)
    check = lab05._check_bounds
    solution = {}
    exec(PROGRAMS["lab05.shard_bounds"]["solution"], solution)   # our own solution, no launch
    assert check(rt(0, 1), lab05.bounds_cases(solution["shard_bounds"]), None) == []
    found = check(rt(0, 1), lab05.bounds_cases(floor.shard_bounds), None)
    assert "numel // world_size" in text(found, "en") and "ceil(numel / world_size)" in text(found, "zh")
    assert "numel=139, world_size=2" in text(found, "en")
    slips = {lab05._split_bounds: "tensor_split", lab05._unclamped_bounds: "not clamped to numel",
             lab05._end_clamped_only: "clamp start to numel too"}
    for rule, phrase in slips.items():
        assert phrase in text(check(rt(0, 1), lab05.bounds_cases(rule), None), "en"), rule.__name__

    def raises(numel, rank, world):
        return (numel // (numel - numel), 0) if numel == 0 else lab05.reference_bounds(numel, rank, world)
    found = check(rt(0, 1), lab05.bounds_cases(raises), None)
    assert "ZeroDivisionError" in text(found, "zh") and len(found) == 1


@pytest.mark.parametrize("world", [2, 3])
def test_training_hints_on_simulated_results(world):
    """Results simulated from torch.optim.Adam: right, summed gradients, one shard updated, nothing
    updated, full-size state; each gets its own explanation (the tolerance separates them)."""
    size = lab05.shard_size(lab05.NUMEL, world)
    ref = lab05.reference_training()
    before = lab05._flat(lab05.lab_model().parameters())
    for rank in range(world):
        start, end = lab05.reference_bounds(lab05.NUMEL, rank, world)
        assert lab05._check_training(rt(rank, world), simulated(ref, size)) == []
        assert lab05._check_training(rt(rank, world), simulated(ref, end - start)) == []
        summed = lab05.reference_training(grad_scale=float(world))
        assert not lab05._close(summed[0], ref[0])      # Adam hides the sum only up to eps: the grader sees it
        assert "sum of the ranks' gradients" in text(lab05._check_training(rt(rank, world), simulated(summed, size)), "en")
        own = before.clone()
        own[start:end] = ref[0][start:end]
        assert "all-gather every rank's new shard" in text(
            lab05._check_training(rt(rank, world), simulated([own], size)), "en")
        assert "一点也没变" in text(lab05._check_training(rt(rank, world), simulated([before], size)), "zh")
        full = text(lab05._check_training(rt(rank, world), simulated(ref, lab05.NUMEL)), "en")
        assert f"ceil(139/{world}) = {size}" in full and "278 elements" in full


def test_state_is_found_inside_an_inner_torch_optimizer():
    p = torch.nn.Parameter(torch.zeros(139, dtype=torch.float64))
    inner = torch.optim.Adam([p])
    p.grad = torch.ones_like(p)
    inner.step()
    holder = SimpleNamespace(state={}, inner=inner)
    found = lab05.state_tensors(holder)
    assert sorted(n for _, n in found) == [139, 139] and all(w.startswith("self.inner.state") for w, _ in found)
    assert "whole model" in text(lab05._state_problems(found, 0, 2), "en")


@pytest.mark.parametrize("world", [2, 3])
def test_clip_references_and_hints(world):
    """clip_grad_norm_ on the full vector is the reference; per-shard norms, summed norms, an
    unclamped factor and a division by a zero norm are each explained."""
    for rank in range(world):
        for name, _ in lab05.CLIP_CASES:
            norm, shard = lab05.reference_clip(name, rank, world)
            assert lab05._clip_problem(name, {"norm": norm, "shard": shard.clone()}, rank, world) is None
        size = lab05.shard_size(lab05.NUMEL, world)
        grad = lab05._padded(lab05.clip_vector("clipped"), world)[rank * size:(rank + 1) * size]
        mx = lab05.clip_max_norm("clipped")
        local = float(grad.norm())
        p = lab05._clip_problem("clipped", {"norm": local, "shard": grad * min(1, mx / local)}, rank, world)
        assert "norm of this rank's shard" in p["en"] and "逐分片裁剪" in p["zh"]
        summed = lab05._sum_of_norms("clipped", world)
        assert "Norms do not add" in lab05._clip_problem("clipped", {"norm": summed, "shard": grad}, rank, world)["en"]
        g2 = lab05._padded(lab05.clip_vector("not clipped"), world)[rank * size:(rank + 1) * size]
        norm2 = float(lab05.clip_vector("not clipped").norm())
        up = g2 * (lab05.clip_max_norm("not clipped") / norm2)
        assert "Clamp the factor" in lab05._clip_problem("not clipped", {"norm": norm2, "shard": up}, rank, world)["en"]
        nan = torch.full((size,), float("nan"), dtype=torch.float64)
        assert "1e-6" in lab05._clip_problem("zero gradient", {"norm": 0.0, "shard": nan}, rank, world)["en"]
    # clipping is active at steps 1 and 4 only (as the lab says), and clipping without the +1e-6 passes
    model = lab05.lab_model()
    opt = torch.optim.Adam(model.parameters(), lr=lab05.LR, betas=lab05.BETAS, eps=lab05.EPS)
    active = []
    for step in range(lab05.STEPS):
        x, y = lab05._batch(step, None, 1)
        model.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        active.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), lab05.MAX_NORM)) > lab05.MAX_NORM)
        opt.step()
    assert active == [True, False, False, True]
    ref = lab05.reference_training(max_norm=lab05.MAX_NORM)
    assert not lab05._close(ref[-1], lab05.reference_training()[-1], lab05.CLIP_RTOL, lab05.CLIP_ATOL)
    no_eps = lab05.reference_training(max_norm=lab05.MAX_NORM, clip_eps=0.0)
    assert all(lab05._close(a, b, lab05.CLIP_RTOL, lab05.CLIP_ATOL) for a, b in zip(no_eps, ref))


# ------------------------------------------------------------------ graded (launched)
@pytest.mark.timeout(300)
@pytest.mark.parametrize("ex_id", EXERCISES)
def test_solution_passes(ex_id, tmp_path):
    ex = registry.get(ex_id)
    v = grade(ex_id, submit(tmp_path, ex_id, PROGRAMS[ex_id]["solution"], "solution"), lang="en")
    assert v.passed and v.outcome == "pass" and v.score == ex.max_score, v.feedback


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
