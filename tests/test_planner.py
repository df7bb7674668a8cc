"""dtrain_lab.planner (``dtrain-lab plan``): dry-run planning of any layout, validated.

In-process: the presets' parameter counts against the papers (and an independent formula), the ZeRO
paper's memory table exactly (7.5B, N_d = 64, K = 12), a Llama-3-405B-like 4D layout (TP 8, CP 16,
PP 16, DP 8 at 131,072 tokens: Dubey et al. 2024 Table 4) that fits 80 GB with activation
checkpointing and not without, the dry run's collective counts against the formulas written in
planner/core.py, bad layouts rejected with a bilingual message that says what to change, the JSON.
Multi-process (one 4-rank launch of ``dtrain_lab.demos.plan_run``, three layouts covering tp, pp, cp, ep,
dp and edp): training equals one process; the calls and bytes each rank handed its backend per
dimension equal the plan of that rank exactly (MoE: the bytes summed over the ep group, as a learned
router is not balanced); the activation bytes the pipeline executor measured equal the plan's exactly
(MoE within 2 %); parameters per rank exactly. Peak memory is the bench row ``plan_memory``
(dtrain_lab/bench/plan_memory.py, target 5 %); here only a loose guard.
"""
import json
import uuid

import pytest

from dtrain_lab.i18n import LabError
from dtrain_lab.planner import model_preset, plan, stage_layers
from forkjob import fork_launch


def _formula_params(c) -> int:
    hd = c.d_model // c.n_heads
    attn = 2 * c.n_heads * hd * c.d_model + 2 * c.n_kv_heads * hd * c.d_model
    ffn = 3 * c.d_model * c.ffn_hidden * (c.n_experts or 1) + (c.d_model * c.n_experts)
    return c.n_layers * (attn + ffn + 2 * c.d_model) + 2 * c.vocab * c.d_model + c.d_model


@pytest.mark.parametrize("preset,billions", [("llama2-7b", 6.74), ("llama3-8b", 8.03), ("llama3-70b", 70.55),
                                             ("llama3-405b", 405.85), ("mixtral-8x7b", 46.70)])
def test_presets_count_what_the_papers_say(preset, billions):
    moe = model_preset(preset).config.n_experts > 0
    p = plan(preset, world_size=8, tp=1 if moe else 8, ep=8 if moe else 1, dry_run=False)
    assert p.model["params"] == _formula_params(model_preset(preset).config)
    assert p.model["params"] / 1e9 == pytest.approx(billions, abs=0.01)
    assert "arXiv" in p.model["source"]


def test_zero_paper_table_exactly():
    # ZeRO paper Figure 1: 7.5B parameters, N_d = 64, K = 12: 120 GB, 31.4 GB, 16.6 GB, 1.9 GB per device
    paper = [120, 31.4, 16.6, 1.9]
    got = [plan("zero-paper-7.5b", world_size=64, zero=z).memory["model_states"] / 1e9 for z in range(4)]
    assert [round(g, 1) for g in got] == paper
    assert got[0] == 120 and got[3] == pytest.approx(1.875)


def test_llama3_405b_4d_layout_fits_80gb_with_checkpointing():
    kw = dict(world_size=16384, tp=8, cp=16, pp=16, seq_len=131072, microbatches=16, zero=1)
    with_ckpt = plan("llama3-405b", act_ckpt=True, **kw).to_dict()
    lay, mem = with_ckpt["layout"], with_ckpt["memory"]
    assert (lay["dp"], lay["tp"], lay["cp"], lay["pp"]) == (8, 8, 16, 16)
    assert mem["fits"] and max(s["peak"] for s in mem["per_stage"]) < 80e9
    assert mem["activations_no_ckpt"] > 80e9                 # the same layout without checkpointing
    assert not plan("llama3-405b", act_ckpt=False, **kw).memory["fits"]
    assert with_ckpt["comm"]["tp"]["link"] == "nvlink" and with_ckpt["comm"]["cp"]["link"] == "network"
    assert 0 < with_ckpt["time"]["mfu"] < 1 and with_ckpt["time"]["bubble"] == pytest.approx(15 / 31)
    assert len(with_ckpt["assumptions"]) >= 8
    json.dumps(with_ckpt)                                      # what --json prints


