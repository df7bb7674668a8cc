"""A plan as text, in the learner's language (labels in ``planner/messages.toml``)."""
from __future__ import annotations

from dtrain_lab.i18n import tr
from dtrain_lab.perfmodel import human_bytes

# short names of a peak's moment and of a stage split, for a printed line
MOMENTS = {"first": "plan_moment_first", "after": "plan_moment_after", "steady": "plan_moment_steady",
           "resident": "plan_moment_resident"}
SPLIT_NAMES = {"even": "plan_split_short_even", "llama3": "plan_split_short_llama3"}

__all__ = ["format_plan"]


def _b(v) -> str:
    return "—" if v is None else human_bytes(v)


def _s(v: float) -> str:
    return f"{v * 1e3:.3g} ms" if v < 1 else f"{v:.3g} s"


def format_plan(p, lang: str | None = None) -> str:
    """``p``: a :class:`~dtrain_lab.planner.core.Plan` or its ``to_dict()``."""
    d = p if isinstance(p, dict) else p.to_dict()
    lay, mem = d["layout"], d["memory"]
    out = [tr("plan_head_model", lang, name=d["model"]["name"], params=d["model"]["params"] / 1e9,
              source=d["model"]["source"]),
           tr("plan_head_layout", lang, **{k: lay[k] for k in ("world_size", "dp", "tp", "pp", "cp", "ep", "edp",
                                                                 "zero", "rank", "stage")}),
           tr("plan_head_batch", lang, seq=lay.get("seq_len", "—"), mb=lay["micro_batch"], m=lay["microbatches"],
              ckpt=tr("plan_yes" if lay["act_ckpt"] else "plan_no", lang), precision=lay["precision"]), ""]
    out += [tr("plan_mem_head", lang), "|---|---|"]
    for key, label in (("params", "plan_mem_params"), ("grads", "plan_mem_grads"),
                       ("optimizer", "plan_mem_optimizer"), ("activations", "plan_mem_activations"),
                       ("activations_no_ckpt", "plan_mem_activations_no_ckpt"),
                       ("activations_ckpt", "plan_mem_activations_ckpt"), ("peak", "plan_mem_peak")):
        if key in mem:
            out.append(f"| {tr(label, lang)} | {_b(mem[key])} |")
    if mem.get("model_states") is not None:
        out.append(f"| {tr('plan_mem_states', lang)} | {_b(mem['model_states'])} |")
    if mem.get("peak_moment"):
        # which moment of the schedule the peak is, and whether the gradients row is in it
        other = {n: b for n, b in mem["moments"].items() if n != mem["peak_moment"]}
        n1 = {"after": mem["peak_in_flight"] + 1 / lay.get("virtual_stages", 1),
              "first": mem["peak_in_flight"] - 1 / lay.get("virtual_stages", 1)}.get(mem["peak_moment"], 0)
        key = {"first": "plan_peak_first", "after": "plan_peak_after", "steady": "plan_peak_steady",
               "resident": "plan_peak_resident"}[mem["peak_moment"]]
        out += ["", tr(key, lang, n=mem["peak_in_flight"], n1=n1,
                       other=_b(next(iter(other.values()), None)))]
    if mem.get("fits") is not None:
        out.append("")
        out.append(tr("plan_fits" if mem["fits"] else "plan_not_fits", lang, cap=_b(mem["capacity"]),
                      worst=_b(max(s["peak"] for s in mem["per_stage"]))))
    if len(mem.get("per_stage", [])) > 1:
        out += ["", tr("plan_stage_head", lang), "|---|---|---|---|---|"]
        for s in mem["per_stage"]:
            out.append(f"| {s['stage']} | {s['layers']} | {s['peak_in_flight']:g} | {_b(s['peak_grads'] or None)} "
                       f"| {_b(s['peak'])} |")
    if d["comm"]:
        out += ["", tr("plan_comm_head", lang), "|---|---|---|---|---|---|---|---|"]
        for dim, e in d["comm"].items():
            ops = "+".join(o["op"] for o in e["ops"]) or "—"
            out.append(f"| {dim} | {e['group_size']} | {e['link']} | {ops} | {e['calls']} | {_b(e['payload_bytes'])} "
                       f"| {_b(e['wire_bytes'])} | {_s(e['seconds'])} |")
    if d["time"]:
        t = d["time"]
        out += ["", tr("plan_time", lang, compute=_s(t["compute_s"]), comm=_s(t["exposed_comm_s"]),
                       bubble=100 * t["bubble"], step=_s(t["step_s"]), tps=t["tokens_per_s"], mfu=100 * t["mfu"])]
        e = t.get("estimate")
        out.append(tr("plan_time_no_estimate", lang) if e is None else
                   tr("plan_time_estimate", lang, eff=100 * e["efficiency"], compute=_s(e["compute_s"]),
                      comm=_s(e["exposed_comm_s"]), step=_s(e["step_s"]), tps=e["tokens_per_s"], mfu=100 * e["mfu"]))
    out += ["", tr("plan_assumptions_head", lang)] + [f"- {a}" for a in d["assumptions"]]
    out.append(f"- {tr('plan_hardware', lang, name=d['hardware']['name'], source=d['hardware']['source'])}")
    return "\n".join(out)
