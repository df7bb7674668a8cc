"""Lab 08 (the 1F1B pipeline schedule): every learner stub is "not yet"
(tests/test_learner_copies.py), plausible wrong answers fail with
feedback in the learner's language, and the grader's reference is PyTorch's own 1F1B order.

Solutions and stubs come from the lab's source, solutions/_source/lab_08_pipeline.md; wrong answers live
in tests/submissions/lab08. A graded launch costs 5-15 s: the solutions are graded (sandboxed, launched)
by the solution notebooks in both languages, which nbval re-executes (tests/test_solution_cells.py
checks that every exercise's pass is stored there); one wrong executor (blocking sends: a real deadlock)
on 2 ranks; the wrong schedules (a pure function) and the other executor slips are judged in this
process by the same checks the harness runs, in both languages.
"""
import importlib
import importlib.util
import re
import types
from collections import deque
import pytest
import torch

from conftest import ROOT, grade, lab_programs
from dtrain_lab.grading import lab08, registry
from dtrain_lab.grading.checks import lab08 as checks
from dtrain_lab.grading.exercise import Run

WRONG = ROOT / "tests" / "submissions" / "lab08"
HAN = r"[\u4e00-\u9fff]"




PROGRAMS = lab_programs("lab08", "lab_08_pipeline.md")
EXERCISES = sorted(e.id for e in registry.all_exercises() if e.lab == "lab_08")
PRACTICE = Run(world_size=1, seed=0, inputs=lab08.make_inputs(0, 1))    # what the drivers use outside the grader
RUN2 = Run(world_size=2, seed=5, inputs=lab08.make_inputs(5, 2))


def solution_schedule():
    ns = {}
    exec(PROGRAMS["lab08.schedule"]["solution"], ns)   # our own solution, no launch
    return ns["schedule_1f1b"]


