"""Lab 13 (ring attention, MoE dispatch and combine): every learner stub is "not yet"
(tests/test_learner_copies.py), and wrong answers
fail with feedback in the learner's language.

Solutions and stubs come from solutions/_source/lab_13_context_expert.md; wrong submissions live in
tests/submissions/lab13. A graded launch costs a few seconds per world size: the solutions are graded
(sandboxed, launched) by the solution notebooks in both languages, which nbval re-executes
(tests/test_solution_cells.py checks that every exercise's pass is stored there); two wrong programs are
launched (no communication; All-to-All splits that do not match); the other wrong answers are judged in
this process by the same checks the grader runs, on results built here.
"""
import re

import pytest
import torch

from conftest import ROOT, grade, lab_programs
from dtrain_lab.grading import lab13, registry
from dtrain_lab.grading.checks import lab13 as checks
from dtrain_lab.grading.exercise import Run

WRONG = ROOT / "tests" / "submissions" / "lab13"
HAN = r"[\u4e00-\u9fff]"
PROGRAMS = lab_programs("lab13", "lab_13_context_expert.md")
EXERCISES = sorted(e.id for e in registry.all_exercises() if e.lab == "lab_13")


def text(problems, lang: str = "en") -> str:
    return "\n".join(p[lang] for p in problems)


def test_exercises_cells_titles_and_ignored_files():
    assert sorted(PROGRAMS) == EXERCISES == ["lab13.dispatch_combine", "lab13.ring_attention"]
    for ex_id in EXERCISES:
        ex = registry.get(ex_id)
        assert ex.filename == ex_id.replace(".", "_", 1) + ".py" and ex.world_sizes == (2, 3)
        assert re.search(HAN, ex.title["zh"]) and ex.title["en"]
        assert "# YOUR CODE HERE" in PROGRAMS[ex_id]["learner"] and "YOUR CODE HERE" not in PROGRAMS[ex_id]["solution"]
        assert "dtrain_lab.parallel.context" in ex.hide and "dtrain_lab.parallel.expert" in ex.hide
    for kind in ("labs", "solutions"):
        assert "lab13_*.py" in (ROOT / kind / ".gitignore").read_text().split()