def test_dry_run_counts_match_the_formulas():
    dense = plan("tiny-dense", world_size=4, tp=2, dp=2, seq_len=16, precision="fp32").dry_run["dense"]
    assert dense["collectives"] == {"allreduce_": 4} and dense["collectives_ckpt"] == {"allreduce_": 5}
    moe = plan("tiny-moe", world_size=4, dp=2, ep=2, cp=2, seq_len=16, precision="fp32").dry_run["moe"]
    assert moe["collectives"] == {"alltoall_base_": 5} and moe["collectives_ckpt"] == {"alltoall_base_": 8}
    assert moe["params"]["expert"] == 2 * 3 * 32 * 32            # 2 of the 4 experts on this rank


def test_stages_and_ranks():
    assert [stage_layers(10, 4, s) for s in range(4)] == [[0, 1, 2], [3, 4, 5], [6, 7], [8, 9]]
    kw = dict(world_size=4, pp=2, dp=2, seq_len=16, precision="fp32", microbatches=4)
    first, last = plan("tiny-dense", rank=0, **kw), plan("tiny-dense", rank=3, **kw)
    assert (first.layout["stage"], last.layout["stage"]) == (0, 1)
    assert first.comm["pp"]["calls"] == 8 and last.comm["pp"]["calls"] == 4   # header + activation / gradient
    assert first.memory["in_flight"] == 2 and last.memory["in_flight"] == 1


@pytest.mark.parametrize("kwargs,words", [
    (dict(world_size=12, tp=8), ["12", "8", "tp × pp × cp"]),
    (dict(world_size=16, tp=16), ["8 KV", "tp = 16"]),              # 405B has 128 heads, 8 KV heads
    (dict(world_size=256, pp=256), ["pp ≤ 126"]),
    (dict(world_size=8, tp=8, zero=5), ["5"]),
    (dict(world_size=8, cp=8, seq_len=100), ["100", "16"]),
    (dict(world_size=8, ep=2), ["ep = 2"]),
    (dict(model="mixtral-8x7b", world_size=8, tp=2), ["tp = 1"]),
])
def test_bad_layouts_say_what_to_change(kwargs, words):
    with pytest.raises(LabError) as e:
        plan(kwargs.pop("model", "llama3-405b"), dry_run=False, **kwargs)
    text = str(e.value)
    assert all(w in text for w in words), text
    assert any("\u4e00" <= ch <= "\u9fff" for ch in text)          # both languages
    with pytest.raises(LabError):
        plan("gpt-5", world_size=8)


