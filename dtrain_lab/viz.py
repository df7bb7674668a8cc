"""Plots, source display and widgets for the lessons, in the learner's language.

Chinese labels need a CJK font. :func:`setup_fonts` looks for one (Noto/Source Han, WenQuanYi,
PingFang, Microsoft YaHei, ...), puts it first in matplotlib's sans-serif list with DejaVu Sans
behind it for glyphs it lacks, and if none exists says so once and makes :func:`label` return the
English text: a plot never shows empty boxes.
"""
from __future__ import annotations

import inspect
import warnings

from dtrain_lab.i18n import get_lang, tr

CJK_FONTS = (
    "Noto Sans CJK SC", "Noto Sans CJK JP", "Noto Sans SC", "Source Han Sans SC", "Source Han Sans CN",
    "WenQuanYi Micro Hei", "WenQuanYi Zen Hei", "PingFang SC", "Hiragino Sans GB", "Heiti SC",
    "STHeiti", "Microsoft YaHei", "SimHei", "Arial Unicode MS",
)

_font: str | None = None
_checked = False
_warned = False


def find_cjk_font(rescan: bool = True) -> str | None:
    from matplotlib import font_manager

    def scan() -> str | None:
        names = {f.name for f in font_manager.fontManager.ttflist}
        return next((n for n in CJK_FONTS if n in names), None)

    found = scan()
    if found is None and rescan:
        # matplotlib caches its font list; a font installed after the cache was built is unseen
        font_manager.fontManager = font_manager._load_fontmanager(try_read_cache=False)
        found = scan()
    return found


def setup_fonts() -> str | None:
    """Configure matplotlib for Chinese labels; returns the CJK font used, or None."""
    global _font, _checked
    if _checked:
        return _font
    import matplotlib

    _font = find_cjk_font()
    _checked = True
    if _font:
        matplotlib.rcParams["font.sans-serif"] = [_font, "DejaVu Sans"]
        matplotlib.rcParams["font.family"] = "sans-serif"
        matplotlib.rcParams["axes.unicode_minus"] = False  # some CJK fonts lack U+2212
    return _font


def cjk_available() -> bool:
    return setup_fonts() is not None


def label(en: str, zh: str) -> str:
    """The plot label in the learner's language; English if Chinese cannot be drawn here."""
    global _warned
    if get_lang() != "zh":
        return en
    if cjk_available():
        return zh
    if not _warned:
        warnings.warn(tr("no_cjk_font"), stacklevel=2)
        _warned = True
    return en


def new_figure(*args, **kwargs):
    import matplotlib.pyplot as plt

    setup_fonts()
    return plt.subplots(*args, **kwargs)


# ------------------------------------------------------------------------------------ source display
def source(obj) -> str:
    return inspect.getsource(obj)


def show(obj) -> None:
    """Display ``obj``'s source with syntax colouring (HTML in a notebook, plain text elsewhere)."""
    text = source(obj)
    try:
        from IPython import get_ipython
        from IPython.display import HTML, display

        if get_ipython() is not None:
            from pygments import highlight
            from pygments.formatters import HtmlFormatter
            from pygments.lexers import PythonLexer

            html = highlight(text, PythonLexer(), HtmlFormatter(noclasses=True, nobackground=True))
            # text/plain alongside, for terminals and for nbval's comparison
            display({"text/html": html, "text/plain": text}, raw=True)
            return
    except ImportError:
        pass
    print(text)


# ------------------------------------------------------------------------------------ lesson plots
def plot_bandwidth(rows: list[dict], world_size: int, backend: str, ax=None):
    """busbw against message size, one line per operation, from measured rows."""
    if ax is None:
        _, ax = new_figure(figsize=(7, 4))
    ops = sorted({r["op"] for r in rows}, key=[r["op"] for r in rows].index)
    for op in ops:
        pts = sorted((r["bytes"], r["busbw"]) for r in rows if r["op"] == op)
        ax.plot([p[0] for p in pts], [p[1] / 1e6 for p in pts], marker="o", label=op)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel(label("message size (bytes)", "消息大小（字节）"))
    ax.set_ylabel(label("bus bandwidth (MB/s)", "总线带宽（MB/s）"))
    ax.set_title(label(f"measured on this machine: {world_size} ranks, {backend}",
                       f"本机实测：{world_size} 个 rank，{backend}"))
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    return ax


