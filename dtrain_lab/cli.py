"""The ``dtrain-lab`` command.

    dtrain-lab info                                  # versions, GPUs, the backend a launch would use
    dtrain-lab run dtrain_lab.demos.hello -n 2       # launch a module or a script with torchrun
    dtrain-lab run train.py -n 2 --timeout 60 -- --lr 0.1
    dtrain-lab grade lab10.rank_branch my_fix.py     # grade one file; or a lab notebook, or a folder
    dtrain-lab grade --list | --json | --gradescope results.json
    dtrain-lab grade submissions/ -j 2 [--lab 10]    # a class: results.json + gradebook.csv, every file a row
    dtrain-lab grade submissions/ --slurm --wait     # the same as a SLURM job array (--status: progress)
    dtrain-lab autograder build lab10 --out lab10.zip  # Gradescope: setup.sh + run_autograder + the course wheel
    dtrain-lab nccl lint [--file .env] | nccl doctor # NCCL/PyTorch variables; this machine's set-up
    dtrain-lab doctor [--json]                       # the same as ``nccl doctor``
    dtrain-lab bench [--quick] [--only ROWS]         # benchmarks (ratios against references)
    dtrain-lab cluster slurm|trainjob|pytorchjob|job --name N --nnodes K -m MODULE [-o FILE]
"""
from __future__ import annotations

import argparse
import sys

from dtrain_lab import i18n


def _info() -> int:
    import platform

    import torch

    from dtrain_lab.jobs.launch import default_nproc
    from dtrain_lab.jobs.runtime import choose_backend, gpu_count

    import torch.distributed as dist

    print(f"dtrain-lab {__import__('dtrain_lab').__version__}, Python {platform.python_version()}, "
          f"torch {torch.__version__}")
    print(i18n.tr("cli_info_machine", gpus=gpu_count(), nproc=default_nproc(), backend=choose_backend(default_nproc())))
    print(f"gloo: {dist.is_gloo_available()}, nccl: {dist.is_nccl_available()}")
    return 0


def _run(args) -> int:
    from dtrain_lab.jobs.launch import launch

    extra = list(args.program_args)
    r = launch(args.target, nproc=args.nproc, args=extra, timeout=args.timeout,
               startup_timeout=args.startup_timeout, backend=args.backend, debug=args.debug,
               nnodes=args.nnodes, node_rank=args.node_rank, rdzv_endpoint=args.rdzv_endpoint,
               rdzv_id=args.rdzv_id, max_restarts=args.max_restarts)
    return 0 if r.ok else (124 if r.hung else (r.returncode or 1))


