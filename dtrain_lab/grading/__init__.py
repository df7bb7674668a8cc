"""The autograder: run a submission on several ranks, judge it, explain the verdict in the learner's language.

    from dtrain_lab.grading import grade, exercises
    v = grade("lab10.rank0_eval", "my_fix.py", lang="en")
    v.passed, v.outcome, print(v.feedback)

Outcomes: ``pass``, ``wrong`` (finished, result or collective sequence wrong), ``crash`` (a rank
raised or died: which rank, which exception), ``hang`` (no progress within the exercise's limit:
where every rank waits), ``error`` (the submission could not be graded: missing file, missing
function, still the stub). Every run goes through :func:`dtrain_lab.launch` in its own process
group with a hard limit; whatever the submission does, a verdict comes back and no process stays.

Exercises with a ``static_check`` (lab 11's ``.env`` files) are read, never run: nothing is launched,
files larger than :data:`MAX_STATIC_BYTES` or not UTF-8 text are refused, and the verdict is ``pass``,
``wrong`` (every problem listed) or ``error``.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from dtrain_lab.i18n import get_lang
from dtrain_lab.grading import registry, trace
from dtrain_lab.grading.registry import Exercise, add_hidden_check, problem, register  # noqa: F401

OUTCOMES = ("pass", "wrong", "crash", "hang", "error")

TEXT = {
    "pass": {"en": "✓ {title}: passed on {sizes} {ranks}.", "zh": "✓ {title}：在 {sizes} 个 rank 上通过。"},
    "not_yet": {"en": "… {title}: not attempted yet ({file} still contains the stub).",
                "zh": "… {title}：尚未作答（{file} 里还是空白模板）。"},
    "missing_file": {"en": "✗ {title}: no submission file {file}. Run the %%writefile cell above first.",
                     "zh": "✗ {title}：找不到提交文件 {file}。请先运行上方的 %%writefile 单元格。"},
    "missing_entry": {"en": "✗ {title}: the file must define a function `{entry}()`.",
                      "zh": "✗ {title}：文件里必须定义函数 `{entry}()`。"},
    "wrong": {"en": "✗ {title}: it finished on {n} ranks, but:", "zh": "✗ {title}：在 {n} 个 rank 上运行结束了，但是："},
    "mismatch": {"en": "  the ranks issued different collectives at call #{i}: {calls}. Even when such a "
                       "program happens to finish, it can deadlock (or silently combine the wrong tensors) on another run.",
                 "zh": "  各 rank 第 {i} 次集合通信调用不一致：{calls}。这样的程序即使这次碰巧跑完了，"
                       "换一次运行也可能死锁（或者悄悄地把不该合并的张量合并了）。"},
    "peer_gone": {"en": "  That is what a rank sees when its partner already finished or died: the ranks did not "
                        "issue matching collectives.",
                  "zh": "  当通信伙伴已经结束或退出时，rank 看到的就是这个错误：各 rank 发起的集合通信没有一一对应。"},
    "crash": {"en": "✗ {title}: crashed on {n} ranks; rank {rank} failed first: {exc}",
              "zh": "✗ {title}：在 {n} 个 rank 上崩溃；最先出错的是 rank {rank}：{exc}"},
    "hang": {"en": "✗ {title}: hung on {n} ranks (no progress within {limit:g} s). Where each rank waited:",
             "zh": "✗ {title}：在 {n} 个 rank 上挂起（{limit:g} 秒内没有进展）。各 rank 卡在："},
    "scenario": {"en": "  (scenario: {name})", "zh": "  （场景：{name}）"},
    "hang_startup": {"en": "✗ {title}: the ranks never finished starting on {n} ranks (did every rank create the process group?).",
                     "zh": "✗ {title}：{n} 个 rank 始终没能完成启动（是不是有 rank 没有建立进程组？）。"},
    # --- static (read, never run) exercises
    "pass_static": {"en": "✓ {title}: passed.", "zh": "✓ {title}：通过。"},
    "wrong_static": {"en": "✗ {title}: not right yet ({n} problem(s)):", "zh": "✗ {title}：还不对（{n} 个问题）："},
    "error_static": {"en": "✗ {title}: {file} could not be graded:", "zh": "✗ {title}：无法给 {file} 评分："},
    "too_large": {"en": "✗ {title}: {file} is {size} bytes; a submission may be at most {limit} bytes. "
                        "Is it the right file?",
                  "zh": "✗ {title}：{file} 有 {size} 字节，提交的文件最多 {limit} 字节。是不是选错了文件？"},
    "not_text": {"en": "✗ {title}: {file} is not a text file ({why}). "
                       "Write it with the %%writefile cell above.",
                 "zh": "✗ {title}：{file} 不是文本文件（{why}）。请用上方的 %%writefile 单元格生成它。"},
    "check_failed": {"en": "the grader could not check this file: {exc}", "zh": "评分器无法检查这个文件：{exc}"},
}

MAX_STATIC_BYTES = 64 * 1024   # a configuration file a person wrote is far smaller


def _describe_mismatch(mismatch, lang: str) -> str:
    i, calls = mismatch
    none = "(no call)" if lang == "en" else "（没有调用）"
    desc = "; ".join(f"rank {k}: {v['op'] if v else none}" for k, v in sorted(calls.items()))
    return _t("mismatch", lang, i=i + 1, calls=desc)


def _is_secondary(exc: str) -> bool:
    from dtrain_lab.jobs.launch import _is_secondary as secondary

    return secondary(exc)


def _t(key: str, lang: str, **kw) -> str:
    return TEXT[key][lang].format(**kw)


@dataclass
class Verdict:
    exercise: str
    passed: bool
    score: float
    max_score: int
    outcome: str
    feedback: str
    lang: str
    details: dict = field(default_factory=dict)
    elapsed: float = 0.0

    def to_json(self) -> dict:
        return asdict(self)

    def __str__(self) -> str:
        return self.feedback


def exercises(lab: str | None = None) -> list[dict]:
    """Every exercise: id, titles in zh and en, world sizes, time limit."""
    return [{"id": e.id, "title": dict(e.title), "world_sizes": list(e.world_sizes), "timeout": e.timeout,
             "file": e.filename, "max_score": e.max_score}
            for e in registry.all_exercises() if lab is None or e.lab == lab]


def _verdict(ex: Exercise, outcome: str, feedback: str, lang: str, **details) -> Verdict:
    passed = outcome == "pass"
    return Verdict(exercise=ex.id, passed=passed, score=float(ex.max_score if passed else 0),
                   max_score=ex.max_score, outcome=outcome, feedback=feedback, lang=lang, details=details)


def grade(exercise_id: str, submission: str | os.PathLike, *, lang: str | None = None,
          quiet: bool = True) -> Verdict:
    """Grade one submission file for one exercise. Never raises for what the submission does."""
    lang = lang or get_lang()
    ex = registry.get(exercise_id)
    title = ex.title[lang]
    path = Path(submission)
    if not path.is_file():
        return _verdict(ex, "error", _t("missing_file", lang, title=title, file=path), lang)
    if ex.static_check is not None:
        return _grade_static(ex, path, lang)
    source = path.read_text(errors="replace")
    if ex.stub_marker and ex.stub_marker in source:
        return _verdict(ex, "error", _t("not_yet", lang, title=title, file=path.name), lang, not_yet=True)
    v = _grade_launched(ex, path, lang, quiet)
    if not v.passed and v.outcome in ("wrong", "crash", "hang") and ex.explain is not None:
        try:
            extra = ex.explain(v.outcome, v.feedback, source) or []
        except Exception:  # noqa: BLE001 - an explanation must never cost the learner the verdict
            extra = []
        if extra:
            v.feedback = "\n".join([v.feedback] + [f"  {p[lang]}" for p in extra])
    return v


def _read_text_submission(ex: Exercise, path: Path, lang: str) -> tuple[str | None, Verdict | None]:
    """The file's text, or the verdict refusing it: too large, binary, or not UTF-8. The size is
    checked before reading, and never more than the limit is read."""
    title = ex.title[lang]
    try:
        size = path.stat().st_size
        if size > MAX_STATIC_BYTES:
            return None, _verdict(ex, "error", _t("too_large", lang, title=title, file=path.name, size=size,
                                                  limit=MAX_STATIC_BYTES), lang)
        with open(path, "rb") as f:
            data = f.read(MAX_STATIC_BYTES + 1)
    except OSError as exc:
        return None, _verdict(ex, "error", _t("missing_file", lang, title=title, file=path), lang, reason=str(exc))
    if len(data) > MAX_STATIC_BYTES:  # it grew between stat() and read()
        return None, _verdict(ex, "error", _t("too_large", lang, title=title, file=path.name, size=len(data),
                                              limit=MAX_STATIC_BYTES), lang)
    if b"\0" in data:
        why = "it contains NUL bytes" if lang == "en" else "含有 NUL 字节"
        return None, _verdict(ex, "error", _t("not_text", lang, title=title, file=path.name, why=why), lang)
    try:
        return data.decode("utf-8"), None
    except UnicodeDecodeError:
        why = "not valid UTF-8" if lang == "en" else "不是合法的 UTF-8"
        return None, _verdict(ex, "error", _t("not_text", lang, title=title, file=path.name, why=why), lang)


def _grade_static(ex: Exercise, path: Path, lang: str) -> Verdict:
    """A submission that is read, never run: nothing is launched, executed or expanded."""
    title = ex.title[lang]
    text, refused = _read_text_submission(ex, path, lang)
    if refused is not None:
        return refused
    if ex.stub_marker and ex.stub_marker in text:
        return _verdict(ex, "error", _t("not_yet", lang, title=title, file=path.name), lang, not_yet=True)
    try:
        problems = list(ex.static_check(text, path) or [])
        problems += [p for check in ex.hidden for p in (check(None, text, path) or [])]
    except Exception as exc:  # noqa: BLE001 - a verdict, never an exception, whatever the file holds
        msg = _t("check_failed", lang, exc=f"{type(exc).__name__}: {exc}")
        return _verdict(ex, "error", "\n".join([_t("error_static", lang, title=title, file=path.name), f"  {msg}"]),
                        lang)
    if any(p.get("error") for p in problems):
        lines = [_t("error_static", lang, title=title, file=path.name)]
        lines += [f"  {p[lang]}" for p in problems if p.get("error")]
        return _verdict(ex, "error", "\n".join(lines), lang)
    if problems:
        lines = [_t("wrong_static", lang, title=title, n=len(problems))] + [f"  - {p[lang]}" for p in problems]
        return _verdict(ex, "wrong", "\n".join(lines), lang, problems=problems)
    return _verdict(ex, "pass", _t("pass_static", lang, title=title), lang)


def _grade_launched(ex: Exercise, path: Path, lang: str, quiet: bool) -> Verdict:
    """Run the submission on every world size of the exercise through the harness."""
    from dtrain_lab.jobs.launch import launch

    title = ex.title[lang]
    elapsed = 0.0
    for n, run in [(n, run) for n in ex.world_sizes for run in (ex.runs or ({},))]:
        env = {"DTRAIN_LANG": lang, "DTRAIN_BACKEND": "gloo", **run.get("env", {})}
        r = launch("dtrain_lab.grading.harness", nproc=n, args=[ex.id, str(path.resolve())],
                   timeout=ex.timeout, startup_timeout=max(60.0, ex.timeout), quiet=quiet,
                   max_output_lines=2000, max_restarts=run.get("max_restarts", 0),
                   # exercises are CPU programs: gloo even on a GPU machine (NCCL serves CUDA tensors only)
                   env=env)
        scenario = _t("scenario", lang, name=run["name"][lang]) if run.get("name") else None
        elapsed += r.elapsed
        if r.hung:
            if r.phase == "startup":
                lines = [_t("hang_startup", lang, title=title, n=n)] + ([scenario] if scenario else [])
                return _verdict(ex, "hang", "\n".join(lines), lang, world_size=n)
            lines = [_t("hang", lang, title=title, n=n, limit=ex.timeout)] + ([scenario] if scenario else [])
            for rr in r.ranks:
                where = f"{rr.waiting.call} ({rr.waiting.where})" if rr.waiting else "?"
                lines.append(f"  rank {rr.rank}: {where}")
            return _verdict(ex, "hang", "\n".join(lines), lang, world_size=n,
                            stacks={rr.rank: rr.stack for rr in r.ranks})
        traces = {rr.rank: trace.read(os.path.join(r.log_dir, f"trace.{rr.rank}.jsonl")) for rr in r.ranks}
        if not r.ok:
            exc = r.exception or f"exit code {r.returncode}"
            lines = [_t("crash", lang, title=title, n=n, rank=r.first_failure, exc=exc)] + ([scenario] if scenario else [])
            if _is_secondary(exc):
                lines.append(_t("peer_gone", lang))
                mismatch = trace.first_mismatch(traces)
                if mismatch:
                    lines.append(_describe_mismatch(mismatch, lang))
            return _verdict(ex, "crash", "\n".join(lines), lang, world_size=n,
                            output={rr.rank: rr.output[-4000:] for rr in r.ranks})
        if any("missing_entry" in m for m in r.metrics.values()):
            return _verdict(ex, "error", _t("missing_entry", lang, title=title, entry=ex.entry), lang)
        problems = []
        for tcheck in ex.trace_checks:
            problems.extend(f"  {p[lang]}" for p in tcheck(traces))
        if ex.consistent_collectives:
            mismatch = trace.first_mismatch(traces)
            if mismatch:
                problems.append(_describe_mismatch(mismatch, lang))
        for rank, m in sorted(r.metrics.items()):
            if not m.get("done"):
                problems.append(f"  rank {rank}: {'no result was reported' if lang == 'en' else '没有汇报结果'}")
            for p in m.get("problems", []):
                text = f"  rank {rank}: {p[lang]}"
                if text not in problems:
                    problems.append(text)
        if problems:
            head = [_t("wrong", lang, title=title, n=n)] + ([scenario] if scenario else [])
            return _verdict(ex, "wrong", "\n".join(head + problems), lang, world_size=n)
    v = _verdict(ex, "pass", _t("pass", lang, title=title, sizes=" / ".join(map(str, ex.world_sizes)),
                                     ranks="rank" if tuple(ex.world_sizes) == (1,) else "ranks"), lang)
    v.elapsed = elapsed
    return v


def check(exercise_id: str, path: str | None = None, *, lang: str | None = None) -> Verdict:
    """The notebook's one-line check cell: grade the file the cell above wrote and print the verdict."""
    ex = registry.get(exercise_id)
    v = grade(exercise_id, path or ex.filename, lang=lang)
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
        src = "".join(cell.get("source", []))
        first, _, body = src.partition("\n")
        parts = first.split()
        if len(parts) >= 2 and parts[0] == "%%writefile":
            name = Path(parts[-1]).name
            if name in by_file:
                found[by_file[name]] = body
    return found


