"""Plots, source display and widgets for the lessons, in the learner's language.

Chinese plot labels need a CJK font. The course depends on ``noto-cjk-sans-otc``, Google's Noto Sans
CJK (SIL Open Font License 1.1) packaged on PyPI, so a fresh machine, a shared server or a JupyterHub
draws Chinese without a system font or root. :func:`setup_fonts` registers it with matplotlib, or
else looks for a system CJK font (Noto/Source Han, WenQuanYi, PingFang, Microsoft YaHei, ...), and
puts it first in the sans-serif list with DejaVu Sans behind it for glyphs it lacks. If none can be
loaded, plots say so once, in one short line in the learner's language, and :func:`label` draws the
English text: a plot never shows empty boxes.

Every text here comes from the message catalogue (``viz_*`` keys in ``dtrain_lab/messages.toml``).
Widgets are returned, not displayed: a notebook shows the value of a cell's last line once.
"""
from __future__ import annotations

import inspect
import re

from dtrain_lab import caps
from dtrain_lab.fonts import CJK_FONTS, PACKAGED_FONT, _register_packaged_font, find_cjk_font  # noqa: F401
from dtrain_lab.i18n import tr
from dtrain_lab.i18n.display import columns, pad, width  # noqa: F401  (re-exported for the lessons)

_HAN = re.compile(r"[\u3000-\u303f\u4e00-\u9fff\uff00-\uffef]")

_font: str | None = None
_checked = False
_warned = False


def setup_fonts() -> str | None:
    """Configure matplotlib for Chinese labels; returns the CJK font used, or None."""
    global _font, _checked
    if _checked:
        return _font
    import matplotlib

    _font = find_cjk_font() if caps.have("cjk_font") else None
    _checked = True
    if _font:
        matplotlib.rcParams["font.sans-serif"] = [_font, "DejaVu Sans"]
        matplotlib.rcParams["font.family"] = "sans-serif"
        matplotlib.rcParams["axes.unicode_minus"] = False  # some CJK fonts lack U+2212
    return _font


def cjk_available() -> bool:
    return setup_fonts() is not None


def label(key: str, **fields) -> str:
    """The plot text ``key`` in the learner's language; in English where Chinese cannot be drawn,
    saying so once (a plain line, not a warning with a file path and a source line)."""
    global _warned
    text = tr(key, **fields)
    if not _HAN.search(text) or cjk_available():
        return text
    if not _warned:
        print(tr("viz_no_cjk_font"), flush=True)
        _warned = True
    return tr(key, "en", **fields)


def new_figure(*args, **kwargs):
    import matplotlib.pyplot as plt

    setup_fonts()
    return plt.subplots(*args, **kwargs)


# ------------------------------------------------------------------------------------ text columns
# width, pad and columns live in dtrain_lab.i18n.display (the launcher's rank table uses them too)


def below(value: float, bound: float) -> str:
    """``"< 1e-06"`` when ``value`` is under ``bound``, else the value itself: a rounding difference
    printed as the bound it is checked against, so that the output is the same on every CPU."""
    return f"< {bound:g}" if abs(value) < bound else f"{value:.1e}"


class Printed(str):
    """Text a function has already printed: a notebook does not show it a second time as its value."""

    def _ipython_display_(self) -> None:
        pass


# ------------------------------------------------------------------------------------ source display
def source(obj) -> str:
    return inspect.getsource(obj)


# pre, not pre-wrap: a long signature scrolls sideways instead of breaking in the middle of a word
_PRE_STYLE = "white-space: pre; word-break: normal; overflow-wrap: normal; overflow-x: auto"


def show(obj) -> None:
    """Display ``obj``'s source with syntax colouring (HTML in a notebook, plain text elsewhere)."""
    text = source(obj)
    try:
        from IPython import get_ipython
        from IPython.display import display

        if get_ipython() is not None:
            from pygments import highlight
            from pygments.formatters import HtmlFormatter
            from pygments.lexers import PythonLexer

            html = highlight(text, PythonLexer(), HtmlFormatter(noclasses=True, nobackground=True, prestyles=_PRE_STYLE))
            # text/plain alongside, for terminals and for nbval's comparison
            display({"text/html": html, "text/plain": text}, raw=True)
            return
    except ImportError:
        pass
    print(text)


# ------------------------------------------------------------------------------------ lesson plots
def _log_axes(ax, xlabel: str, ylabel: str) -> None:
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel(label(xlabel))
    ax.set_ylabel(label(ylabel))
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()


