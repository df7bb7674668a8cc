"""Labs 02 (gradient buckets) and 04 (top-k with error feedback): every learner stub is "not yet"
(tests/test_learner_copies.py, for every lab),
plausible wrong answers fail with feedback in the learner's language, and the graders' references agree
with the library they stand for (dtrain_lab.parallel.ddp, dtrain_lab.parallel.compression).

Solutions and stubs come from the labs' sources, solutions/_source/lab_02_ddp.md and
lab_04_compression.md (the notebooks are generated from them); wrong answers live in
tests/submissions/lab02 and lab04. A graded launch costs 10-40 s: the solutions are graded (sandboxed,
launched) by the solution notebooks in both languages, which nbval re-executes
(tests/test_solution_cells.py checks that every exercise's pass is stored there); each exercise's first
wrong answer is graded in one test, the other wrong answers are graded once each in a second test. Stubs
and the references are checked without launching.
"""
import re
from types import SimpleNamespace

import pytest
import torch

from conftest import ROOT, grade, lab_programs
from dtrain_lab.parallel.ddp import MB, DDP
from dtrain_lab.grading import lab02, lab04, registry
from dtrain_lab.grading.checks import lab02 as checks02, lab04 as checks04

WRONG = ROOT / "tests" / "submissions"
HAN = r"[\u4e00-\u9fff]"




PROGRAMS = {**lab_programs("lab02", "lab_02_ddp.md"), **lab_programs("lab04", "lab_04_compression.md")}
EXERCISES = sorted(e.id for e in registry.all_exercises() if e.lab in ("lab_02", "lab_04"))

# one plausible wrong answer per exercise, the language its feedback is read in, and what it must say
FIRST_WRONG = {
    "lab02.buckets": ("lab02/buckets_forward.py", "zh", ["注册顺序", "逆序"]),
    "lab02.sync": ("lab02/sync_per_param.py", "en", ["one all-reduce per parameter", "3 all-reduces per step"]),
    "lab02.overlap": ("lab02/overlap_after_backward.py", "zh", ["post-accumulate-grad 钩子", "async_op=True"]),
    "lab04.sparse_allreduce": ("lab04/sparse_indices_allreduce.py", "zh", ["整数张量", "位置 7", "All-Gather"]),
    "lab04.topk_ef": ("lab04/topk_no_ef.py", "en", ["without error feedback", "add the residual"]),
}
MORE_WRONG = {
    "lab02/buckets_own_bucket.py": ("lab02.buckets", "en", ["larger than the cap shares the bucket"]),
    "lab02/buckets_one_stream.py": ("lab02.buckets", "zh", ["只能装一种 dtype", "mixed dtypes"]),
    "lab02/buckets_closing_order.py": ("lab02.buckets", "en", ["listed in the order they were closed", "mixed dtypes"]),
    "lab02/sync_sum.py": ("lab02.sync", "zh", ["之和", "除以 world size"]),
    "lab02/sync_no_copy_back.py": ("lab02.sync", "en", ["still holds this rank's own gradient"]),
    "lab02/overlap_no_reset.py": ("lab02.overlap", "en", ["must reset the per-step state"]),
    "lab04/sparse_dense_allreduce.py": ("lab04.sparse_allreduce", "en", ["as large as the whole gradient"]),
    "lab04/sparse_no_divide.py": ("lab04.sparse_allreduce", "zh", ["各 rank 的和", "world size"]),
    "lab04/topk_residual_average.py": ("lab04.topk_ef", "en", ["subtracted the averaged update"]),
    "lab04/topk_residual_drops_old.py": ("lab04.topk_ef", "zh", ["上一步的残差被丢掉了"]),
    "lab04/topk_no_divide.py": ("lab04.topk_ef", "en", ["the sum over the ranks"]),
    "lab04/topk_threshold.py": ("lab04.topk_ef", "en", ["same shape on every rank"]),
}


# ------------------------------------------------------------------ structure, no launch
def test_every_exercise_has_one_cell_a_title_and_an_ignored_file():
    assert sorted(PROGRAMS) == EXERCISES == ["lab02.buckets", "lab02.overlap", "lab02.sync",
                                             "lab04.sparse_allreduce", "lab04.topk_ef"]
    assert sorted(FIRST_WRONG) == EXERCISES
    for ex_id in EXERCISES:
        ex = registry.get(ex_id)
        assert ex.filename == ex_id.replace(".", "_", 1) + ".py" and ex.entry == "run"
        assert ex.timeout <= 20 and ex.title["en"]
        assert any("\u4e00" <= ch <= "\u9fff" for ch in ex.title["zh"])
        assert "# YOUR CODE HERE" in PROGRAMS[ex_id]["learner"]
        assert "YOUR CODE HERE" not in PROGRAMS[ex_id]["solution"]
        assert "def run():" in PROGRAMS[ex_id]["learner"]
    for kind in ("labs", "solutions"):
        ignored = (ROOT / kind / ".gitignore").read_text().split()
        assert "lab02_*.py" in ignored and "lab04_*.py" in ignored


def _ddp_buckets(params, cap):
    stand_in = SimpleNamespace(bucket_cap_mb=cap / MB, _params=params, buckets=[],
                               param_names=[f"p{i}" for i in range(len(params))])
    DDP._build_buckets(stand_in)
    return [b.params for b in stand_in.buckets]


