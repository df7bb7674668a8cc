"""The bench's own logic, without launching or timing anything: row selection, the ratios and counts
rows are built from, the peak-memory accounting, the table in both languages. (The rows themselves are
measurements: ``make bench`` runs them.)"""
from types import SimpleNamespace

import pytest
import torch

from dtrain_lab import i18n
from dtrain_lab.bench import collectives, ddp_overlap, restarts
from dtrain_lab.bench.cli import main
from dtrain_lab.bench.memtrack import PeakTensorMemory
from dtrain_lab.bench.table import ZERO_NOTES, table


def test_only_rejects_unknown_rows(capsys):
    with pytest.raises(SystemExit):
        main(["--only", "restarts,nonsense"])
    assert "nonsense" in capsys.readouterr().err


def test_restart_reliability_counts_only_clean_single_restarts(monkeypatch):
    # per call, in the order the modes alternate: (ok, hung, attempts reported, totals)
    script = iter([
        (True, False, [1, 1], [16.0, 16.0]),     # plain: clean
        (True, False, [1, 1], [16.0, 16.0]),     # own store: clean
        (True, False, [1, 1], [16.0, 16.0]),     # runtime: clean
        (True, False, [2, 2], [16.0, 16.0]),     # plain: finished only after a second restart
        (False, True, [1, 1], [None, None]),     # own store: hung
        (True, False, [1, 1], [16.0, 8.0]),      # runtime: wrong result on rank 1
    ])
    calls = []

    def fake_launch(target, **kw):
        calls.append((kw["args"], kw["env"].get("TORCH_DISABLE_SHARE_RDZV_TCP_STORE")))
        ok, hung, attempts, totals = next(script)
        metrics = {r: {"attempt": a, "total": t, "stale_keys": ["k"] if r == 0 else []}
                   for r, (a, t) in enumerate(zip(attempts, totals))}
        return SimpleNamespace(ok=ok, hung=hung, metrics=metrics)

    monkeypatch.setattr(restarts, "launch", fake_launch)
    row = restarts.restart_reliability(trials=2, nproc=2)
    assert [c["clean"] for c in row["modes"].values()] == [1, 1, 1]
    assert row["modes"]["plain"]["outcomes"] == ["clean", "more restarts"]
    assert row["modes"]["plain + TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1"]["outcomes"] == ["clean", "hang"]
    assert row["modes"]["dtrain_lab.jobs.runtime"]["outcomes"] == ["clean", "wrong result"]
    assert "ratio" not in row and row["modes"]["plain"]["stale_keys_seen"] == 2     # counts, no ratio
    assert calls[:3] == [(["plain"], None), (["plain"], "1"), (["runtime"], None)]   # modes alternate
    text = table([row])
    assert "| clean resumes after a killed rank: plain | 1/2 |" in text
    assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1" in text.splitlines()[-1]


def test_ring_ratio_pairs_adjacent_blocks_and_averages_no_sizes():
    # a drifting machine: both variants slow down together in round 2; pairing cancels it
    report = {"backend": "gloo", "repeats": 3, "rows": [
        {"op": "all_reduce", "bytes": 4096, "seconds": 2e-4, "min_s": 1e-4, "iters": 64, "busbw": 2e7,
         "samples": [1e-4, 1e-3, 2e-4]},
        {"op": "ring_all_reduce", "bytes": 4096, "seconds": 2.4e-4, "min_s": 1.2e-4, "iters": 64, "busbw": 1e7,
         "samples": [1.2e-4, 1.2e-3, 2.4e-4]},
    ]}
    ratio_row, bw_row = collectives.rows_from_report(report, nproc=2)
    (size,) = ratio_row["per_size"]
    assert size["paired"] == pytest.approx([1.2, 1.2, 1.2]) and size["ratio"] == pytest.approx(1.2)
    assert size["ratio_of_min"] == pytest.approx(1.2)
    assert "ratio" not in ratio_row                       # no mean over sizes
    assert bw_row["points"][0]["busbw_MBps"] == pytest.approx(20.0)


def test_ddp_overlap_row_arithmetic():
    m = {"backend": "gloo", "params": 100, "buckets": 14, "launched_in_backward": 13, "repeats": 3, "steps": 5,
         "samples": {"compute": [0.050, 0.060, 0.050], "comm": [0.020, 0.020, 0.030],
                     "no_overlap": [0.070, 0.072, 0.080], "overlap": [0.062, 0.060, 0.064],
                     "torch": [0.061, 0.061, 0.070]}}
    row = ddp_overlap.row_from_report(m, nproc=2)
    assert row["median_s"]["no_overlap"] == pytest.approx(0.072) and row["min_s"]["overlap"] == pytest.approx(0.060)
    assert row["hidden"] == pytest.approx((0.072 - 0.062) / 0.020)
    assert row["overlap_vs_no_overlap"] == pytest.approx(0.062 / 0.072)
    assert row["no_overlap_vs_sum"] == pytest.approx(0.072 / (0.050 + 0.020))


