"""ZeRO's memory and communication formulas (dtrain_lab.perfmodel), the corrected 7B table and the
calculator widget. In-process, no launch: the measured side is in tests/test_fsdp.py."""
import sys

import pytest

from dtrain_lab import i18n, perfmodel
from dtrain_lab.perfmodel import memory_table, weights_only_bytes, zero_comm_volume, zero_memory

GB = 1e9


def test_paper_example_7_5B_on_64_gpus():
    """ZeRO paper, Figure 1 / section 5: Ψ = 7.5B, N = 64, K = 12."""
    totals = [zero_memory(7.5e9, s, 64)["total"] / GB for s in range(4)]
    assert totals[0] == pytest.approx(120)
    assert round(totals[1], 1) == 31.4
    assert round(totals[2], 1) == 16.6
    assert round(totals[3], 1) == 1.9


def test_breakdown_mixed_and_fp32():
    psi, n = 1000, 8
    assert zero_memory(psi, 0, n) == {"params": 2000, "grads": 2000, "optimizer": 12000, "total": 16000}
    assert zero_memory(psi, 1, n) == {"params": 2000, "grads": 2000, "optimizer": 1500, "total": 5500}
    assert zero_memory(psi, 2, n) == {"params": 2000, "grads": 250, "optimizer": 1500, "total": 3750}
    assert zero_memory(psi, 3, n) == {"params": 250, "grads": 250, "optimizer": 1500, "total": 2000}
    assert zero_memory(psi, 0, n, precision="fp32") == {"params": 4000, "grads": 4000, "optimizer": 8000,
                                                        "total": 16000}
    assert zero_memory(psi, 3, n, precision="fp32")["total"] == 2000
    assert zero_memory(psi, 1, n, k=4)["optimizer"] == 500
    for s in range(4):   # a world of one divides nothing
        assert zero_memory(psi, s, 1)["total"] == 16 * psi


def test_seven_billion_myth_corrected():
    """'7B: 28 GB on one card, 14 GB with ZeRO-2, 7 GB with ZeRO-3' is wrong on two counts."""
    assert weights_only_bytes(7e9) / GB == pytest.approx(28)          # 28 GB = fp32 weights only
    rows = memory_table(7e9, 8)
    assert len(rows) == 8 and {r["precision"] for r in rows} == {"mixed", "fp32"}
    by = {(r["stage"], r["precision"]): r for r in rows}
    assert by[(0, "mixed")]["total_gb"] == pytest.approx(112)       # 16 bytes/param of model states
    assert by[(3, "mixed")]["total_gb"] == pytest.approx(112 / 8)   # divided by N, not by 4
    assert memory_table(7e9, 64)[3]["total_gb"] == pytest.approx(1.75)
    text = perfmodel.format_memory_table(rows, "en")
    assert "ZeRO-3" in text and "112 GB" in text
    assert "梯度" in perfmodel.format_memory_table(rows, "zh")


def test_comm_volume_section_7():
    psi, n = 1000, 4
    ddp = zero_comm_volume(psi, 0, n, bytes_per_elem=1)
    assert ddp["all_reduce"] == pytest.approx(2 * psi * 3 / 4) and ddp["total"] == ddp["all_reduce"]
    for s in (1, 2):
        v = zero_comm_volume(psi, s, n, bytes_per_elem=1)
        assert v["reduce_scatter"] == v["all_gather"] == pytest.approx(psi * 3 / 4)
        assert v["total"] == pytest.approx(ddp["total"]) and v["vs_ddp"] == pytest.approx(1)
        assert v["paper"] == 2 * psi
    v3 = zero_comm_volume(psi, 3, n, bytes_per_elem=2)
    assert v3["total"] == pytest.approx(3 * psi * 2 * 3 / 4) and v3["vs_ddp"] == pytest.approx(1.5)
    assert v3["paper"] == 3 * psi * 2
    # the ring counts agree with ring_bytes_sent (all-reduce = reduce-scatter + all-gather)
    assert ddp["total"] == pytest.approx(perfmodel.ring_bytes_sent(psi, n))
    assert zero_comm_volume(psi, 3, 1)["total"] == 0


@pytest.mark.parametrize("call, key", [
    (lambda: zero_memory(0, 1, 2), "zero_bad_params"),
    (lambda: zero_memory(-5, 1, 2), "zero_bad_params"),
    (lambda: zero_memory("7B", 1, 2), "zero_bad_params"),
    (lambda: zero_memory(1e9, 4, 2), "zero_bad_stage"),
    (lambda: zero_memory(1e9, True, 2), "zero_bad_stage"),
    (lambda: zero_memory(1e9, 1, 0), "zero_bad_world"),
    (lambda: zero_memory(1e9, 1, 2.5), "zero_bad_world"),
    (lambda: zero_memory(1e9, 1, 2, precision="fp16"), "zero_bad_precision"),
    (lambda: zero_memory(1e9, 1, 2, k=-1), "zero_bad_k"),
    (lambda: zero_comm_volume(1e9, 3, 2, bytes_per_elem=0), "zero_bad_bytes"),
    (lambda: zero_comm_volume(1e9, 5, 2), "zero_bad_stage"),
])
def test_bad_input_is_a_bilingual_error(call, key):
    with pytest.raises(i18n.LabError) as e:
        call()
    assert e.value.key == key
    assert e.value.message("en") in str(e.value) and e.value.message("zh") in str(e.value)


def test_widget_builds_and_updates():
    pytest.importorskip("ipywidgets")
    from dtrain_lab import viz

    box = viz.zero_memory_widget(7.5, 64, 3, "mixed")
    params, n, stage, prec, out = box.children
    assert (params.value, n.value, stage.value, prec.value) == (7.5, 64, 3, "mixed")
    stage.value = 0   # observers run; the output must follow without error
    prec.value = "fp32"
    with pytest.raises(i18n.LabError):
        viz.zero_memory_widget(7.5, 64, 7)


def test_widget_without_ipywidgets_prints_the_table(monkeypatch, capsys):
    from dtrain_lab import viz

    monkeypatch.setitem(sys.modules, "ipywidgets", None)   # import ipywidgets -> ImportError
    text = viz.zero_memory_widget(7.0, 8)
    assert isinstance(text, str) and "ZeRO-3" in text and "112 GB" in text
    assert "ZeRO-3" in capsys.readouterr().out