def plot_measured_vs_model(rows: list[dict], alpha: float, beta: float, p: int, ax=None):
    """Measured time per call against message size, with the fitted α-β prediction as a line."""
    from dtrain_lab.perfmodel import collective_time

    if ax is None:
        _, ax = new_figure(figsize=(7, 4))
    ops = sorted({r["op"] for r in rows}, key=[r["op"] for r in rows].index)
    for op in ops:
        pts = sorted((r["bytes"], r["seconds"]) for r in rows if r["op"] == op)
        ax.plot([x for x, _ in pts], [y * 1e3 for _, y in pts], "o", label=label(f"measured {op}", f"实测 {op}"))
    sizes = sorted({r["bytes"] for r in rows})
    ax.plot(sizes, [collective_time("all_reduce", n, p, alpha, beta) * 1e3 for n in sizes], "-",
            label=label("α-β model (fitted)", "α-β 模型（拟合）"))
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel(label("message size (bytes)", "消息大小（字节）"))
    ax.set_ylabel(label("time per call (ms)", "单次耗时（毫秒）"))
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    return ax


def plot_alpha_beta(alpha: float, beta: float, p_values=(2, 4, 8, 16), max_bytes: float = 2 ** 30, ax=None):
    """Predicted ring all-reduce time against message size for several world sizes."""
    from dtrain_lab.perfmodel import collective_time

    if ax is None:
        _, ax = new_figure(figsize=(7, 4))
    sizes = [2.0 ** k for k in range(4, int(max_bytes).bit_length())]
    for p in p_values:
        ax.plot(sizes, [collective_time("all_reduce", n, p, alpha, beta) for n in sizes], label=f"p={p}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel(label("message size n (bytes)", "消息大小 n（字节）"))
    ax.set_ylabel(label("predicted time (s)", "预测耗时（秒）"))
    ax.set_title(label("ring all-reduce, α-β model", "环形 All-Reduce 的 α-β 模型"))
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    return ax


def alpha_beta_calculator(alpha: float = 5e-6, beta: float = 1e-11):
    """An ipywidgets calculator around :func:`dtrain_lab.perfmodel.collective_time`, starting at
    ``alpha`` seconds and ``beta`` seconds per byte (pass the values you fitted on your machine)."""
    import ipywidgets as w
    from IPython.display import display

    from dtrain_lab.perfmodel import busbw_factor, collective_time, human_bytes

    op = w.Dropdown(options=["all_reduce", "reduce_scatter", "all_gather", "broadcast"], value="all_reduce",
                    description="op")
    algo = w.Dropdown(options=["ring", "naive"], value="ring", description=label("algorithm", "算法"))
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
            print(f"n = {human_bytes(n)}, p = {p.value}: T = {t * 1e3:.4g} ms; "
                  f"busbw factor = {busbw_factor(op.value, p.value):.3f}")

    for widget in (op, algo, p, log_n, alpha_us, bw_gbs):
        widget.observe(update, "value")
    update()
    box = w.VBox([w.HBox([op, algo]), p, log_n, alpha_us, bw_gbs, out])
    display(box)
    return box


def zero_memory_widget(params_b: float = 7.0, world_size: int = 8, stage: int = 3, precision: str = "mixed"):
    """An ipywidgets calculator around :func:`dtrain_lab.perfmodel.zero_memory`: sliders for the
    parameter count (billions), the world size N, the ZeRO stage and the precision; it shows the
    per-device bytes of parameters, gradients and optimizer state.

    Without ipywidgets (or outside a notebook) it prints the table of every stage and precision for
    the starting values instead (:func:`dtrain_lab.perfmodel.memory_table`) and returns that text.
    """
    from dtrain_lab.perfmodel import ZERO_PRECISIONS, format_memory_table, memory_table, zero_memory

    zero_memory(params_b * 1e9, stage, world_size, precision=precision)  # bilingual error on bad input
    try:
        import ipywidgets as w
        from IPython.display import display
    except ImportError:
        text = format_memory_table(memory_table(params_b * 1e9, world_size))
        print(label(f"{params_b:g}B parameters, N = {world_size} (GB = 1e9 bytes per device):",
                    f"{params_b:g}B 参数，N = {world_size}（每张卡，GB = 1e9 字节）："))
        print(text)
        return text

    params = w.FloatLogSlider(value=params_b, base=10, min=-1, max=3, step=0.05,
                              description=label("params (B)", "参数量（B）"))
    n = w.IntSlider(value=world_size, min=1, max=1024, description="N")
    st = w.IntSlider(value=stage, min=0, max=3, description="ZeRO stage" if get_lang() != "zh" else "ZeRO 阶段")
    prec = w.Dropdown(options=list(ZERO_PRECISIONS), value=precision, description=label("precision", "精度"))
    out = w.Output()

    def update(*_):
        m = zero_memory(params.value * 1e9, st.value, n.value, precision=prec.value)
        out.clear_output()
        with out:
            for key, en, zh in (("params", "parameters", "参数"), ("grads", "gradients", "梯度"),
                                ("optimizer", "optimizer state", "优化器状态"), ("total", "total", "合计")):
                print(f"{label(en, zh):>16}: {m[key] / 1e9:10.3f} GB")

    for widget in (params, n, st, prec):
        widget.observe(update, "value")
    update()
    box = w.VBox([params, n, st, prec, out])
    box.update = update  # for tests and for scripted use
    display(box)
    return box


# ------------------------------------------------------------------------------------ pipeline parallel
def pipeline_timeline(timeline, ax=None, title: str | None = None, unit: str = "", scale: float = 1.0):
    """Who computes what when: one row per stage, a bar per action (forward blue, backward orange,
    labelled with the micro-batch), white gaps are the bubble. ``timeline``: per stage a list of
    ``(start, end, action)`` from :func:`dtrain_lab.parallel.pipeline.simulate_timeline` or the ``timeline``
    that :func:`dtrain_lab.parallel.pipeline.run_schedule` recorded on each rank (times are shifted so that
    the first action starts at 0, then multiplied by ``scale``, e.g. 1e3 for milliseconds)."""
    from dtrain_lab.parallel.pipeline import _as_action, idle_fraction

    if ax is None:
        _, ax = new_figure(figsize=(9, 0.55 * len(timeline) + 1.2))
    starts = [float(e[0]) for stage in timeline for e in stage]
    t0 = min(starts) if starts else 0.0
    colors = {"F": "#4C72B0", "B": "#DD8452"}
    for s, stage in enumerate(timeline):
        for start, end, act in stage:
            a = _as_action(act)
            x0, w = (float(start) - t0) * scale, (float(end) - float(start)) * scale
            ax.broken_barh([(x0, w)], (s - 0.4, 0.8), facecolors=colors.get(a.kind, "grey"), edgecolor="white")
            ax.text(x0 + w / 2, s, str(a), ha="center", va="center", fontsize=7, color="white")
    ax.set_yticks(range(len(timeline)))
    ax.set_yticklabels([label(f"stage {s}", f"阶段 {s}") for s in range(len(timeline))])
    ax.invert_yaxis()
    ax.set_xlabel(label(f"time {unit}".strip(), f"时间 {unit}".strip()))
    idle = idle_fraction(timeline)
    ax.set_title((title + " — " if title else "") + label(f"idle {idle:.1%}", f"空闲 {idle:.1%}"))
    ax.grid(True, axis="x", alpha=0.3)
    return ax


def pipeline_widget(num_stages: int = 4, num_microbatches: int = 8, kind: str = "1f1b",
                    t_f: float = 1.0, t_b: float = 2.0):
    """Sliders for the number of stages p and of micro-batches m and the schedule: prints the bubble
    fraction (p-1)/(m+p-1), the simulated idle share and the micro-batches each stage holds at
    most, and draws the simulated timeline (:func:`dtrain_lab.parallel.pipeline.simulate_timeline`).

    Without ipywidgets (or outside a notebook) it prints and draws the starting values once and
    returns the printed text."""
    from dtrain_lab.parallel.pipeline import bubble_fraction, idle_fraction, peak_in_flight, schedule, simulate_timeline

    schedule(kind, num_stages, num_microbatches)   # bilingual error on bad input

    def describe(p: int, m: int, k: str) -> str:
        sched = schedule(k, p, m)
        tl = simulate_timeline(sched, t_f, t_b)
        peaks = ", ".join(str(peak_in_flight(x)) for x in sched)
        return (label(f"p = {p}, m = {m}, {k}: bubble (p-1)/(m+p-1) = {bubble_fraction(p, m):.3f}; "
                      f"simulated idle = {idle_fraction(tl):.3f}; micro-batches held per stage: {peaks}",
                      f"p = {p}，m = {m}，{k}：气泡 (p-1)/(m+p-1) = {bubble_fraction(p, m):.3f}；"
                      f"模拟空闲比例 = {idle_fraction(tl):.3f}；各阶段最多保存的微批次数：{peaks}")), tl

    def draw(tl, p, m, k):
        import matplotlib.pyplot as plt

        _, ax = new_figure(figsize=(9, 0.4 * p + 1.4))
        pipeline_timeline(tl, ax=ax, title=f"{k}, p={p}, m={m}")
        plt.show()

    try:
        import ipywidgets as w
        from IPython.display import display
    except ImportError:
        text, tl = describe(num_stages, num_microbatches, kind)
        print(text)
        draw(tl, num_stages, num_microbatches, kind)
        return text

    p = w.IntSlider(value=num_stages, min=1, max=8, description=label("stages p", "阶段数 p"))
    m = w.IntSlider(value=num_microbatches, min=1, max=32, description=label("micro-batches m", "微批次 m"))
    k = w.Dropdown(options=["gpipe", "1f1b"], value=kind, description=label("schedule", "调度"))
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
    display(box)
    return box