def test_cli_help_json_and_errors(capsys):
    from dtrain_lab.cli import main

    with pytest.raises(SystemExit):
        main(["plan", "--help"])
    text = capsys.readouterr().out
    for opt in ("--world-size", "--dp", "--tp", "--pp", "--cp", "--ep", "--zero", "--model", "--nvlink-gbps",
                "--network-gbps", "--json", "--lang"):
        assert opt in text, opt
    with pytest.raises(SystemExit):
        main(["--lang", "zh", "plan", "--help"])
    assert "张量并行度" in capsys.readouterr().out
    assert main(["plan", "--model", "tiny-dense", "--world-size", "4", "--tp", "2", "--seq-len", "16", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert set(d) == {"model", "hardware", "layout", "memory", "comm", "time", "dry_run", "assumptions"}
    assert d["layout"]["dp"] == 2 and d["comm"]["tp"]["calls"] > 0
    assert main(["plan", "--model", "tiny-dense", "--world-size", "6", "--tp", "4"]) == 2
    err = capsys.readouterr().err
    assert "tp × pp × cp" in err and "world_size = 6" in err
    assert main(["--lang", "en", "plan", "--model", "llama3-8b", "--world-size", "8", "--tp", "8", "--no-dry-run"]) == 0
    assert "Layout: 8 ranks" in capsys.readouterr().out


# ------------------------------------------------------------------------------------ real runs (4 ranks)
@pytest.fixture(scope="module")
def real():

    r = fork_launch("dtrain_lab.demos.plan_run", nproc=4, timeout=600, quiet=True,
                    env={"DTRAIN_TEST_TAG": uuid.uuid4().hex})
    assert r.ok, r.summary() + "\n" + "\n".join(x.output[-3000:] for x in r.ranks)
    return r.metrics


def _plans(name):
    from dtrain_lab.bench.plan_memory import predicted
    from dtrain_lab.demos.plan_run import LAYOUTS

    preset, degrees = LAYOUTS[name]
    return degrees, {rank: predicted(preset, degrees, rank) for rank in range(4)}


@pytest.mark.timeout(900)
@pytest.mark.parametrize("name", ["tp2_dp2", "pp2_cp2", "cp2_dp2_ep2"])
def test_plan_equals_the_real_run(real, name):
    degrees, plans = _plans(name)
    for rank in range(4):
        got, want = real[rank]["layouts"][name], plans[rank]
        assert got["max_diff"] < 1e-4 and got["moved"] > 1e-3, (name, rank)        # trains like one process
        assert got["groups"] == got["expected_groups"] and len(got["groups"]) == 7   # ParallelDims, for real
        assert got["stage"] == want["layout"]["stage"]
        assert got["params"] == {"dense": want["memory"]["dense_params"], "expert": want["memory"]["expert_params"]}
        for dim, entry in want["comm"].items():
            op_names = {o["op"] for o in entry["ops"]}
            measured = got["comm"].get(dim, {})
            assert {op for op in measured if op != "recv"} == op_names, (name, rank, dim, measured, entry)
            for o in entry["ops"]:
                assert measured[o["op"]]["calls"] == o["calls"], (name, rank, dim)
                if dim != "ep":
                    assert measured[o["op"]]["bytes"] == o["payload_bytes"], (name, rank, dim)
        per_mb = want["memory"]["activations_per_microbatch"]
        if degrees["ep"] == 1:
            assert got["activation_bytes"] == [per_mb] * 2, (name, rank)
        else:
            assert all(abs(b / per_mb - 1) < 0.02 for b in got["activation_bytes"]), (name, rank)
        assert 0.9 < got["peak"] / want["memory"]["peak"] < 1.1, (name, rank)       # the bench row: 5 %
    if degrees["ep"] > 1:        # a learned router: per-rank bytes vary, their sum over an ep group does not
        from dtrain_lab.parallel.dims import ParallelDims

        dims = ParallelDims(world_size=4, **degrees)
        for group in dims.groups("ep"):
            real_sum = sum(real[r]["layouts"][name]["comm"]["ep"]["all_to_all"]["bytes"] for r in group)
            assert real_sum == sum(plans[r]["comm"]["ep"]["payload_bytes"] for r in group)


def test_widget_moves_with_the_layout(capsys):
    pytest.importorskip("ipywidgets")
    import matplotlib

    matplotlib.use("Agg")
    from dtrain_lab.viz_plan import plan_widget, plot_plan, summary

    box = plan_widget(model="tiny-dense", world_size=8, tp=2, pp=2, cp=1, microbatches=2, seq_len=16)
    ctl = box.controls
    before = plan("tiny-dense", world_size=8, tp=2, pp=2, microbatches=2, seq_len=16).to_dict()
    ctl["microbatches"].value = 8                 # the bubble shrinks, activations in flight grow
    after = plan("tiny-dense", world_size=8, tp=2, pp=2, microbatches=8, seq_len=16).to_dict()
    assert after["time"]["bubble"] < before["time"]["bubble"]
    assert max(s["peak"] for s in after["memory"]["per_stage"]) > max(s["peak"] for s in before["memory"]["per_stage"])
    assert "GB" in summary(after) and len(plot_plan(after)) == 2
    capsys.readouterr()
    ctl["tp"].value = 8                           # 8 × 2 does not divide 8 ranks: the error, not a traceback
    shown = "".join(o.get("text", "") for o in box.children[-1].outputs) or capsys.readouterr().out
    assert "tp × pp × cp = 8 × 2 × 1 = 16" in shown and "Traceback" not in shown


# ------------------------------------------------------------------------------- issue 23 §2: the planner
def _one_f_one_b(pp: int, s: int, m: int) -> list[tuple[int, bool]]:
    """Megatron-LM's non-interleaved 1F1B on stage ``s``, played out: at every backward, the micro-batches
    in flight and whether a gradient exists yet (allocated lazily by the first backward)."""
    warmup = min(pp - s - 1, m)
    order = ["F"] * warmup + ["F", "B"] * (m - warmup) + ["B"] * warmup
    in_flight, grads, seen = 0, False, []
    for op in order:
        if op == "F":
            in_flight += 1
        else:
            seen.append((in_flight, grads))
            in_flight, grads = in_flight - 1, True
    return seen


@pytest.mark.parametrize("pp,m", [(2, 1), (2, 2), (2, 4), (4, 2), (4, 4), (4, 6)])
def test_peak_moments_follow_the_1f1b_schedule(pp, m):
    p = plan("tiny-dense", world_size=pp, pp=pp, seq_len=8, precision="fp32", microbatches=m)
    for st in p.memory["per_stage"]:
        seen = _one_f_one_b(pp, st["stage"], m)
        without = max(n for n, g in seen if not g)              # the first backward
        with_grads = max((n for n, g in seen if g), default=0)  # every later one (0: after the only backward)
        want = {"first": without, "after": with_grads} if with_grads < without else {"steady": with_grads}
        assert st["moments_in_flight"] == want, (pp, m, st["stage"])


def test_stage0_peak_holds_the_gradients_when_m_equals_pp():
    # m = pp: right after stage 0's first backward the gradients of all its parameters exist (.grad is
    # allocated by that backward) and pp − 1 micro-batches are still in flight, each keeping at least the
    # (tokens, d) output it sent to stage 1 for that stage's gradient. Short sequences make the gradients
    # outweigh a micro-batch's activations, so the first backward's moment (no gradients, pp in flight:
    # the only one the planner used to count) is not the peak.
    pp, seq, d = 2, 4, 32
    p = plan("tiny-dense", world_size=pp, pp=pp, seq_len=seq, precision="fp32", microbatches=pp)
    st = p.memory["per_stage"][0]
    floor = st["params"] + st["grads"] + st["optimizer"] + (pp - 1) * seq * d * 4
    assert st["peak"] >= floor
    assert st["moments"]["first"] < floor                        # the old formula's figure
    assert st["peak_moment"] == "after" and st["peak_grads"] == st["grads"]
    resident = plan("tiny-dense", world_size=pp, pp=pp, seq_len=seq, precision="fp32", microbatches=pp,
                    grads_resident=True).memory["per_stage"][0]
    assert resident["peak"] == resident["moments"]["resident"] >= max(st["moments"].values())


def test_every_peak_that_has_gradients_contains_the_row():
    p = plan("llama3-405b", world_size=16384, tp=8, cp=16, pp=16, seq_len=131072, microbatches=16, act_ckpt=True)
    for st in p.memory["per_stage"]:
        states = st["params"] + st["optimizer"]
        assert st["peak"] == max(st["moments"].values())
        assert st["peak"] == states + st["peak_grads"] + st["activations"]
    assert p.memory["per_stage"][0]["peak_grads"] == p.memory["grads"]   # m = pp: stage 0 after its first backward


def test_interleaved_schedule_and_llama3_split():
    p1 = plan("llama3-8b", microbatches=8, seq_len=1024, world_size=64, tp=8, pp=8)
    p2 = plan("llama3-8b", microbatches=8, seq_len=1024, world_size=64, tp=8, pp=8, virtual_stages=2)
    # Narayanan et al. 2021, section 2.2.2: the bubble is (p − 1)/v micro-batch slots against m of work
    assert p1.time["bubble"] == pytest.approx(7 / (8 + 7))
    assert p2.time["bubble"] == pytest.approx((7 / 2) / (8 + 7 / 2))
    assert p2.comm["pp"]["calls"] == 2 * p1.comm["pp"]["calls"] + 8   # stage 0 also sends its gradients once
    assert p2.time["mfu"] > p1.time["mfu"]
    # Llama 3: one layer fewer on the first and the last stage (126 layers + 2 over 16 stages: 7, 8 × 14, 7)
    assert [len(stage_layers(126, 16, s, 1, "llama3")) for s in range(16)] == [7] + [8] * 14 + [7]
    assert [len(stage_layers(126, 16, s)) for s in range(16)] == [8] * 14 + [7] * 2
    assert sorted(x for s in range(4) for x in stage_layers(32, 4, s, 2)) == list(range(32))
    assert stage_layers(32, 4, 0, 2) == [0, 1, 2, 3, 16, 17, 18, 19]
    for bad in (dict(virtual_stages=2, pp=1, world_size=8, tp=8), dict(stage_split="odd", world_size=64, tp=8, pp=8),
                dict(efficiency=1.5, world_size=8, tp=8), dict(efficiency=0, world_size=8, tp=8)):
        with pytest.raises(LabError):
            plan("llama3-8b", dry_run=False, **bad)


def test_roofline_is_labelled_a_bound_and_the_estimate_uses_the_efficiency(capsys):
    from dtrain_lab.cli import main
    from dtrain_lab.planner import format_plan

    kw = dict(world_size=8, zero=3, seq_len=512)
    bound = plan("llama2-7b", **kw)
    est = plan("llama2-7b", efficiency=0.4, **kw)
    assert bound.time["estimate"] is None and est.time["mfu"] == bound.time["mfu"]
    e = est.time["estimate"]
    assert e["efficiency"] == 0.4 and e["step_s"] > bound.time["step_s"] and e["mfu"] < bound.time["mfu"] <= 1
    assert plan("llama2-7b", efficiency=1.0, **kw).time["estimate"]["step_s"] == pytest.approx(bound.time["step_s"])
    for text in (format_plan(bound, "en"), format_plan(est, "en")):
        assert "MFU ≤" in text and "Bound" in text and "MFU 100.0 %" not in text
    assert "Estimate (matmuls at 40 %" in format_plan(est, "en") and "估计值" in format_plan(est, "zh")
    assert main(["--lang", "en", "plan", "--model", "llama2-7b", "--world-size", "8", "--zero", "3", "--seq-len", "512",
                 "--efficiency", "0.4", "--virtual-stages", "1", "--stage-split", "even"]) == 0
    out = capsys.readouterr().out
    assert "MFU ≤" in out and "Estimate" in out and "allocated up front" in out


def test_interleaved_warmup_is_megatrons_including_m_equal_pp():
    """Megatron-LM's forward_backward_pipelining_with_interleaving: 2(pp − s − 1) + (v − 1)·pp warm-up
    chunk forwards, and every forward first when the micro-batches are exactly pp; without
    interleaving, pp − s − 1 whatever m."""
    from dtrain_lab.planner.schedule import pp_warmup

    pp, v = 4, 2
    assert [pp_warmup(pp, s, v, m=8) for s in range(pp)] == [2 * (pp - s - 1) + (v - 1) * pp for s in range(pp)]
    assert [pp_warmup(pp, s, v, m=pp) for s in range(pp)] == [pp * v] * pp
    assert [pp_warmup(pp, s, 1, m=pp) for s in range(pp)] == [pp - s - 1 for s in range(pp)]
