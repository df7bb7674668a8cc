"""The ``dtrain-lab nccl lint|doctor`` commands."""
from __future__ import annotations

import argparse
import json
import os
import sys

from dtrain_lab import i18n
from dtrain_lab.nccl.machine import ICON, doctor, format_doctor
from dtrain_lab.nccl.envfile import EnvFileError, read_env_file
from dtrain_lab.nccl.findings import SEVERITIES
from dtrain_lab.nccl.lint import lint_env, lint_env_file, relevant

_TAGS = {"error": "nccl_cli_tag_error", "warning": "nccl_cli_tag_warning", "info": "nccl_cli_tag_info"}


def _parser(prog: str, desc_key: str) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=prog, description=i18n.tr(desc_key))
    ap.add_argument("--json", action="store_true", help=i18n.tr("nccl_cli_json"))
    ap.add_argument("--lang", choices=i18n.LANGS, help=i18n.tr("nccl_cli_lang"))
    return ap


def _parse(ap: argparse.ArgumentParser, argv):
    try:
        return ap.parse_args(argv), None
    except SystemExit as exc:  # --help, or a usage error argparse already printed
        return None, (exc.code if isinstance(exc.code, int) else 2)


def main_lint(argv: list[str] | None = None) -> int:
    """``dtrain-lab nccl lint [--file F] [--json] [--lang zh|en] [--strict]``; ``argv`` is what
    follows ``nccl lint`` on the command line. A file is read as ``docker run --env-file`` reads it
    (a ``KEY`` line without ``=`` takes its value from this environment, as docker would).

    Exit status: 0 clean (or only warnings/notes), 1 at least one error (or warning, with
    ``--strict``), 2 when the file cannot be read or parsed."""
    ap = _parser("dtrain-lab nccl lint", "nccl_cli_lint_desc")
    ap.add_argument("--file", "-f", help=i18n.tr("nccl_cli_file"))
    ap.add_argument("--strict", action="store_true", help=i18n.tr("nccl_cli_strict"))
    args, code = _parse(ap, argv)
    if args is None:
        return code
    lang = args.lang or i18n.get_lang()
    source = args.file or "environment"
    try:
        if args.file:
            parsed = read_env_file(args.file, os.environ)
            mapping, findings = parsed.values, lint_env_file(parsed)
        else:
            mapping = dict(os.environ)
            findings = lint_env(mapping)
    except EnvFileError as exc:
        if args.json:
            print(json.dumps({"source": source, "ok": False,
                              "error": {"code": exc.key, "line": exc.lineno,
                                        "message": i18n.rendered(exc.key, **exc.fields)}},
                             ensure_ascii=False, indent=2))
        else:
            print(exc.message(lang), file=sys.stderr)
        return 2
    counts = {s: sum(f.severity == s for f in findings) for s in SEVERITIES}
    checked = sorted(k for k in mapping if relevant(k))
    failed = counts["error"] > 0 or (args.strict and counts["warning"] > 0)
    if args.json:
        # Names only, never values: the environment can hold secrets (NCCL_PSK, tokens).
        print(json.dumps({"source": source, "ok": not failed, "checked": checked, "summary": counts,
                          "findings": [f.to_dict() for f in findings]}, ensure_ascii=False, indent=2))
        return 1 if failed else 0
    if not checked and not findings:
        print(i18n.tr("nccl_cli_none_relevant", lang))
    for f in findings:
        print(f"{ICON[f.severity]} [{i18n.tr(_TAGS[f.severity], lang)}] {f.message(lang)}")
        if f.source:
            print(f"    {f.source}")
    if (checked or args.file) and not findings:
        print(i18n.tr("nccl_cli_clean", lang))
    print(i18n.tr("nccl_cli_summary", lang, n=len(checked), **counts))
    return 1 if failed else 0


def main_doctor(argv: list[str] | None = None) -> int:
    """``dtrain-lab nccl doctor [--json] [--lang zh|en]``; ``argv`` is what follows ``nccl doctor``.
    Exits 0: the doctor reports, it does not judge."""
    args, code = _parse(_parser("dtrain-lab nccl doctor", "nccl_cli_doctor_desc"), argv)
    if args is None:
        return code
    report = doctor()
    if args.json:
        print(json.dumps(report, ensure_ascii=False, indent=2, default=str))
    else:
        print(format_doctor(report, args.lang or i18n.get_lang()))
    return 0