def _torch_buckets(params, cap):
    """PyTorch's assignment as DDP rebuilds it after the first iteration: the parameters in gradient-ready
    order (reverse registration order here) with their indices, one cap (bucket_cap_mb given)."""
    order = list(reversed(range(len(params))))
    buckets, _ = torch.distributed._compute_bucket_assignment_by_size(
        [params[i] for i in order], [cap], [False] * len(params), order)
    return [list(b) for b in buckets]


def test_reference_buckets_are_ddps():
    """checks.lab02.reference_buckets is the rule of dtrain_lab.parallel.ddp.DDP._build_buckets, on the cases of
    300 grades and on the lab model at several caps; PyTorch's assignment makes the same buckets, in the same
    order when the parameters have one dtype (with mixed dtypes PyTorch lists them in another order)."""
    cases = [(name, lab02.case_params(sizes), cap) for seed in range(300) for name, sizes, cap in
             lab02.make_inputs(seed, 1)[0]["bucket_cases"]]
    lab = lab02.case_params(lab02.LAB_SIZES)
    cases += [("lab model", lab, cap) for cap in (64, 100, 600, 1000, 1100, 1600)]
    mixed = 0
    for name, params, cap in cases:
        if not params:
            assert checks02.reference_buckets(params, cap) == []
            continue
        want = checks02.reference_buckets(params, cap)
        assert _ddp_buckets(params, cap) == want, (name, cap, params)
        theirs = _torch_buckets(params, cap)
        assert {frozenset(b) for b in theirs} == {frozenset(b) for b in want}, (name, cap, params)
        assert all(len({params[i].dtype for i in b}) == 1 for b in want), (name, cap, params)
        if len({p.dtype for p in params}) == 1:
            assert theirs == want, (name, cap, params)
        else:
            mixed += 1
    assert mixed == 300           # every grade's mixed case has several dtypes
    assert checks02.reference_buckets(lab, lab02.CAP_BYTES) == lab02.BUCKETS == [[5, 4, 3], [2], [1, 0]]
    assert checks02.BUCKET_NUMELS == [84, 256, 144]


def test_inputs_are_private_per_rank_and_per_grade():
    """Each rank's data differs from its peers' and from one grade to the next: an answer that needs the
    other ranks' data needs communication."""
    for contract in (lab02, lab04):
        a, b = contract.make_inputs(1, 3), contract.make_inputs(2, 3)
        enc = [repr(i) for i in a]
        assert len(set(enc)) == 3 and enc != [repr(i) for i in b]
    assert not torch.equal(lab02.make_inputs(1, 2)[0]["x"], lab02.make_inputs(1, 2)[1]["x"])


def test_lab04_references_by_hand_and_without_ties():
    # hand-made case, 2 ranks: rank 0 keeps 1.5 at 1 and -2.0 at 6, rank 1 keeps 0.5 at 6 and 4.0 at 3
    inputs = [checks04._dense(torch.tensor(lab04.HAND_VALUES[r]), torch.tensor(lab04.HAND_INDICES[r]), 8)
              for r in range(2)]
    avg, sent = checks04.reference_average(inputs, 2, rank=1)
    assert avg.tolist() == [0.0, 0.75, 0.0, 2.0, 0.0, 0.0, -0.75, 0.0]
    assert torch.equal(sent, inputs[1])
    # error feedback: with a constant gradient every entry is sent sooner or later, nothing is lost
    grads = [i["ef"]["hand-made"] for i in lab04.make_inputs(3, 2)]
    steps = checks04.reference_ef(grads, 2, rank=0)
    total_sent = sum(s["sent"] for s in steps)
    assert torch.allclose(total_sent + steps[-1]["residual"], 4 * steps[0]["grad"])
    # the k-th and (k+1)-th largest magnitudes never tie: the selection is unambiguous on every rank
    for seed in range(4):
        for world in (2, 3):
            inputs = lab04.make_inputs(seed, world)
            for name, _, k, _ in lab04.EF_CASES:
                for rank in range(world):
                    for s in checks04.reference_ef([i["ef"][name] for i in inputs], k, rank):
                        m = s["input"].abs().sort(descending=True).values
                        assert float(m[k - 1] - m[k]) >= lab04.MIN_GAP, (name, world, rank)


# ------------------------------------------------------------------ graded (launched)
@pytest.mark.timeout(400)
@pytest.mark.parametrize("ex_id", EXERCISES)
def test_a_wrong_answer_fails(ex_id):
    # the solution's passing grade: solutions/{zh,en}/lab_0[24]_*.ipynb, re-graded by nbval (test_solution_cells.py)
    file, lang, phrases = FIRST_WRONG[ex_id]
    w = grade(ex_id, WRONG / file, lang=lang)
    assert not w.passed and w.outcome == "wrong", w.feedback
    for phrase in phrases:
        assert phrase in w.feedback, (phrase, w.feedback)
    assert bool(re.search(HAN, w.feedback.split("\n", 1)[1])) == (lang == "zh"), w.feedback


@pytest.mark.timeout(200)
@pytest.mark.parametrize("file", sorted(MORE_WRONG))
def test_more_wrong_answers_fail_with_an_explanation(file):
    ex_id, lang, phrases = MORE_WRONG[file]
    w = grade(ex_id, WRONG / file, lang=lang)
    assert not w.passed and w.outcome in ("wrong", "crash", "hang"), w.feedback
    for phrase in phrases:
        assert phrase in w.feedback, (phrase, w.feedback)