def plot_bandwidth(rows: list[dict], world_size: int, backend: str, ax=None):
    """busbw against message size, one line per operation, from measured rows."""
    if ax is None:
        _, ax = new_figure(figsize=(7, 4))
    ops = sorted({r["op"] for r in rows}, key=[r["op"] for r in rows].index)
    for op in ops:
        pts = sorted((r["bytes"], r["busbw"]) for r in rows if r["op"] == op)
        ax.plot([p[0] for p in pts], [p[1] / 1e6 for p in pts], marker="o", label=op)
    ax.set_title(label("viz_bandwidth_title", world_size=world_size, backend=backend))
    _log_axes(ax, "viz_message_size", "viz_bus_bandwidth")
    return ax


def plot_measured_vs_model(rows: list[dict], alpha: float, beta: float, p: int, ax=None):
    """Measured time per call against message size, with the fitted α-β prediction as a line."""
    from dtrain_lab.perfmodel import collective_time

    if ax is None:
        _, ax = new_figure(figsize=(7, 4))
    ops = sorted({r["op"] for r in rows}, key=[r["op"] for r in rows].index)
    for op in ops:
        pts = sorted((r["bytes"], r["seconds"]) for r in rows if r["op"] == op)
        ax.plot([x for x, _ in pts], [y * 1e3 for _, y in pts], "o", label=label("viz_measured_op", op=op))
    sizes = sorted({r["bytes"] for r in rows})
    ax.plot(sizes, [collective_time("all_reduce", n, p, alpha, beta) * 1e3 for n in sizes], "-",
            label=label("viz_model_fitted"))
    _log_axes(ax, "viz_message_size", "viz_time_per_call")
    return ax


def plot_alpha_beta(alpha: float, beta: float, p_values=(2, 4, 8, 16), max_bytes: float = 2 ** 30, ax=None):
    """Predicted ring all-reduce time against message size for several world sizes."""
    from dtrain_lab.perfmodel import collective_time

    if ax is None:
        _, ax = new_figure(figsize=(7, 4))
    sizes = [2.0 ** k for k in range(4, int(max_bytes).bit_length())]
    for p in p_values:
        ax.plot(sizes, [collective_time("all_reduce", n, p, alpha, beta) for n in sizes], label=f"p={p}")
    ax.set_title(label("viz_alpha_beta_title"))
    _log_axes(ax, "viz_message_size_n", "viz_predicted_time")
    return ax


def plot_losses(curves: dict[str, list[float]], ax=None):
    """Loss per step, one line per precision (``{"fp32": [...], "bf16": [...]}``, from
    :func:`dtrain_lab.demos.amp_runs.train_losses`)."""
    if ax is None:
        _, ax = new_figure(figsize=(7, 3.5))
    for name, losses in curves.items():
        ax.plot(range(len(losses)), losses, label=name, linewidth=1.2)
    ax.set_xlabel(label("viz_optimizer_step"))
    ax.set_ylabel(label("viz_training_loss"))
    ax.set_title(label("viz_precisions_title"))
    ax.legend()
    return ax


def plot_scaler_trace(rows: list[dict], ax=None):
    """The loss scale per step on a log2 axis; skipped steps (inf/NaN found) marked with a cross
    (``rows`` from :func:`dtrain_lab.parallel.amp.scaler_trace`)."""
    if ax is None:
        _, ax = new_figure(figsize=(7, 3.5))
    steps = [r["step"] for r in rows]
    ax.step(steps, [r["scale"] for r in rows], where="post", label=label("viz_scale_used"))
    skipped = [r for r in rows if not r["stepped"]]
    ax.scatter([r["step"] for r in skipped], [r["scale"] for r in skipped], marker="x", color="red", zorder=3,
               label=label("viz_step_skipped"))
    ax.set_yscale("log", base=2)
    ax.set_xlabel(label("viz_optimizer_step"))
    ax.set_ylabel(label("viz_loss_scale"))
    ax.legend()
    return ax


# ------------------------------------------------------------------------------------ widgets
def _wide(widget):
    """Room for the whole description (ipywidgets cuts it at about 10 characters by default)."""
    widget.style.description_width = "initial"
    return widget