def _grading(cmd: str, argv: list[str]) -> int:
    """``grade`` and ``autograder`` parse their own options: hand them everything after the command.
    ``dtrain-lab grade FOLDER`` (or with ``-j``) grades a class (:mod:`dtrain_lab.grading.classrun`);
    ``grade ID FILE`` and ``grade NOTEBOOK`` grade one learner (:func:`dtrain_lab.grading.main`)."""
    import os

    i = argv.index(cmd)
    if i == 2:
        i18n.set_lang(argv[1])
    rest = argv[i + 1:]
    if cmd == "autograder":
        from dtrain_lab.grading.autograder import main as run_main
    elif "--slurm" in rest or "--status" in rest:
        from dtrain_lab.grading.slurm import main as run_main
    elif any(a in ("-j", "--jobs") or a.startswith(("-j", "--jobs=")) for a in rest) or \
            any(os.path.isdir(a) for a in rest if not a.startswith("-")):
        from dtrain_lab.grading.classrun import main as run_main
    else:
        from dtrain_lab.grading import main as run_main
    try:
        return run_main(rest)
    except i18n.LabError as e:
        print(str(e), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="dtrain-lab", description=i18n.tr("cli_desc"))
    ap.add_argument("--lang", choices=i18n.LANGS, help=i18n.tr("cli_lang_help"))
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("info", help=i18n.tr("cli_info_help"))
    run = sub.add_parser("run", help=i18n.tr("cli_run_help"))
    run.add_argument("target")
    run.add_argument("-n", "--nproc", type=int, default=None)
    run.add_argument("--timeout", type=float, default=120.0)
    run.add_argument("--startup-timeout", type=float, default=120.0)
    run.add_argument("--backend", choices=["gloo", "nccl"])
    run.add_argument("--debug", choices=["OFF", "INFO", "DETAIL"])
    run.add_argument("--nnodes", type=int, default=1)
    run.add_argument("--node-rank", type=int, default=0)
    run.add_argument("--rdzv-endpoint")
    run.add_argument("--rdzv-id", help=i18n.tr("cli_rdzv_id_help"))
    run.add_argument("--max-restarts", type=int, default=0)
    # the program's own arguments come after "--" (split off before parsing, so that options may
    # follow the target: ``dtrain-lab run train.py -n 2 -- --lr 0.1``)
    sub.add_parser("grade", help="grade exercises / 评分 (dtrain-lab grade --help; a folder: a class, -j N)")
    sub.add_parser("autograder", help="Gradescope autograder zip per lab (dtrain-lab autograder build --help)")
    sub.add_parser("nccl", help=i18n.tr("cli_nccl_help"))
    bench = sub.add_parser("bench", help=i18n.tr("cli_bench_help"))
    bench.add_argument("--quick", action="store_true")
    bench.add_argument("--only", default="", help=i18n.tr("cli_bench_only_help"))
    sub.add_parser("doctor", help=i18n.tr("cli_doctor_help"))
    sub.add_parser("cluster", help=i18n.tr("cli_cluster_help"))
    sub.add_parser("plan", help=i18n.tr("cli_plan_help"))
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["plan"] or argv[2:3] == ["plan"] and argv[0] == "--lang":
        # dtrain-lab plan --model M --world-size N --tp … [--json] (dtrain_lab.planner.cli)
        from dtrain_lab.planner.cli import main as plan_main

        return plan_main(argv[argv.index("plan") + 1:] + (argv[:2] if argv[0] == "--lang" else []))
    for i in (0, 2):   # ``dtrain-lab [--lang L] doctor ...`` is ``nccl doctor``
        if argv[i:i + 1] == ["doctor"] and (i == 0 or argv[0] == "--lang"):
            argv[i:i + 1] = ["nccl", "doctor"]
    if argv[:1] == ["nccl"] or argv[2:3] == ["nccl"] and argv[0] == "--lang":
        # dtrain-lab nccl lint [--file F] [--json] | dtrain-lab nccl doctor [--json]
        from dtrain_lab import nccl

        rest = argv[argv.index("nccl") + 1:]
        if argv[0] == "--lang":
            rest += ["--lang", argv[1]]
        if not rest or rest[0] not in ("lint", "doctor"):
            print(i18n.tr("cli_nccl_usage"), file=sys.stderr)
            return 2
        try:
            return (nccl.main_lint if rest[0] == "lint" else nccl.main_doctor)(rest[1:])
        except i18n.LabError as e:
            print(str(e), file=sys.stderr)
            return 2
    if argv[:1] == ["cluster"] or argv[2:3] == ["cluster"] and argv[0] == "--lang":
        # dtrain-lab cluster slurm|trainjob|pytorchjob|job --name N --nnodes K ... [-o FILE]
        from dtrain_lab.jobs.cluster import main as cluster_main

        if argv[0] == "--lang":
            i18n.set_lang(argv[1])
        return cluster_main(argv[argv.index("cluster") + 1:])
    for cmd in ("grade", "autograder"):
        if cmd in argv[:3] and argv.index(cmd) in (0, 2) and (argv.index(cmd) == 0 or argv[0] == "--lang"):
            return _grading(cmd, argv)
    program_args: list[str] = []
    if "run" in argv[:3] and "--" in argv:
        cut = argv.index("--")
        argv, program_args = argv[:cut], argv[cut + 1:]
    args, unknown = ap.parse_known_args(argv)
    if unknown:
        if args.cmd == "run":
            print(i18n.both("cli_run_extra", extra=" ".join(unknown)), file=sys.stderr)
            return 2
        ap.parse_args(argv)  # argparse's own error (exits 2)
    args.program_args = program_args
    if args.lang:
        i18n.set_lang(args.lang)
    try:
        if args.cmd == "info":
            return _info()
        if args.cmd == "run":
            return _run(args)
        if args.cmd == "bench":
            from dtrain_lab.bench import main as bench_main

            return bench_main((["--quick"] if args.quick else []) + (["--only", args.only] if args.only else []))
    except i18n.LabError as e:  # a clear message, no traceback wall
        print(str(e), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
