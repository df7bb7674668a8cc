"""The bench rows as a Markdown table in the learner's language (texts in ``bench/messages.toml``)."""
from __future__ import annotations

from dtrain_lab.i18n import tr
from dtrain_lab.perfmodel import human_bytes

COMPRESSION_LABELS = {"fp16": "fp16", "bf16": "bf16", "topk": "top-k + error feedback",
                      "topk_noef": "top-k, no error feedback", "powersgd": "PowerSGD + error feedback",
                      "powersgd_noef": "PowerSGD, no error feedback"}
# a key per memory variant, written out so that the catalogue test finds them
ZERO_NOTES = {"zero1": "bench_zero_note_zero1", "zero2": "bench_zero_note_zero2", "zero2b": "bench_zero_note_zero2b",
              "zero3": "bench_zero_note_zero3", "fsdp2": "bench_zero_note_fsdp2"}
ZERO_STAGES = {"zero1": 1, "zero2": 2, "zero2b": 2, "zero3": 3, "fsdp2": 3}


def _x(v: float, digits: int = 2) -> str:
    return f"{v:.{digits}f}×"


def _ms(s: float) -> str:
    return f"{s * 1e3:.3g}"


def _zero(row: dict) -> list[str]:
    out = []
    for kind, v in row["variants"].items():
        parts, pred = v["peak_parts"], v["predicted"]
        out.append(tr("bench_zero_row", variant=kind, stage=ZERO_STAGES[kind], ratio=_x(v["ratio"]),
                      peak=human_bytes(v["peak"]), op=v["peak_op"], params=human_bytes(parts.get("params", 0)),
                      grads=human_bytes(parts.get("grads", 0)), optimizer=human_bytes(parts.get("optimizer", 0)),
                      other=human_bytes(parts.get("other", 0)), pred=human_bytes(pred["total"]),
                      p_params=human_bytes(pred["params"]), p_grads=human_bytes(pred["grads"]),
                      p_optimizer=human_bytes(pred["optimizer"]), note=tr(ZERO_NOTES[kind])))
    return out


def table(rows: list[dict]) -> str:
    out = [tr("bench_head"), "|---|---|---|"]
    for row in rows:
        name = row["name"]
        if name == "launch_overhead":
            cpu = row["cpu_s"]
            out.append(tr("bench_launch", ratio=_x(row["ratio"]), ours=f"{row['dtrain_launch_s']:.2f}",
                          bare=f"{row['bare_torchrun_s']:.2f}", cpu_ratio=_x(row["cpu_ratio"]),
                          cpu_ours=f"{cpu['fork']:.2f}", cpu_bare=f"{cpu['bare']:.2f}",
                          exec_ratio=_x(row["exec_ratio"]), exec_cpu_ratio=_x(row["exec_cpu_ratio"]),
                          repeats=row["repeats"]))
        elif name == "launch_output":
            out.append(tr("bench_launch_output", ratio=_x(row["ratio"]), ours=f"{row['dtrain_launch_s']:.2f}",
                          bare=f"{row['bare_torchrun_s']:.2f}", mb=f"{row['megabytes']:.0f}", repeats=row["repeats"]))
        elif name == "fairness":
            key = "bench_fairness" if row["cgroup"] else "bench_fairness_no_cgroup"
            out.append(tr(key, ratio=_x(row["ratio"]), hostile=f"{row['next_to_hostile_s']:.1f}",
                          honest=f"{row['next_to_honest_s']:.1f}", verdicts=", ".join(row["verdicts_next_to_hostile"]),
                          why=row["why_no_cgroup"], repeats=row["repeats"]))
        elif name == "ring_vs_all_reduce":
            out.append(tr("bench_ring_head", nproc=row["nproc"], backend=row["backend"], repeats=row["repeats"]))
            for p in row["per_size"]:
                out.append(tr("bench_ring_size", size=human_bytes(p["bytes"]), ratio=_x(p["ratio"]),
                              ring=_ms(p["ring_s"]), gloo=_ms(p["all_reduce_s"]), ring_min=_ms(p["ring_min_s"]),
                              gloo_min=_ms(p["all_reduce_min_s"]), ratio_min=_x(p["ratio_of_min"])))
        elif name == "busbw":
            for p in row["points"]:
                out.append(tr("bench_busbw", size=human_bytes(p["bytes"]), busbw=f"{p['busbw_MBps']:.3g}",
                              ms=_ms(p["seconds"]), min_ms=_ms(p["min_s"]), iters=p["iters"]))
        elif name == "ddp_step_time":
            out.append(tr("bench_ddp_step", ratio=_x(row["ratio"]), ours=_ms(row["ours_s"]), torch=_ms(row["torch_s"]),
                          naive=_x(row["naive_ratio"]), no_overlap=_x(row["no_overlap_ratio"])))
        elif name == "ddp_overlap":
            med = row["median_s"]
            out.append(tr("bench_ddp_overlap", ratio=_x(row["overlap_vs_no_overlap"]), buckets=row["buckets"],
                          compute=_ms(med["compute"]), comm=_ms(med["comm"]), no_overlap=_ms(med["no_overlap"]),
                          overlap=_ms(med["overlap"]), hidden=f"{row['hidden']:.0%}", torch=_ms(med["torch"]),
                          launched=row["launched_in_backward"]))
        elif name == "compression":
            for m in row["methods"]:
                out.append(tr("bench_compression", method=COMPRESSION_LABELS.get(m["method"], m["method"]),
                              ratio=f"{m['bytes_ratio']:.3g}×", loss=f"{m['loss_ratio']:.3g}×",
                              final=f"{m['final_loss']:.3g}", base=f"{row['none_final_loss']:.3g}",
                              steps=row["steps"], nproc=row["nproc"]))
        elif name == "zero_memory":
            out.extend(_zero(row))
        elif name == "pipeline_bubble":
            for pt in row["points"]:
                out.append(tr("bench_bubble", schedule=pt["schedule"], m=pt["m"], ratio=_x(pt["ratio"]),
                              measured=f"{pt['measured']:.3f}", formula=f"{pt['formula']:.3f}",
                              nproc=row["nproc"], backend=row["backend"]))
        elif name == "pipeline_activations":
            for st in row["stages"]:
                out.append(tr("bench_activations", stage=st["stage"], ratio=_x(st["ratio"], 3),
                              ours=st["1f1b_bytes"], gpipe=st["gpipe_bytes"], formula=f"{st['formula']:.3f}", m=row["m"]))
        elif name == "plan_memory":
            for layout, v in row["layouts"].items():
                worst = max(v["ranks"], key=lambda x: abs(x["ratio"] - 1))
                out.append(tr("bench_plan_memory", layout=layout, ratio=_x(v["worst_ratio"], 3), rank=worst["rank"],
                              measured=human_bytes(worst["measured"]), predicted=human_bytes(worst["predicted"]),
                              target=f"{row['target']:.0%}", nproc=row["nproc"]))
        elif name == "restart_reliability":
            for mode, c in row["modes"].items():
                out.append(tr("bench_restart", mode=mode, clean=c["clean"], trials=row["trials"],
                              stale=c["stale_keys_seen"], outcomes=", ".join(c["outcomes"])))
            out.append(tr("bench_restart_note"))
    return "\n".join(out)
