"""The autograder: run a submission sandboxed on several ranks, judge it outside, explain the verdict.

    from dtrain_lab.grading import grade, exercises
    v = grade("lab10.rank0_eval", "my_fix.py", lang="en")
    v.passed, v.outcome, print(v.feedback)

The trust model (``docs/instructor_guide.md``, "what the grader proves"):

* every rank runs in an OS sandbox of its own (:mod:`~dtrain_lab.sandbox.bwrap`): its own PID,
  user and mount namespaces, loopback-only network shared with its peers, no root, the course
  package read-only, resource limits; the job's PID namespace ends with it;
* the rank runs only the learner's function (:mod:`~dtrain_lab.grading.harness`) and hands back the
  value through one narrow channel of plain data (:mod:`~dtrain_lab.grading.channel`);
* the checks, the references and the hidden checks (:mod:`dtrain_lab.grading.checks`) run in the
  grader's process, after the sandbox is gone, and are not even importable inside it; a submission
  imports only its lab's contract module (``dtrain_lab.grading.lab10``, ...);
* every rank's inputs are private to it and drawn from a seed chosen for this grade, so an answer
  computed without the required communication is wrong.

:func:`grade` refuses to run a submission where this machine has no sandbox, unless
``sandbox=False`` (``dtrain-lab grade --no-sandbox``). :func:`check`, the notebook's one-line cell,
then runs it unsandboxed and says that this is a self-check, not a grade.

Exercises with a ``static_check`` (lab 11's ``.env`` files) are read, never run.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from typing import TYPE_CHECKING

from dtrain_lab import caps
from dtrain_lab.grading import registry
from dtrain_lab.grading.exercise import Exercise, Run, own_words, problem  # noqa: F401
from dtrain_lab.grading.registry import add_hidden_check  # noqa: F401
from dtrain_lab.i18n import get_lang, tr

if TYPE_CHECKING:
    from dtrain_lab.grading.grader import Verdict

OUTCOMES = ("pass", "wrong", "crash", "hang", "error")


def __getattr__(name: str):
    # the grader (and torch with it) is imported when first used, not by a rank's harness, which
    # imports this package too
    if name in ("Verdict", "MAX_STATIC_BYTES"):
        from dtrain_lab.grading import grader

        return getattr(grader, name)
    raise AttributeError(f"module 'dtrain_lab.grading' has no attribute {name!r}")


def grade(*args, **kwargs):
    """See :func:`dtrain_lab.grading.grader.grade`."""
    from dtrain_lab.grading.grader import grade as _grade

    return _grade(*args, **kwargs)


def exercises(lab: str | None = None) -> list[dict]:
    """Every exercise: id, titles in zh and en, world sizes, time limit."""
    return [{"id": e.id, "title": dict(e.title), "world_sizes": list(e.world_sizes), "timeout": e.timeout,
             "file": e.filename, "max_score": e.max_score}
            for e in registry.all_exercises() if lab is None or e.lab == lab]


def check(exercise_id: str, path: str | None = None, *, lang: str | None = None) -> Verdict:
    """The notebook's one-line check cell: grade the file the cell above wrote and print the verdict.

    Where this machine cannot run the sandbox (macOS; a kernel that forbids unprivileged user
    namespaces), the file runs without it and a line above the verdict says that this is a self-check,
    not a grade. The verdict itself reads the same either way."""
    ex = registry.get(exercise_id)
    lang = lang or get_lang()
    probe = caps.sandbox_probe()
    v = grade(exercise_id, path or ex.filename, lang=lang, sandbox=None if probe.ok else False)
    if not probe.ok and ex.static_check is None:
        v.feedback = v.feedback.removesuffix("\n" + tr("grade_unsandboxed_note", lang))
        v.details["self_check"] = True
        print(tr("grade_self_check", lang, reason=probe.reason))
    print(v.feedback)
    return v


def gradescope_results(verdicts: list[Verdict]) -> dict:
    """Gradescope's autograder ``results.json`` structure (score, tests with name/score/max_score/output)."""
    return {
        "score": sum(v.score for v in verdicts),
        "tests": [{"name": v.exercise, "score": v.score, "max_score": v.max_score, "output": v.feedback,
                   "status": "passed" if v.passed else "failed"} for v in verdicts],
    }


