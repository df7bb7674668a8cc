"""Plots render in both languages without a missing-glyph warning (which would be a failure)."""
import warnings

import matplotlib

matplotlib.use("Agg")
import pytest  # noqa: E402

from dtrain_lab import i18n, viz  # noqa: E402

ROWS = [{"op": op, "bytes": 4 ** k * 1024, "busbw": 1e6 * k + 1, "seconds": 1e-3}
        for op in ("all_reduce", "ring_all_reduce") for k in range(1, 5)]


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_lesson_plots_draw_without_missing_glyphs(lang):
    i18n.set_lang(lang)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # "Glyph ... missing from font" would raise here
            if lang == "zh" and not viz.cjk_available():
                pytest.fail("no CJK font: .ci/run installs fonts-wqy-microhei; install a CJK font locally")
            ax = viz.plot_bandwidth(ROWS, 2, "gloo")
            ax.figure.canvas.draw()
            ax2 = viz.plot_alpha_beta(5e-6, 1e-9)
            ax2.figure.canvas.draw()
        if lang == "zh":
            assert "总线带宽" in ax.get_ylabel()
        else:
            assert ax.get_ylabel() == "bus bandwidth (MB/s)"
    finally:
        i18n.set_lang("en")
        import matplotlib.pyplot as plt

        plt.close("all")


def test_without_cjk_font_labels_fall_back_to_english(monkeypatch):
    monkeypatch.setattr(viz, "_checked", True)
    monkeypatch.setattr(viz, "_font", None)
    monkeypatch.setattr(viz, "_warned", False)
    i18n.set_lang("zh")
    try:
        with pytest.warns(UserWarning, match="中文字体"):
            assert viz.label("size", "大小") == "size"
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # said once, not at every label
            assert viz.label("time", "时间") == "time"
    finally:
        i18n.set_lang("en")


def test_show_prints_source_outside_a_notebook(capsys):
    from dtrain_lab.comm.collectives import ring_all_reduce

    viz.show(ring_all_reduce)
    assert "def ring_all_reduce" in capsys.readouterr().out


def test_alpha_beta_calculator_shows_the_model(capsys):
    from dtrain_lab.perfmodel import collective_time

    box = viz.alpha_beta_calculator(alpha=2e-5, beta=1e-9)
    op, p_slider, log_n = box.children[0].children[0], box.children[1], box.children[2]
    assert op.value == "all_reduce"
    p_slider.value = 4
    log_n.value = 20
    out = box.children[-1].outputs
    text = "".join(o.get("text", "") for o in out) if out else capsys.readouterr().out
    expect = collective_time("all_reduce", 2 ** 20, 4, box.children[3].value * 1e-6, 1 / (box.children[4].value * 1e9))
    assert f"T = {expect * 1e3:.4g} ms" in text
