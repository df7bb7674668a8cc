"""Lesson 14's widget: change a layout, watch memory per rank, communication and the bubble move.

:func:`plan_widget` wraps :func:`dtrain_lab.planner.plan` (a dry run on fake tensors: the first look at
a layout takes a second or two, a layout seen before is cached) in sliders for the five degrees, the
ZeRO stage, micro-batches and activation checkpointing. A bad layout shows the planner's bilingual
error in place of the figures. :func:`plot_plan` draws one plan: memory per pipeline stage, stacked,
against the GPU's capacity, and bytes per step per dimension.
"""
from __future__ import annotations

from dtrain_lab.i18n import LabError, tr
from dtrain_lab.planner import MODELS, format_plan, plan
from dtrain_lab.viz import Printed, _wide, label, new_figure

__all__ = ["plan_widget", "plot_plan", "summary"]

DEGREES = (1, 2, 4, 8, 16, 32, 64)
WORLDS = tuple(2 ** k for k in range(3, 16))


def summary(d: dict) -> str:
    """Three lines: peak per rank (worst stage) and whether it fits, bytes per step per dimension, the bubble."""
    mem = d["memory"]
    worst = max(s["peak"] for s in mem["per_stage"])
    comm = ", ".join(f"{dim} {e['payload_bytes'] / 1e9:.3g} GB" for dim, e in d["comm"].items() if e["calls"])
    return "\n".join([tr("plan_widget_memory", peak=worst / 1e9, cap=mem["capacity"] / 1e9,
                         fits=tr("plan_yes" if mem["fits"] else "plan_no")),
                      tr("plan_widget_comm", comm=comm or "—"),
                      tr("plan_widget_time", bubble=100 * d["time"]["bubble"], step=d["time"]["step_s"],
                         mfu=100 * d["time"]["mfu"])])


def plot_plan(d: dict, axes=None):
    """Memory per stage (parameters, gradients, optimizer state, activations) and bytes per dimension."""
    if axes is None:
        _, axes = new_figure(1, 2, figsize=(11, 3.6))
    ax, bx = axes
    stages = d["memory"]["per_stage"]
    xs = [s["stage"] for s in stages]
    bottom = [0.0] * len(stages)
    for key, name in (("params", "plan_mem_params"), ("grads", "plan_mem_grads"),
                      ("optimizer", "plan_mem_optimizer"), ("activations", "plan_mem_activations")):
        vals = [s[key] / 1e9 for s in stages]
        ax.bar(xs, vals, bottom=bottom, label=label(name))
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.axhline(d["memory"]["capacity"] / 1e9, color="k", ls="--", lw=1)
    ax.set_xlabel(label("plan_widget_stage"))
    ax.set_ylabel("GB")
    ax.legend(fontsize=7)
    dims = [k for k, e in d["comm"].items() if e["calls"]]
    bx.bar(dims, [d["comm"][k]["payload_bytes"] / 1e9 for k in dims],
           color=["tab:green" if d["comm"][k]["link"] == "nvlink" else "tab:red" for k in dims])
    bx.set_ylabel(label("plan_widget_bytes"))
    return axes


def plan_widget(model: str = "llama3-70b", world_size: int = 1024, tp: int = 8, pp: int = 4, cp: int = 1,
                ep: int = 1, zero: int = 1, microbatches: int = 8, act_ckpt: bool = False, seq_len: int | None = None):
    """Sliders over a layout of ``model``; returns the widget (``.update()`` redraws). Without
    ipywidgets it prints the plan of the starting values and returns that text."""
    def compute(**kw):
        return plan(kw.pop("model"), seq_len=seq_len, **kw).to_dict()

    start = dict(model=model, world_size=world_size, tp=tp, pp=pp, cp=cp, ep=ep, zero=zero,
                 microbatches=microbatches, act_ckpt=act_ckpt)
    try:
        import ipywidgets as w
    except ImportError:
        text = format_plan(compute(**start))
        print(text)
        return Printed(text)
    import matplotlib.pyplot as plt

    def choice(desc, options, value):
        return _wide(w.SelectionSlider(options=sorted(set(options) | {value}), value=value, description=desc))

    ctl = {"model": _wide(w.Dropdown(options=[m for m in MODELS if m != "zero-paper-7.5b"], value=model,
                                     description=tr("plan_widget_model"))),
           "world_size": choice("world size", WORLDS, world_size),
           "tp": choice("tp", DEGREES, tp), "pp": choice("pp", DEGREES, pp), "cp": choice("cp", DEGREES, cp),
           "ep": choice("ep", DEGREES, ep), "zero": _wide(w.IntSlider(value=zero, min=0, max=3, description="ZeRO")),
           "microbatches": choice(tr("plan_widget_m"), (1, 2, 4, 8, 16, 32, 64), microbatches),
           "act_ckpt": _wide(w.Checkbox(value=act_ckpt, description=tr("plan_widget_ckpt")))}
    out = w.Output()

    def update(*_):
        out.clear_output(wait=True)
        with out:
            try:
                d = compute(**{k: c.value for k, c in ctl.items()})
            except LabError as e:
                print(e.message())
                return
            print(summary(d))
            plot_plan(d)
            plt.show()

    for c in ctl.values():
        c.observe(update, "value")
    update()
    box = w.VBox([ctl["model"], w.HBox([ctl["world_size"], ctl["zero"]]), w.HBox([ctl["tp"], ctl["pp"]]),
                  w.HBox([ctl["cp"], ctl["ep"]]), w.HBox([ctl["microbatches"], ctl["act_ckpt"]]), out])
    box.update, box.controls = update, ctl
    return box