def write_json(verdicts: list[Verdict], path: str | os.PathLike) -> None:
    Path(path).write_text(json.dumps([v.to_json() for v in verdicts], ensure_ascii=False, indent=2))


def submissions_in_notebook(path: str | os.PathLike) -> dict[str, str]:
    """``{exercise id: source}`` for every ``%%writefile <file>`` cell naming an exercise's file."""
    nb = json.loads(Path(path).read_text(encoding="utf-8"))
    by_file = {e.filename: e.id for e in registry.all_exercises() if e.filename}
    found = {}
    for cell in nb.get("cells", []):
        if cell.get("cell_type") != "code":
            continue
        src = cell.get("source", [])
        src = "".join(src) if isinstance(src, list) else str(src)
        first, _, body = src.partition("\n")
        parts = first.split()
        if len(parts) >= 2 and parts[0] == "%%writefile":
            name = Path(parts[-1]).name
            if name in by_file:
                found[by_file[name]] = body
    return found


def grade_notebook(path: str | os.PathLike, *, lang: str | None = None, workdir: str | None = None,
                   sandbox: bool | None = None) -> list[Verdict]:
    """Grade every graded cell of one learner's notebook (each in a fresh temporary folder)."""
    import tempfile

    verdicts = []
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        for ex_id, source in sorted(submissions_in_notebook(path).items()):
            file = Path(tmp) / registry.get(ex_id).filename
            file.write_text(source)
            verdicts.append(grade(ex_id, file, lang=lang, sandbox=sandbox))
    return verdicts


def grade_folder(folder: str | os.PathLike, *, lang: str | None = None, sandbox: bool | None = None) -> dict[str, list[Verdict]]:
    """A class's notebooks, one per learner: ``{notebook name: verdicts}``."""
    return {p.name: grade_notebook(p, lang=lang, sandbox=sandbox) for p in sorted(Path(folder).glob("*.ipynb"))}


def main(argv: list[str] | None = None) -> int:
    """``dtrain-lab grade``: ``ID FILE`` | ``NOTEBOOK`` | ``FOLDER``, with ``--json``, ``--gradescope OUT``,
    ``--list``, ``--no-sandbox``."""
    import argparse

    ap = argparse.ArgumentParser(prog="dtrain-lab grade")
    ap.add_argument("target", nargs="*", help="EXERCISE_ID FILE, or a lab notebook, or a folder of notebooks")
    ap.add_argument("--list", action="store_true", help="list the exercises")
    ap.add_argument("--json", action="store_true", help="print verdicts as JSON")
    ap.add_argument("--gradescope", metavar="OUT", help="write Gradescope results.json")
    ap.add_argument("--lang", choices=("zh", "en"))
    ap.add_argument("--no-sandbox", action="store_true",
                    help="run submissions without the OS sandbox (only for code you trust: your own)")
    args = ap.parse_args(argv)
    lang = args.lang or get_lang()
    if args.list:
        for e in exercises():
            print(f"{e['id']:<28} {e['title'][lang]}  ({e['file']})")
        return 0
    box = False if args.no_sandbox else None
    if len(args.target) == 2:
        results = {args.target[1]: [grade(args.target[0], args.target[1], lang=lang, sandbox=box)]}
    elif len(args.target) == 1 and Path(args.target[0]).is_dir():
        results = grade_folder(args.target[0], lang=lang, sandbox=box)
    elif len(args.target) == 1:
        results = {args.target[0]: grade_notebook(args.target[0], lang=lang, sandbox=box)}
    else:
        ap.error(tr("grade_cli_usage", lang))
    if args.json:
        print(json.dumps({k: [v.to_json() for v in vs] for k, vs in results.items()}, ensure_ascii=False, indent=2))
    else:
        for name, verdicts in results.items():
            total = sum(v.score for v in verdicts)
            print(f"== {name}: {total:g}/{sum(v.max_score for v in verdicts)}")
            for v in verdicts:
                print(v.feedback)
    if args.gradescope:
        verdicts = [v for vs in results.values() for v in vs]
        Path(args.gradescope).write_text(json.dumps(gradescope_results(verdicts), ensure_ascii=False, indent=2))
    all_verdicts = [v for vs in results.values() for v in vs]
    if any(v.details.get("refused") for v in all_verdicts):
        return 2
    return 0 if all_verdicts and all(v.passed for v in all_verdicts) else 1
