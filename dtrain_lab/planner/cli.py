"""``dtrain-lab plan``: plan a job on this machine (see :func:`dtrain_lab.planner.plan`).

    dtrain-lab plan --model llama3-405b --world-size 16384 --tp 8 --cp 16 --pp 16 \\
        --seq-len 131072 --microbatches 16 --zero 1 --act-ckpt
    dtrain-lab plan --model llama3-8b --world-size 64 --tp 8 --json
"""
from __future__ import annotations

import argparse
import json
import sys

from dtrain_lab import i18n
from dtrain_lab.i18n import tr
from dtrain_lab.planner.core import PRECISIONS, SPLITS, plan
from dtrain_lab.planner.presets import HARDWARE, MODELS
from dtrain_lab.planner.report import format_plan


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="dtrain-lab plan", description=tr("plan_cli_desc"))
    ap.add_argument("--model", default="llama3-8b", choices=MODELS, help=tr("plan_cli_model"))
    ap.add_argument("--world-size", type=int, required=True, help=tr("plan_cli_world"))
    for dim, key in (("dp", "plan_cli_dp"), ("tp", "plan_cli_tp"), ("pp", "plan_cli_pp"), ("cp", "plan_cli_cp"),
                     ("ep", "plan_cli_ep")):
        ap.add_argument(f"--{dim}", type=int, default=None if dim == "dp" else 1, help=tr(key))
    ap.add_argument("--zero", type=int, default=1, choices=(0, 1, 2, 3), help=tr("plan_cli_zero"))
    ap.add_argument("--seq-len", type=int, help=tr("plan_cli_seq"))
    ap.add_argument("--micro-batch", type=int, default=1, help=tr("plan_cli_mb"))
    ap.add_argument("--microbatches", type=int, help=tr("plan_cli_m"))
    ap.add_argument("--act-ckpt", action="store_true", help=tr("plan_cli_ckpt"))
    ap.add_argument("--precision", default="mixed", choices=tuple(PRECISIONS), help=tr("plan_cli_precision"))
    ap.add_argument("--hardware", default="h100", choices=HARDWARE, help=tr("plan_cli_hardware"))
    ap.add_argument("--nvlink-gbps", type=float, help=tr("plan_cli_nvlink"))
    ap.add_argument("--network-gbps", type=float, help=tr("plan_cli_network"))
    ap.add_argument("--gpus-per-node", type=int, help=tr("plan_cli_gpn"))
    ap.add_argument("--efficiency", type=float, help=tr("plan_cli_efficiency"))
    ap.add_argument("--virtual-stages", type=int, default=1, help=tr("plan_cli_virtual"))
    ap.add_argument("--stage-split", default="even", choices=SPLITS, help=tr("plan_cli_split"))
    ap.add_argument("--grads-resident", action="store_true", help=tr("plan_cli_grads_resident"))
    ap.add_argument("--rank", type=int, default=0, help=tr("plan_cli_rank"))
    ap.add_argument("--no-dry-run", action="store_true", help=tr("plan_cli_nodry"))
    ap.add_argument("--json", action="store_true", help=tr("plan_cli_json"))
    ap.add_argument("--lang", choices=i18n.LANGS, help=tr("cli_lang_help"))
    return ap


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--lang" in argv[:-1]:          # the help itself in the chosen language
        i18n.set_lang(argv[argv.index("--lang") + 1])
    args = parser().parse_args(argv)
    try:
        p = plan(args.model, world_size=args.world_size, dp=args.dp, tp=args.tp, pp=args.pp, cp=args.cp,
                 ep=args.ep, zero=args.zero, seq_len=args.seq_len, micro_batch=args.micro_batch,
                 microbatches=args.microbatches, act_ckpt=args.act_ckpt, precision=args.precision,
                 hardware=args.hardware, nvlink_gbps=args.nvlink_gbps, network_gbps=args.network_gbps,
                 gpus_per_node=args.gpus_per_node, rank=args.rank, dry_run=not args.no_dry_run,
                 efficiency=args.efficiency, virtual_stages=args.virtual_stages, stage_split=args.stage_split,
                 grads_resident=args.grads_resident)
    except i18n.LabError as e:
        print(str(e), file=sys.stderr)
        return 2
    print(json.dumps(p.to_dict(), indent=1) if args.json else format_plan(p))
    return 0


if __name__ == "__main__":
    sys.exit(main())