def alpha_beta_calculator(alpha: float = 5e-6, beta: float = 1e-11):
    """An ipywidgets calculator around :func:`dtrain_lab.perfmodel.collective_time`, starting at
    ``alpha`` seconds and ``beta`` seconds per byte (pass the values you fitted on your machine).
    Returns the widget (a notebook shows it as the cell's value)."""
    import ipywidgets as w

    from dtrain_lab.perfmodel import busbw_factor, collective_time, human_bytes

    op = w.Dropdown(options=["all_reduce", "reduce_scatter", "all_gather", "broadcast"], value="all_reduce",
                    description=tr("viz_collective"))
    algo = _wide(w.Dropdown(options=["ring", "naive"], value="ring", description=tr("viz_algorithm")))
    p = w.IntSlider(value=8, min=2, max=1024, description="p")
    log_n = w.FloatSlider(value=27, min=10, max=34, step=0.5, description="log2 n")
    alpha_us = w.FloatLogSlider(value=min(max(alpha * 1e6, 0.1), 1e4), base=10, min=-1, max=4, description="α (µs)")
    bw_gbs = w.FloatLogSlider(value=min(max(1e-9 / beta, 1e-3), 1e3), base=10, min=-3, max=3, description="1/β (GB/s)")
    out = w.Output()

    def update(*_):
        n = 2 ** log_n.value
        t = collective_time(op.value, n, p.value, alpha_us.value * 1e-6, 1 / (bw_gbs.value * 1e9), algo.value)
        out.clear_output()
        with out:
            print(tr("viz_alpha_beta_result", n=human_bytes(n), p=p.value, ms=f"{t * 1e3:.4g}",
                     factor=f"{busbw_factor(op.value, p.value):.3f}"))

    for widget in (op, algo, p, log_n, alpha_us, bw_gbs):
        widget.observe(update, "value")
    update()
    return w.VBox([w.HBox([op, algo]), p, log_n, alpha_us, bw_gbs, out])


# parameter counts (billions) of well-known models, and world sizes: a slider over these lands on
# exactly 7B or N = 8, where a log-scale float slider snaps 7.0 to 10^0.85 = 7.08
MODEL_SIZES_B = (0.125, 0.35, 1.0, 1.5, 3.0, 7.0, 8.0, 13.0, 30.0, 70.0, 175.0, 405.0, 1000.0)
WORLD_SIZES = tuple(2 ** k for k in range(11))


def _choices(values, start) -> list:
    return sorted(set(values) | {start})


def zero_memory_widget(params_b: float = 7.0, world_size: int = 8, stage: int = 3, precision: str = "mixed"):
    """An ipywidgets calculator around :func:`dtrain_lab.perfmodel.zero_memory`: sliders for the
    parameter count (billions, over well-known model sizes), the world size N (powers of two), the
    ZeRO stage and the precision; it shows the per-device bytes of parameters, gradients and
    optimizer state. Returns the widget (a notebook shows it as the cell's value).

    Without ipywidgets it prints the table of every stage and precision for the starting values
    instead (:func:`dtrain_lab.perfmodel.memory_table`) and returns that text.
    """
    from dtrain_lab.perfmodel import ZERO_PRECISIONS, format_memory_table, memory_table, zero_memory

    zero_memory(params_b * 1e9, stage, world_size, precision=precision)  # bilingual error on bad input
    try:
        import ipywidgets as w
    except ImportError:
        text = format_memory_table(memory_table(params_b * 1e9, world_size))
        print(tr("viz_zero_table_head", params=f"{params_b:g}", n=world_size))
        print(text)
        return Printed(text)

    params = _wide(w.SelectionSlider(options=[(f"{v:g}B", v) for v in _choices(MODEL_SIZES_B, params_b)],
                                     value=params_b, description=tr("viz_params_b")))
    n = _wide(w.SelectionSlider(options=_choices(WORLD_SIZES, world_size), value=world_size, description="N"))
    st = _wide(w.IntSlider(value=stage, min=0, max=3, description=tr("viz_zero_stage")))
    prec = _wide(w.Dropdown(options=list(ZERO_PRECISIONS), value=precision, description=tr("viz_precision")))
    out = w.Output()
    rows = (("params", "viz_row_params"), ("grads", "viz_row_grads"), ("optimizer", "viz_row_optimizer"),
            ("total", "viz_row_total"))

    def update(*_):
        m = zero_memory(params.value * 1e9, st.value, n.value, precision=prec.value)
        out.clear_output()
        with out:
            for key, name in rows:
                print(f"{pad(tr(name), 16, '>')}: {m[key] / 1e9:10.3f} GB")

    for widget in (params, n, st, prec):
        widget.observe(update, "value")
    update()
    box = w.VBox([params, n, st, prec, out])
    box.update = update  # for tests and for scripted use
    return box