def test_peak_tensor_memory_counts_live_storages_once():
    keep = torch.zeros(1000)                              # 4000 B, made before: tracked explicitly
    mem = PeakTensorMemory(lambda: {"kept": [keep]})
    with mem:
        mem.track(keep)
        a = torch.ones(500)                               # +2000
        v = a[:100]                                       # a view: the same allocation, no bytes
        b = a * 2                                         # +2000: peak 8000
        del a, b
        c = torch.ones(250)                               # 4000 + 1000 (v keeps a's storage alive: +2000)
        big = torch.zeros(10)
        big.untyped_storage().resize_(4000 * 4)           # storage resized in place, as ZeRO-3 gathers
        big.add_(1)                                       # the next operator sees it: 4000 + 2000 + 1000 + 16000
    assert mem.peak == 4000 + 2000 + 1000 + 16000
    assert mem.peak_parts == {"kept": 4000, "other": 19000}
    assert mem.peak_op == "aten.add_.Tensor"
    del v, c, big


@pytest.mark.parametrize("lang", i18n.LANGS)
def test_table_renders_every_row(lang):
    pred = {"params": 12.0e6, "grads": 6.0e6, "optimizer": 12.0e6, "total": 30.0e6}
    variant = {"ratio": 1.8, "peak": 54e6, "peak_op": "aten.split.Tensor", "predicted": pred,
               "peak_parts": {"params": 12e6, "grads": 0, "optimizer": 12e6, "other": 30e6}}
    rows = [
        {"name": "launch_overhead", "ratio": 1.05, "dtrain_launch_s": 4.2, "bare_torchrun_s": 4.0, "repeats": 5,
         "exec_ratio": 1.1, "cpu_s": {"bare": 5.0, "fork": 2.5, "exec": 5.2}, "cpu_ratio": 0.5, "exec_cpu_ratio": 1.04},
        {"name": "launch_output", "ratio": 1.2, "dtrain_launch_s": 4.8, "bare_torchrun_s": 4.0, "megabytes": 39,
         "repeats": 3, "nproc": 2},
        {"name": "ring_vs_all_reduce", "nproc": 2, "backend": "gloo", "repeats": 7, "per_size": [
            {"bytes": 4096, "ratio": 1.2, "ring_s": 1.2e-4, "all_reduce_s": 1e-4, "ring_min_s": 1e-4,
             "all_reduce_min_s": 9e-5, "ratio_of_min": 1.11}]},
        {"name": "busbw", "points": [{"bytes": 4096, "busbw_MBps": 40.0, "seconds": 1e-4, "min_s": 9e-5, "iters": 512}]},
        {"name": "ddp_step_time", "ratio": 0.99, "ours_s": 0.05, "torch_s": 0.05, "naive_ratio": 1.5,
         "no_overlap_ratio": 1.1},
        ddp_overlap.row_from_report({"backend": "gloo", "params": 1, "buckets": 14, "launched_in_backward": 13,
                                     "repeats": 1, "steps": 1, "samples": {k: [0.01] for k in ddp_overlap.ORDER}}, 2),
        {"name": "compression", "steps": 10, "nproc": 2, "none_final_loss": 1.0, "methods": [
            {"method": "topk", "bytes_ratio": 0.02, "loss_ratio": 1.01, "final_loss": 1.01}]},
        {"name": "zero_memory", "variants": {k: variant for k in ZERO_NOTES}},
        {"name": "pipeline_bubble", "nproc": 2, "backend": "gloo",
         "points": [{"schedule": "1f1b", "m": 4, "ratio": 1.05, "measured": 0.21, "formula": 0.2}]},
        {"name": "pipeline_activations", "m": 4, "stages": [{"stage": 0, "ratio": 0.5, "1f1b_bytes": 10,
                                                             "gpipe_bytes": 20, "formula": 0.5}]},
        {"name": "plan_memory", "nproc": 4, "target": 0.05, "layouts": {"tp2dp2": {
            "worst_ratio": 1.02, "ranks": [{"rank": 0, "ratio": 1.01, "measured": 101, "predicted": 100},
                                           {"rank": 3, "ratio": 1.02, "measured": 102, "predicted": 100}]}}},
    ]
    before = i18n.get_lang()
    try:
        i18n.set_lang(lang)
        text = table(rows)
    finally:
        i18n.set_lang(before)
    lines = text.splitlines()
    assert lines[0] == i18n.tr("bench_head", lang)
    assert len(lines) == 2 + 1 + 1 + 1 + 1 + 1 + 1 + 1 + 1 + len(ZERO_NOTES) + 1 + 1 + 1
    assert all(line.startswith("|") and line.endswith("|") for line in lines)
    for key in ZERO_NOTES.values():
        assert i18n.tr(key, lang) in text