def grade_notebook(path: str | os.PathLike, *, lang: str | None = None, workdir: str | None = None) -> list[Verdict]:
    """Grade every graded cell of one learner's notebook (each in a fresh temporary folder)."""
    import tempfile

    verdicts = []
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        for ex_id, source in sorted(submissions_in_notebook(path).items()):
            file = Path(tmp) / registry.get(ex_id).filename
            file.write_text(source)
            verdicts.append(grade(ex_id, file, lang=lang))
    return verdicts


def grade_folder(folder: str | os.PathLike, *, lang: str | None = None) -> dict[str, list[Verdict]]:
    """A class's notebooks, one per learner: ``{notebook name: verdicts}``."""
    return {p.name: grade_notebook(p, lang=lang) for p in sorted(Path(folder).glob("*.ipynb"))}


def main(argv: list[str] | None = None) -> int:
    """``dtrain-lab grade``: ``ID FILE`` | ``NOTEBOOK`` | ``FOLDER``, with ``--json``, ``--gradescope OUT``, ``--list``."""
    import argparse

    ap = argparse.ArgumentParser(prog="dtrain-lab grade")
    ap.add_argument("target", nargs="*", help="EXERCISE_ID FILE, or a lab notebook, or a folder of notebooks")
    ap.add_argument("--list", action="store_true", help="list the exercises")
    ap.add_argument("--json", action="store_true", help="print verdicts as JSON")
    ap.add_argument("--gradescope", metavar="OUT", help="write Gradescope results.json")
    ap.add_argument("--lang", choices=("zh", "en"))
    args = ap.parse_args(argv)
    lang = args.lang or get_lang()
    if args.list:
        for e in exercises():
            print(f"{e['id']:<28} {e['title'][lang]}  ({e['file']})")
        return 0
    if len(args.target) == 2:
        results = {args.target[1]: [grade(args.target[0], args.target[1], lang=lang)]}
    elif len(args.target) == 1 and Path(args.target[0]).is_dir():
        results = grade_folder(args.target[0], lang=lang)
    elif len(args.target) == 1:
        results = {args.target[0]: grade_notebook(args.target[0], lang=lang)}
    else:
        ap.error("give EXERCISE_ID FILE, a notebook or a folder / 请给出 练习ID 文件、一个 notebook 或一个文件夹")
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
    return 0 if all_verdicts and all(v.passed for v in all_verdicts) else 1