def load(file: str):
    spec = importlib.util.spec_from_file_location(file[:-3], WRONG / file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def text(problems, lang: str) -> str:
    return "\n".join(p[lang] for p in problems)


def torch_1f1b_order(p: int, m: int) -> list:
    """The order in which PyTorch's Schedule1F1B runs forwards and backwards on each stage: its
    _step_microbatches on a stand-in stage that records the calls (no communication: the stand-in
    posts no p2p op). Private API, used only to confirm the grader's reference."""
    from torch.distributed.pipelining.schedules import Schedule1F1B

    out = []
    for s in range(p):
        rec = []
        stage = types.SimpleNamespace(
            stage_index=s, num_stages=p, is_last=s == p - 1,
            forward_one_chunk=lambda i, *a, rec=rec, **k: rec.append(("F", i)),
            backward_one_chunk=lambda i, *a, rec=rec, **k: rec.append(("B", i)),
            get_fwd_recv_ops=lambda i: [], get_fwd_send_ops=lambda i: [],
            get_bwd_recv_ops=lambda i: [], get_bwd_send_ops=lambda i: [],
            perform_reduce_grad=lambda *a: None)
        sch = object.__new__(Schedule1F1B)
        sch._stage, sch._num_stages, sch._n_microbatches, sch.scale_grads = stage, p, m, True
        sch._check_inputs = lambda *a: ([()] * m, [{}] * m)
        sch._initialize_stage = sch._maybe_compute_loss = sch._maybe_get_loss = sch._update_losses = \
            lambda *a, **k: None
        sch._step_microbatches([()] * m, [{}] * m, None, None)
        out.append(rec)
    return out


# ------------------------------------------------------------------ structure, no launch
def test_exercises_cells_titles_and_ignored_files():
    assert sorted(PROGRAMS) == EXERCISES == ["lab08.run_1f1b", "lab08.schedule"]
    for ex_id in EXERCISES:
        ex = registry.get(ex_id)
        assert ex.filename == ex_id.replace(".", "_", 1) + ".py" and ex.entry == "run"
        assert ex.timeout <= 20 and ex.title["en"] and re.search(HAN, ex.title["zh"])
        assert "# YOUR CODE HERE" in PROGRAMS[ex_id]["learner"]
        assert "YOUR CODE HERE" not in PROGRAMS[ex_id]["solution"]
        assert "def run():" in PROGRAMS[ex_id]["learner"]
    assert registry.get("lab08.schedule").world_sizes == (1,)
    assert registry.get("lab08.run_1f1b").world_sizes == (2,)
    for kind in ("labs", "solutions"):
        assert "lab08_*.py" in (ROOT / kind / ".gitignore").read_text().split()
    # every grade's cases cover m < p, m not a multiple of p, one stage, and change from grade to grade
    for seed in range(5):
        cases = lab08.make_inputs(seed, 1)[0]["schedule_cases"]
        assert any(m < p for p, m in cases) and any(m > p and m % p for p, m in cases) and [1, 1] in cases
    assert lab08.make_inputs(1, 1)[0]["schedule_cases"] != lab08.make_inputs(2, 1)[0]["schedule_cases"]
    # exercise 2's data: the inputs only on stage 0, the targets only on stage 1, each stage's
    # starting weights only on its rank, drawn for every grade (not the public lab_model())
    assert set(RUN2.inputs[0]) == {"x", "weights", "schedule_cases"} and set(RUN2.inputs[1]) == {"y", "weights"}
    public = [[p.detach() for p in lab08.stage_layers(lab08.lab_model(), s).parameters()] for s in range(2)]
    for s in range(2):
        mine = RUN2.inputs[s]["weights"]
        assert [w.shape for w in mine] == [p.shape for p in public[s]]
        assert not any(torch.equal(w, p) for w, p in zip(mine, public[s]))
        assert not any(torch.equal(w, p) for w, p in zip(mine, lab08.make_inputs(RUN2.seed + 1, 2)[s]["weights"]))


# ------------------------------------------------------------------ the reference and the simulation
def test_reference_is_pytorch_1f1b_and_the_solution():
    """The grader's rule ("forward while fewer than min(p - s, m) are alive") gives the order PyTorch's
    Schedule1F1B runs (it accepts m >= p only) and the solution's warm-up / steady / cool-down."""
    solution = solution_schedule()
    for p in range(1, 7):
        for m in range(1, 11):
            ref = checks.reference_1f1b(p, m)
            assert solution(p, m) == ref, (p, m)
            if m >= p:
                assert torch_1f1b_order(p, m) == ref, (p, m)
            assert checks.schedule_problem(ref, p, m) is None, (p, m)
            assert [lab08.peak_alive(a) for a in ref] == [min(p - s, m) for s in range(p)]
            assert [lab08.peak_alive(a) for a in lab08.gpipe(p, m)] == [m] * p


def test_simulation_times_and_bubble():
    """With forward 1 and backward 2, GPipe and 1F1B both take (m + p - 1) * 3 units: bubble
    (p - 1)/(m + p - 1); running the stages one micro-batch at a time takes longer."""
    for p, m in [(1, 3), (2, 3), (4, 6), (4, 2), (5, 8)]:
        for sched in (checks.reference_1f1b(p, m), lab08.gpipe(p, m)):
            sim = lab08.simulate(sched)
            assert sim["ok"] and sim["makespan"] == (m + p - 1) * 3, (p, m, sim["makespan"])
            assert abs(lab08.bubble(sched) - (p - 1) / (m + p - 1)) < 1e-12
    # one micro-batch at a time through the whole pipeline: valid, no deadlock, but slow and
    # keeping fewer micro-batches alive than 1F1B allows
    serial = [[a for mb in range(4) for a in (("F", mb), ("B", mb))] for _ in range(3)]
    assert lab08.simulate(serial)["makespan"] == 4 * 3 * 3
    found = checks.schedule_problem(serial, 3, 4)
    assert "stalls" in found["en"] and "36" in found["en"] and "18" in found["en"]
    # stage 0 of p = 2, m = 3, unit by unit: it idles while micro-batch 0 finishes on stage 1
    row0 = lab08.timeline(checks.reference_1f1b(2, 3)).splitlines()[0]
    assert row0.split("|")[1].split() == ["F0", "F1", "··", "··", "B0", "B0", "F2", "B1", "B1", "··", "B2", "B2"]


def test_simulation_finds_deadlocks_and_mismatched_messages():
    # stage 0 waits for gradient 0 before sending activation 1, stage 1 needs activation 1 first
    dead = [[("F", 0), ("B", 0), ("F", 1), ("B", 1)], [("F", 0), ("F", 1), ("B", 0), ("B", 1)]]
    sim = lab08.simulate(dead)
    assert not sim["ok"] and "deadlock" in sim["why"]["en"] and "死锁" in sim["why"]["zh"]
    assert "stage 0 waits for micro-batch 0's gradient from stage 1" in sim["why"]["en"]
    assert "stage 1 waits for micro-batch 1's activation from stage 0" in sim["why"]["en"]
    # stage 1 runs its forwards in another order than stage 0 sends them
    swapped = [[("F", 0), ("F", 1), ("B", 0), ("B", 1)], [("F", 1), ("B", 1), ("F", 0), ("B", 0)]]
    sim = lab08.simulate(swapped)
    assert not sim["ok"] and "arrive in the order they were sent" in sim["why"]["en"]
    # the same blocking-receive rules keep GPipe and 1F1B deadlock-free for every (p, m)
    for p in range(1, 6):
        for m in range(1, 8):
            assert lab08.simulate(lab08.gpipe(p, m))["ok"] and lab08.simulate(checks.reference_1f1b(p, m))["ok"]


P0, M0 = PRACTICE.inputs[0]["schedule_cases"][0]   # the first case, shown when GPipe's order comes in
WRONG_SCHEDULES = {
    "schedule_gpipe.py": (f"stage 0 keeps {M0} micro-batches alive; 1F1B keeps at most {P0}", "GPipe's order",
                          f"阶段 0 同时保留了 {M0} 个微批次的激活值；1F1B 最多保留 {P0} 个", "GPipe 的顺序"),
    "schedule_warmup_p_minus_s.py": (f"stage 0 keeps {P0 + 1} micro-batches alive", "your warm-up is p − s forwards",
                                     f"同时保留了 {P0 + 1} 个", "预热是 p − s 次前向"),
    "schedule_uncapped.py": ("micro-batches 0…", "the warm-up is min(p − s − 1, m)", "各做一次", "min(p − s − 1, m)"),
    "schedule_backward_first.py": ("runs micro-batch 0's backward before its forward", "run the forward first",
                                   "在微批次 0 的前向之前就做了它的反向", "先做前向"),
    "schedule_deadlock.py": ("deadlock: stage 0 waits for micro-batch 0's gradient from stage 1",
                             "your warm-up grows with s", "死锁", "预热次数随 s 增大"),
}


@pytest.mark.parametrize("file", sorted(WRONG_SCHEDULES))
def test_wrong_schedules_fail_with_their_hint(file):
    """The exercise's check, on each wrong schedule: the right problem and hint, in zh and en."""
    en_case, en_hint, zh_case, zh_hint = WRONG_SCHEDULES[file]
    found = checks._check_schedule(PRACTICE, 0, lab08.schedule_cases(load(file).schedule_1f1b))
    assert found, file
    en, zh = text(found, "en"), text(found, "zh")
    assert en_case in en and en_hint in en, en
    assert zh_case in zh and zh_hint in zh, zh
    assert not re.search(HAN, en)


def test_schedule_check_passes_the_solution_and_reports_errors():
    def check(result):
        return checks._check_schedule(PRACTICE, 0, result)
    assert check(lab08.schedule_cases(solution_schedule())) == []

    def raises(p, m):
        return [checks.reference_1f1b(p, m), 1 // (m - 1)][0]   # ZeroDivisionError when m == 1
    found = check(lab08.schedule_cases(raises))
    ones = sum(m == 1 for _, m in PRACTICE.inputs[0]["schedule_cases"])
    assert "ZeroDivisionError" in text(found, "en") and len(found) == min(ones, 2) + (ones > 2)
    found = check(lab08.schedule_cases(lambda p, m: [["F0", "B0"]] * p))
    assert '("F", mb)' in text(found, "en") and "more case(s)" in text(found, "en")
    # valid, deadlock-free, the same peak as 1F1B, yet not 1F1B's order: the exact order is checked last
    odd = checks.reference_1f1b(3, 4)
    odd[0] = [("F", 0), ("F", 1), ("B", 0), ("F", 2), ("F", 3), ("B", 1), ("B", 2), ("B", 3)]
    assert lab08.simulate(odd)["ok"] and lab08.peak_alive(odd[0]) == 3
    found = checks.schedule_problem(odd, 3, 4)
    assert "stage 0's action #3 is B0; 1F1B runs F2 there" in found["en"] and "第 3 个动作是 B0" in found["zh"]


# ------------------------------------------------------------------ exercise 2's check on simulated results
def simulated_run(rank: int, params, losses=None, peak=None, forwards=lab08.M) -> dict:
    ref = checks.reference_training(RUN2.inputs)
    return {"actions": [list(a) for a in checks.reference_1f1b(2, lab08.M)[rank]],
            "steps": [{"params": params[i], "losses": (losses or ref["losses"])[i] if rank == 1 else [],
                       "peak": lab08.max_alive(2, lab08.M, rank) if peak is None else peak, "forwards": forwards}
                      for i in range(lab08.STEPS)]}


def graded_model():
    """The lab's model with the grade's starting weights (each stage's from its rank's inputs)."""
    model = lab08.lab_model()
    for s in range(2):
        lab08.load_weights(lab08.stage_layers(model, s), RUN2.inputs[s]["weights"])
    return model


def test_run_check_on_simulated_results():
    ref = checks.reference_training(RUN2.inputs)
    xs, ys = RUN2.inputs[0]["x"], RUN2.inputs[1]["y"]
    # the reference's hand-written SGD is torch.optim.SGD's, on the whole batch's mean loss
    model = graded_model()
    opt = torch.optim.SGD(model.parameters(), lr=lab08.LR)
    for step in range(lab08.STEPS):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(torch.cat(list(xs[step]))), torch.cat(list(ys[step]))).backward()
        opt.step()
    assert checks._close(list(lab08.stage_layers(model, 1).parameters()), ref["params"][1][-1])
    assert checks._close(list(lab08.stage_layers(model, 0).parameters()), ref["params"][0][-1])
    for r in range(2):
        assert checks._check_run(RUN2, r, simulated_run(r, ref["params"][r])) == []
    # GPipe executed: 3 micro-batches alive on stage 0
    found = checks._check_run(RUN2, 0, simulated_run(0, ref["params"][0], peak=3))
    assert "kept 3 micro-batches alive; 1F1B keeps at most 2" in text(found, "en")
    # stage 0 never got a gradient
    frozen = checks.reference_training(RUN2.inputs, stage_zero_frozen=True)
    assert not all(torch.equal(a, b) for a, b in zip(frozen["params"][0][0], ref["params"][0][0]))
    found = checks._check_run(RUN2, 0, simulated_run(0, frozen["params"][0]))
    assert "got no gradient" in text(found, "en") and "requires_grad_()" in text(found, "zh")
    # summed instead of averaged micro-batch gradients (a learner dividing by m twice, or not at all)
    model = graded_model()
    opt = torch.optim.SGD(model.parameters(), lr=lab08.LR * lab08.M)   # PyTorch's SGD, m times the step
    params1 = []
    for step in range(lab08.STEPS):
        opt.zero_grad()
        sum(lab08.loss_fn(model(x), y) for x, y in zip(xs[step], ys[step])).backward()
        opt.step()
        params1.append([p.detach().clone() for p in lab08.stage_layers(model, 1).parameters()])
    found = checks._check_run(RUN2, 1, simulated_run(1, params1))
    assert "differ from single-process training" in text(found, "en") and "stash[mb]" in text(found, "en")
    # losses of the micro-batches in another order
    shuffled = [ls[::-1] for ls in ref["losses"]]
    assert "micro-batch order" in text(checks._check_run(RUN2, 1, simulated_run(1, ref["params"][1], shuffled)), "en")
    # a wrong schedule copied into exercise 2
    bad = simulated_run(0, ref["params"][0])
    bad["actions"] = [list(a) for a in lab08.gpipe(2, lab08.M)[0]]
    found = checks._check_run(RUN2, 0, bad)
    assert "finish exercise 1 first" in text(found, "en") and "keeps 3 micro-batches alive" in text(found, "en")


def test_alive_micro_batches_are_counted_by_the_driver():
    """The driver's stage wrapper counts forwards whose output has not had its backward yet."""
    for order, peak in [("FFFBBB", 3), ("FBFBFB", 1), ("FFBFBB", 2)]:
        stage = lab08._Counted(lab08.stage_layers(lab08.lab_model(), 0))
        outs = deque()
        for kind in order:
            if kind == "F":
                outs.append(stage(torch.randn(lab08.ACT_SHAPE[0], 4, dtype=torch.float64)))
            else:
                out = outs.popleft()
                out.backward(torch.ones_like(out))
        assert stage.peak == peak and stage.alive == 0 and stage.forwards == 3, order


def test_blocking_send_trace_check_and_explanations():
    traces = {0: [{"op": "send", "peer": 1}, {"op": "recv", "peer": 1}], 1: [{"op": "recv", "peer": 0}]}
    found = checks._no_blocking_send(Run(world_size=2, seed=0, inputs=[], traces=traces))
    assert "rank(s) [0]" in found[0]["en"] and "dist.isend" in found[0]["zh"]
    assert checks._no_blocking_send(Run(world_size=2, seed=0, inputs=[], traces={0: [{"op": "recv", "peer": 1}], 1: []})) == []
    hang = checks._explain_run("hang", "…", "")
    assert "never comes" in hang[0]["en"]
    both_send = "✗ hung\n  rank 0: send (f.py:40 in run_stage)\n  rank 1: send (f.py:51 in run_stage)"
    assert "waits in a blocking dist.send" in checks._explain_run("hang", both_send, "")[0]["en"]
    one_recv = both_send.replace("rank 1: send", "rank 1: recv")
    assert "never comes" in checks._explain_run("hang", one_recv, "")[0]["en"]
    crash = checks._explain_run("crash", "AttributeError: 'NoneType' object has no attribute", "")
    assert "requires_grad_()" in crash[0]["en"]
    assert checks._explain_run("wrong", "", "") == []


# ------------------------------------------------------------------ graded (launched)
# The solutions' passing grades: solutions/{zh,en}/lab_*.ipynb, re-graded by nbval (test_solution_cells.py).
@pytest.mark.timeout(200)
def test_blocking_sends_deadlock_with_an_explanation():
    """1F1B with blocking dist.send: in the steady phase both ranks send at once. On gloo it hangs
    (both ranks wait in send); were the messages buffered, the trace check would fail it instead."""
    w = grade("lab08.run_1f1b", WRONG / "run_blocking_send.py", lang="zh")
    assert not w.passed and w.outcome in ("hang", "wrong"), w.feedback
    for phrase in ["阻塞的 dist.send", "dist.isend", "实验 10 的练习 6"]:
        assert phrase in w.feedback, (phrase, w.feedback)
    lines = w.feedback.split("\n", 1)[1]
    assert re.search(HAN, lines) and "blocking dist.send" not in lines and "a stage waits" not in lines, w.feedback