# ------------------------------------------------------------------------------------ pipeline parallel
def pipeline_timeline(timeline, ax=None, title: str | None = None, unit: str = "", scale: float = 1.0):
    """Who computes what when: one row per stage, a bar per action (forward blue, backward orange,
    labelled with the micro-batch), white gaps are the bubble. ``timeline``: per stage a list of
    ``(start, end, action)`` from :func:`dtrain_lab.parallel.pipeline.simulate_timeline` or the ``timeline``
    that :func:`dtrain_lab.parallel.pipeline.run_schedule` recorded on each rank (times are shifted so that
    the first action starts at 0, then multiplied by ``scale``, e.g. 1e3 for milliseconds)."""
    from dtrain_lab.parallel.pipeline import as_action, idle_fraction

    if ax is None:
        _, ax = new_figure(figsize=(9, 0.55 * len(timeline) + 1.2))
    starts = [float(e[0]) for stage in timeline for e in stage]
    t0 = min(starts) if starts else 0.0
    colors = {"F": "#4C72B0", "B": "#DD8452"}
    for s, stage in enumerate(timeline):
        for start, end, act in stage:
            a = as_action(act)
            x0, w = (float(start) - t0) * scale, (float(end) - float(start)) * scale
            ax.broken_barh([(x0, w)], (s - 0.4, 0.8), facecolors=colors.get(a.kind, "grey"), edgecolor="white")
            ax.text(x0 + w / 2, s, str(a), ha="center", va="center", fontsize=7, color="white")
    ax.set_yticks(range(len(timeline)))
    ax.set_yticklabels([label("viz_stage", s=s) for s in range(len(timeline))])
    ax.invert_yaxis()
    ax.set_xlabel(label("viz_time", unit=unit).strip())
    idle = idle_fraction(timeline)
    ax.set_title((title + " — " if title else "") + label("viz_idle", idle=f"{idle:.1%}"))
    ax.grid(True, axis="x", alpha=0.3)
    return ax


def pipeline_widget(num_stages: int = 4, num_microbatches: int = 8, kind: str = "1f1b",
                    t_f: float = 1.0, t_b: float = 2.0):
    """Sliders for the number of stages p and of micro-batches m and the schedule: prints the bubble
    fraction (p-1)/(m+p-1), the simulated idle share and the micro-batches each stage holds at
    most, and draws the simulated timeline (:func:`dtrain_lab.parallel.pipeline.simulate_timeline`).
    Returns the widget (a notebook shows it as the cell's value).

    Without ipywidgets it prints and draws the starting values once and returns the printed text."""
    from dtrain_lab.parallel.pipeline import bubble_fraction, idle_fraction, peak_in_flight, schedule, simulate_timeline

    schedule(kind, num_stages, num_microbatches)   # bilingual error on bad input

    def describe(p: int, m: int, k: str) -> tuple[str, list]:
        sched = schedule(k, p, m)
        tl = simulate_timeline(sched, t_f, t_b)
        peaks = ", ".join(str(peak_in_flight(x)) for x in sched)
        return tr("viz_pipeline_summary", p=p, m=m, kind=k, bubble=f"{bubble_fraction(p, m):.3f}",
                  idle=f"{idle_fraction(tl):.3f}", peaks=peaks), tl

    def draw(tl, p, m, k):
        import matplotlib.pyplot as plt

        _, ax = new_figure(figsize=(9, 0.4 * p + 1.4))
        pipeline_timeline(tl, ax=ax, title=f"{k}, p={p}, m={m}")
        plt.show()

    try:
        import ipywidgets as w
    except ImportError:
        text, tl = describe(num_stages, num_microbatches, kind)
        print(text)
        draw(tl, num_stages, num_microbatches, kind)
        return Printed(text)

    p = _wide(w.IntSlider(value=num_stages, min=1, max=8, description=tr("viz_stages_p")))
    m = _wide(w.IntSlider(value=num_microbatches, min=1, max=32, description=tr("viz_microbatches_m")))
    k = _wide(w.Dropdown(options=["gpipe", "1f1b"], value=kind, description=tr("viz_schedule")))
    out = w.Output()

    def update(*_):
        text, tl = describe(p.value, m.value, k.value)
        out.clear_output(wait=True)
        with out:
            print(text)
            draw(tl, p.value, m.value, k.value)

    for widget in (p, m, k):
        widget.observe(update, "value")
    update()
    box = w.VBox([w.HBox([p, m, k]), out])
    box.update = update  # for tests and for scripted use
    return box