def test_inputs_are_private_uneven_and_drawn_per_grade():
    for seed in range(6):
        for world in (2, 3):
            inputs = lab13.make_inputs(seed, world)
            assert len(inputs) == world
            for r, mine in enumerate(inputs):
                assert mine["weights"].shape == (lab13.EXPERTS_PER_RANK, lab13.D, lab13.D)   # only its own experts
                assert mine["first_expert"] == r * lab13.EXPERTS_PER_RANK
                assert mine["dest"].min() >= -1 and mine["dest"].max() < lab13.EXPERTS_PER_RANK * world
            sizes = {len(m["dest"]) for m in inputs} | {int((m["dest"] >= 0).sum()) for m in inputs}
            assert len(sizes) > 1                                                 # uneven
    assert not torch.equal(lab13.make_inputs(1, 2)[0]["q"], lab13.make_inputs(2, 2)[0]["q"])
    # across seeds some rank drops a token and some rank sends no row at all to another rank
    dropped = zero = False
    for seed in range(10):
        inputs = lab13.make_inputs(seed, 3)
        for m in inputs:
            dropped |= bool((m["dest"] < 0).any())
            per_rank = torch.bincount((m["dest"][m["dest"] >= 0] // lab13.EXPERTS_PER_RANK), minlength=3)
            zero |= bool((per_rank == 0).any())
    assert dropped and zero


def test_every_draw_has_a_pair_of_ranks_with_unequal_counts():
    """A submission that never exchanges the counts (it assumes it gets back what it sends) must
    meet unmatched splits in every grade, not in 87 % of them (CI drew a symmetric world-2 routing)."""
    for world in (2, 3):
        for seed in range(400):
            _, routed = lab13.routing(seed, world)     # what make_inputs hands out as each rank's "dest"
            # counted here from the destinations, independently of lab13.sends
            c = torch.zeros(world, world, dtype=torch.long)
            for i, dest in enumerate(routed):
                dest = torch.tensor(dest)
                kept = dest[dest >= 0]
                c[i] += torch.bincount(kept // lab13.EXPERTS_PER_RANK, minlength=world)
            assert not torch.equal(c, c.T), (seed, world, c)


def _ring_run(world=3, seed=4):
    return Run(world_size=world, seed=seed, inputs=lab13.make_inputs(seed, world))


def _right_merge(run, rank):
    m, n = run.inputs[rank], lab13.TOKENS
    return list(lab13.block_attention(m["q"], m["k"], m["v"], (rank + 1) * n, rank * n))


def test_ring_checks_on_built_results():
    run = _ring_run()
    for rank in range(3):
        good = {"merge": _right_merge(run, rank), "out": checks.reference_rows(run.inputs, rank)}
        assert checks._check_ring(run, rank, good) == []
    m = run.inputs[1]
    own = checks._attention(m["q"], m["k"], m["v"])
    cases = [({"merge": _right_merge(run, 1), "out": own}, "never arrived"),
             ({"merge": _right_merge(run, 1), "out": checks.reference_rows(run.inputs, 1, causal=False)}, "future"),
             ({"merge": _right_merge(run, 1), "out": own * float("nan")}, "NaN"),
             ({"merge": _right_merge(run, 1), "out": own + 1}, "whole sequence"),
             ({"merge": [x * 2 for x in _right_merge(run, 1)], "out": own}, "merge is wrong"),
             ({"merge": _right_merge(run, 1), "out": own[..., :2, :]}, "shape"),
             ("nothing", "do not change run()")]
    for result, phrase in cases:
        found = text(checks._check_ring(run, 1, result))
        assert phrase in found, (phrase, found)
        assert re.search(HAN, text(checks._check_ring(run, 1, result), "zh"))
    traced = Run(world_size=2, seed=0, inputs=[], traces={0: [{"op": "send"}], 1: [{"op": "batch_isend_irecv"}]})
    assert "blocking dist.send" in text(checks._no_blocking_send(traced))
    assert checks._no_blocking_send(Run(world_size=2, seed=0, inputs=[], traces={0: [], 1: []})) == []


def test_reference_rows_are_attention_over_the_whole_sequence():
    run = _ring_run(2, 7)
    q, k, v = (torch.cat([i[n] for i in run.inputs], 2) for n in ("q", "k", "v"))
    full = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    for rank in range(2):
        n = lab13.TOKENS
        assert torch.allclose(checks.reference_rows(run.inputs, rank), full[..., rank * n:(rank + 1) * n, :])


def test_moe_checks_on_built_results():
    run = Run(world_size=3, seed=2, inputs=lab13.make_inputs(2, 3))
    for rank in range(3):
        assert checks._check_moe(run, rank, {"y": checks.reference_moe(run.inputs, rank)}) == []
    rank = next(r for r in range(3) if ((run.inputs[r]["dest"] >= 0)
                                        & (run.inputs[r]["dest"] // lab13.EXPERTS_PER_RANK != r)).any())
    want = checks.reference_moe(run.inputs, rank)
    dest = run.inputs[rank]["dest"]
    local = (dest >= 0) & (dest // lab13.EXPERTS_PER_RANK == rank)
    local_only = torch.where(local.unsqueeze(1), want, torch.zeros_like(want))
    assert "other ranks" in text(checks._check_moe(run, rank, {"y": local_only}))
    kept = (dest >= 0).nonzero().flatten()
    permuted = want.clone()
    permuted[kept] = want[kept.flip(0)]                 # the right rows, in the wrong places
    assert not torch.equal(permuted, want)
    assert "wrong order" in text(checks._check_moe(run, rank, {"y": permuted}))
    rank_d = next((r for r in range(3) if (run.inputs[r]["dest"] < 0).any()), None)
    if rank_d is not None:
        bad = checks.reference_moe(run.inputs, rank_d) + 1.0
        assert "dropped" in text(checks._check_moe(run, rank_d, {"y": bad}))
    assert "shape" in text(checks._check_moe(run, rank, {"y": want[:1]}))
    assert "split sizes" in text(checks._explain_moe("crash", "RuntimeError: Split sizes doesn't match", ""))


# The solutions' passing grades: solutions/{zh,en}/lab_*.ipynb, re-graded by nbval (test_solution_cells.py).
@pytest.mark.timeout(300)
def test_no_communication_fails_with_the_ring_explained():
    v = grade("lab13.ring_attention", WRONG / "ring_no_comm.py", lang="zh")
    assert not v.passed and v.outcome == "wrong", v.feedback
    assert "根本没有传过来" in v.feedback and "batch_isend_irecv" in v.feedback
    assert "rank 0" not in v.feedback.split("\n", 1)[1]        # rank 0 sees only its own block: right


@pytest.mark.timeout(300)
def test_unmatched_splits_fail_with_the_counts_explained():
    v = grade("lab13.dispatch_combine", WRONG / "moe_no_counts.py", lang="en")
    assert not v.passed and v.outcome in ("crash", "hang", "wrong"), v.feedback
    assert "Exchange the counts first" in v.feedback, v.feedback
