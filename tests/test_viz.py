"""Plots render in both languages without a missing-glyph warning (which would be a failure), with the
course's own CJK font on any machine; widgets are shown once, in the learner's language."""
import warnings

import matplotlib

matplotlib.use("Agg")
import pytest  # noqa: E402

from dtrain_lab import i18n, viz  # noqa: E402

ROWS = [{"op": op, "bytes": 4 ** k * 1024, "busbw": 1e6 * k + 1, "seconds": 1e-3}
        for op in ("all_reduce", "ring_all_reduce") for k in range(1, 5)]


@pytest.fixture
def lang():
    yield i18n.set_lang
    i18n.set_lang("en")


@pytest.mark.parametrize("language", ["en", "zh"])
def test_lesson_plots_draw_without_missing_glyphs(language, lang):
    import matplotlib.pyplot as plt

    lang(language)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # "Glyph ... missing from font" would raise here
            ax = viz.plot_bandwidth(ROWS, 2, "gloo")
            ax.figure.canvas.draw()
            ax2 = viz.plot_alpha_beta(5e-6, 1e-9)
            ax2.figure.canvas.draw()
            ax3 = viz.plot_scaler_trace([{"step": 0, "scale": 1024.0, "stepped": False},
                                         {"step": 1, "scale": 512.0, "stepped": True}])
            ax3.figure.canvas.draw()
        want = i18n.tr("viz_bus_bandwidth", language)
        assert ax.get_ylabel() == want and ax3.get_ylabel() == i18n.tr("viz_loss_scale", language)
    finally:
        plt.close("all")


def test_the_course_font_comes_from_pypi_and_is_used():
    """A fresh machine has no system CJK font: the OFL Noto Sans CJK that pyproject installs
    (noto-cjk-sans-otc) is registered with matplotlib and chosen first."""
    noto = pytest.importorskip("noto_cjk_sans_otc")
    from matplotlib import font_manager

    assert noto.FONT_PATH.is_file()
    assert viz._register_packaged_font() == viz.PACKAGED_FONT
    assert viz.setup_fonts() == viz.PACKAGED_FONT
    assert matplotlib.rcParams["font.sans-serif"][0] == viz.PACKAGED_FONT
    found = font_manager.findfont(font_manager.FontProperties(family=viz.PACKAGED_FONT), fallback_to_default=False)
    assert found.endswith("NotoSansCJK-Regular.ttc")


def test_without_cjk_font_labels_fall_back_to_english_with_one_short_notice(monkeypatch, capsys, lang):
    monkeypatch.setattr(viz, "_checked", True)
    monkeypatch.setattr(viz, "_font", None)
    monkeypatch.setattr(viz, "_warned", False)
    lang("zh")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a notice, not a warning (no pink box with a path and a source line)
        assert viz.label("viz_message_size") == "message size (bytes)"
        assert viz.label("viz_stage", s=2) == "stage 2"   # said once, not at every label
    out = capsys.readouterr()
    assert out.out.strip() == i18n.tr("viz_no_cjk_font", "zh") and out.err == ""
    assert "/" not in out.out.replace("MB/s", "")
    lang("en")
    assert viz.label("viz_stage", s=1) == "stage 1"


def test_pad_counts_display_columns():
    assert viz.width("参数") == 4 and viz.width("params") == 6
    assert viz.pad("参数", 6, ">") == "  参数" and viz.pad("ab", 4) == "ab  "
    # rows line up by display width, whatever the language
    rows = [viz.pad(i18n.tr(k, lng), 16, ">") for lng in ("zh", "en")
            for k in ("viz_row_params", "viz_row_optimizer", "viz_row_total")]
    assert {viz.width(r) for r in rows} == {16}


def test_columns_line_up_by_display_width():
    head = viz.columns(("变体", "<8"), ("次数", ">6"))
    assert head == "变体" + " " * 6 + "次数" and viz.width(head) == 14
    assert viz.columns(("variant", "<8"), ("n", ">6")) == f"{'variant':<8}{'n':>6}"


def test_below_prints_the_bound_a_rounding_difference_is_checked_against():
    assert viz.below(3.2e-8, 1e-6) == viz.below(0.0, 1e-6) == "< 1e-06"
    assert viz.below(2e-3, 1e-6) == "2.0e-03"


def test_show_prints_source_outside_a_notebook(capsys):
    from dtrain_lab.comm.collectives import ring_all_reduce

    viz.show(ring_all_reduce)
    assert "def ring_all_reduce" in capsys.readouterr().out


def test_show_html_never_wraps_inside_a_word(monkeypatch):
    """JupyterLab's output CSS wraps <pre> anywhere (pre-wrap, break-all); the source's own style wins."""
    import IPython
    import IPython.display

    shown = []
    monkeypatch.setattr(IPython, "get_ipython", lambda: object())
    monkeypatch.setattr(IPython.display, "display", lambda obj, raw=False: shown.append(obj))
    viz.show(viz.pipeline_widget)
    html = shown[0]["text/html"]
    assert "white-space: pre;" in html and "word-break: normal" in html
    assert shown[0]["text/plain"].startswith("def pipeline_widget(")


def _printed(box, capsys) -> str:
    """What the widget's output area shows (outside a kernel, Output does not capture: stdout)."""
    return "".join(o.get("text", "") for o in box.children[-1].outputs) or capsys.readouterr().out


def test_widgets_are_returned_not_displayed(monkeypatch):
    """A notebook shows a cell's value once; a widget that also called display() appeared twice."""
    pytest.importorskip("ipywidgets")
    import IPython.display

    calls = []
    monkeypatch.setattr(IPython.display, "display", lambda *a, **k: calls.append(a))
    for make in (viz.alpha_beta_calculator, viz.zero_memory_widget, lambda: viz.pipeline_widget(2, 2)):
        box = make()
        assert box.children
    assert calls == []


def test_zero_calculator_starts_exactly_at_7b_and_small_n_is_one_step_away(lang, capsys):
    pytest.importorskip("ipywidgets")
    from dtrain_lab.perfmodel import zero_memory

    lang("zh")
    box = viz.zero_memory_widget(7.0, 8, 3, "mixed")
    params, n, stage, prec, out = box.children
    assert params.value == 7.0 and params.label == "7B"          # not 10^0.85 = 7.08
    assert list(n.options)[:4] == [1, 2, 4, 8] and n.value == 8   # N = 1, 2, 4 one step apart
    assert stage.description == "ZeRO 阶段" and params.description == "参数量"
    first = _printed(box, capsys)
    assert f"{zero_memory(7e9, 3, 8)['total'] / 1e9:10.3f} GB" in first and "14.000 GB" in first
    lines = [line for line in first.splitlines() if "GB" in line]   # (outside a kernel clear_output prints escapes)
    assert len(lines) == 4 and len({viz.width(line.split(":")[0]) for line in lines}) == 1   # aligned by display width
    n.value = 1
    assert f"{zero_memory(7e9, 3, 1)['total'] / 1e9:10.3f} GB" in _printed(box, capsys)


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
