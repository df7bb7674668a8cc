"""Grade one submission: run it sandboxed on every world size, judge what came back, explain the verdict.

Outcomes: ``pass``, ``wrong`` (finished, result or collective sequence wrong), ``crash`` (a rank
raised or died: which rank, which exception), ``hang`` (no progress within the exercise's limit:
where every rank waits), ``error`` (the submission could not be graded: missing file, missing
function, still the learner's starting copy, no sandbox). Whatever the submission does, a verdict
comes back and no process of it stays.

The verdict is computed here, in the grader's process, after the sandbox is gone; the checks run
on the values the ranks handed back and on the inputs every rank was given (drawn from a seed
chosen for this grade, :mod:`dtrain_lab.grading.contract`).
"""
from __future__ import annotations

import os
import re
import secrets
import stat
from dataclasses import asdict, dataclass, field
from pathlib import Path

from dtrain_lab import caps
from dtrain_lab.grading import channel, registry, runner, trace
from dtrain_lab.grading.exercise import Exercise, Run, problem
from dtrain_lab.sandbox import apart
from dtrain_lab.i18n import get_lang, tr
from dtrain_lab.jobs.diagnose import is_secondary_error

MAX_STATIC_BYTES = 64 * 1024       # a configuration file a person wrote is far smaller
MAX_SOURCE_BYTES = 1 << 20         # a program a person wrote for one exercise
MAX_FEEDBACK_CHARS = 16_000


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



def _sizes(world_sizes, lang) -> str:
    """The world sizes a verdict passed on, one run each: "2 and 3" / "2 个和 3 个" (not "2 / 3", which reads
    as a fraction)."""
    items = [tr("grade_pass_size", lang, n=n) for n in world_sizes]
    if len(items) <= 1:
        return "".join(items)
    return tr("grade_pass_sizes", lang, rest=tr("grade_pass_sizes_sep", lang).join(items[:-1]), last=items[-1])


def _verdict(ex: Exercise, outcome: str, feedback: str, lang: str, **details) -> Verdict:
    passed = outcome == "pass"
    if len(feedback) > MAX_FEEDBACK_CHARS:
        feedback = feedback[:MAX_FEEDBACK_CHARS] + "\n" + tr("grade_feedback_cut", lang, n=MAX_FEEDBACK_CHARS)
    return Verdict(exercise=ex.id, passed=passed, score=float(ex.max_score if passed else 0),
                   max_score=ex.max_score, outcome=outcome, feedback=feedback, lang=lang, details=details)


def _n_key(key: str, n: int) -> str:
    """``key`` or its ``_one`` form for a single rank (so that no message says "on 1 ranks")."""
    return f"{key}_one" if n == 1 else key


# The keys _n_key() may produce, written out for readers and for the catalogue's "every key is used" test.
_N_KEYS = ("grade_pass", "grade_pass_one", "grade_wrong", "grade_wrong_one", "grade_crash", "grade_crash_one",
           "grade_hang", "grade_hang_one", "grade_hang_startup", "grade_hang_startup_one")


def read_submission(ex: Exercise, path: Path, lang: str, limit: int) -> tuple[str | None, Verdict | None]:
    """The file's text, or the verdict refusing it: missing, a symlink, too large, binary, not UTF-8.
    The size is checked before reading, and never more than the limit is read."""
    title = ex.title[lang]
    try:
        st = os.lstat(path)
    except OSError:
        return None, _verdict(ex, "error", tr("grade_missing_file", lang, title=title, file=path), lang)
    if stat.S_ISLNK(st.st_mode):
        return None, _verdict(ex, "error", tr("grade_symlink", lang, title=title, file=path.name), lang)
    if not stat.S_ISREG(st.st_mode):
        return None, _verdict(ex, "error", tr("grade_missing_file", lang, title=title, file=path), lang)
    if st.st_size > limit:
        return None, _verdict(ex, "error", tr("grade_too_large", lang, title=title, file=path.name, size=st.st_size,
                                              limit=limit), lang)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        with os.fdopen(fd, "rb") as f:
            data = f.read(limit + 1)
    except OSError as exc:
        return None, _verdict(ex, "error", tr("grade_missing_file", lang, title=title, file=path), lang, reason=str(exc))
    if len(data) > limit:  # it grew between stat() and read()
        return None, _verdict(ex, "error", tr("grade_too_large", lang, title=title, file=path.name, size=len(data),
                                              limit=limit), lang)
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    if b"\0" in data:
        return None, _verdict(ex, "error", tr("grade_not_text", lang, title=title, file=path.name,
                                              why=tr("grade_why_nul", lang)), lang)
    try:
        return data.decode("utf-8"), None
    except UnicodeDecodeError:
        return None, _verdict(ex, "error", tr("grade_not_text", lang, title=title, file=path.name,
                                              why=tr("grade_why_utf8", lang)), lang)


def _marker_line(text: str, marker: str) -> str:
    line = next((ln.strip() for ln in text.splitlines() if marker in ln), marker)
    return channel.cut(line, 100)


def grade(exercise_id: str, submission: str | os.PathLike, *, lang: str | None = None, quiet: bool = True,
          sandbox: bool | None = None) -> Verdict:
    """Grade one submission file for one exercise. Never raises for what the submission does.

    ``sandbox``: ``None`` or ``True`` runs it in the OS sandbox and refuses (an ``error`` verdict
    saying why) where this machine has none; ``False`` runs it unsandboxed (``--no-sandbox``:
    for one's own code only). An exercise id that does not exist is the caller's mistake (a
    :class:`~dtrain_lab.i18n.LabError`); anything that goes wrong after that, the grader's own code
    included, is an ``error`` verdict that says the grader failed, never an exception."""
    lang = lang or get_lang()
    ex = registry.get(exercise_id)
    try:
        return _grade(ex, submission, lang, sandbox)
    except Exception as exc:  # noqa: BLE001 - a grade never raises: the learner gets a verdict, staff the cause
        import traceback

        traceback.print_exc(limit=8)
        why = channel.cut(f"{type(exc).__name__}: {exc}", 300)
        return _verdict(ex, "error", tr("grade_internal_error", lang, title=ex.title[lang], why=why), lang,
                        internal_error=why)


def _grade(ex: Exercise, submission, lang: str, sandbox: bool | None) -> Verdict:
    title = ex.title[lang]
    path = Path(submission)
    if ex.static_check is not None:
        return _grade_static(ex, path, lang)
    source, refused = read_submission(ex, path, lang, MAX_SOURCE_BYTES)
    if refused is not None:
        return refused
    if ex.stub_marker and ex.stub_marker in source:
        return _verdict(ex, "error", tr("grade_not_yet", lang, title=title, file=path.name,
                                        marker=_marker_line(source, ex.stub_marker)), lang, not_yet=True)
    sandboxed = sandbox is not False
    if sandboxed and not caps.sandbox_probe().ok:
        return _verdict(ex, "error", tr("grade_no_sandbox", lang, title=title, reason=caps.sandbox_probe().reason), lang,
                        refused="no_sandbox")
    v = _grade_launched(ex, path, lang, sandboxed)
    if not v.passed and v.outcome in ("wrong", "crash", "hang") and ex.explain is not None:
        try:
            extra = ex.explain(v.outcome, v.feedback, source) or []
        except Exception:  # noqa: BLE001 - an explanation must never cost the learner the verdict
            extra = []
        if extra:
            v.feedback = "\n".join([v.feedback] + [f"  {p[lang]}" for p in extra])
    return v


def _grade_static(ex: Exercise, path: Path, lang: str) -> Verdict:
    """A submission that is read, never run: nothing is launched, executed or expanded."""
    title = ex.title[lang]
    text, refused = read_submission(ex, path, lang, MAX_STATIC_BYTES)
    if refused is not None:
        return refused
    if ex.stub_marker and ex.stub_marker in text:
        return _verdict(ex, "error", tr("grade_not_yet", lang, title=title, file=path.name,
                                        marker=_marker_line(text, ex.stub_marker)), lang, not_yet=True)
    try:
        problems = list(ex.static_check(text, path) or [])
        problems += [p for check in ex.hidden for p in (check(None, text, path) or [])]
    except Exception as exc:  # noqa: BLE001 - a verdict, never an exception, whatever the file holds
        msg = tr("grade_check_failed", lang, exc=channel.cut(f"{type(exc).__name__}: {exc}", 300))
        return _verdict(ex, "error", "\n".join([tr("grade_error_static", lang, title=title, file=path.name),
                                                f"  {msg}"]), lang)
    if any(p.get("error") for p in problems):
        lines = [tr("grade_error_static", lang, title=title, file=path.name)]
        lines += [f"  {p[lang]}" for p in problems if p.get("error")]
        return _verdict(ex, "error", "\n".join(lines), lang)
    if problems:
        lines = [tr("grade_wrong_static", lang, title=title, n=len(problems))] + [f"  - {p[lang]}" for p in problems]
        return _verdict(ex, "wrong", "\n".join(lines), lang, problems=problems)
    return _verdict(ex, "pass", tr("grade_pass_static", lang, title=title), lang)


def _describe_mismatch(mismatch, lang: str) -> str:
    i, calls = mismatch
    none = tr("grade_no_call", lang)
    desc = "; ".join(f"rank {k}: {v['op'] if v else none}" for k, v in sorted(calls.items()))
    return tr("grade_mismatch", lang, i=i + 1, calls=desc)


def _is_secondary(text: str | None) -> bool:
    return bool(text) and is_secondary_error(text)


def _exception(ro, lang: str) -> str:
    """How rank ``ro`` ended, in one line: its exception, a signal, or its exit code."""
    if ro.error and ro.error.get("type"):
        return channel.cut(f"{ro.error['type']}: {ro.error.get('message', '')}", 400)
    native = re.search(r"terminate called after throwing an instance of '([^']+)'\s*\n\s*what\(\):\s*(.+)", ro.stderr)
    if native:   # a C++ exception ended the rank (gloo's checks do): std::terminate, no Python traceback
        return channel.cut(f"{native.group(1)} (C++ abort): {native.group(2).strip()}", 400)
    if ro.signal == "SIGXFSZ":
        return tr("grade_file_limit", lang, mb=runner.sandbox.Limits().file_mb)
    if ro.signal:
        return tr("grade_killed_by", lang, signal=ro.signal)
    for line in reversed(ro.stderr.splitlines()):
        s = line.strip()
        if s.endswith(("Error", "Exception")) or ("Error: " in s and not s.startswith(("File ", "["))):
            return channel.cut(s, 400)
    return tr("grade_exit_code", lang, code=ro.code)


# an error raised inside gloo or c10d's C++ ("[.../third_party/gloo/gloo/transport/tcp/pair.cc:NNN] ...",
# "[.../torch/csrc/distributed/c10d/...]"): what a rank sees of its peers, where another rank's own exception
# (raised by the submission) says more
_GLOO_INTERNAL = re.compile(r"^\[[^\]]*/(gloo|c10d)/")


def _first_failure(res) -> tuple[int | None, object]:
    failed = [ro for ro in res.ranks if ro.code not in (0, None)]
    if not failed:
        return None, None
    causes = [ro for ro in failed if not _is_secondary(ro.error.get("message") if ro.error else ro.stderr[-2000:])]
    # a rank's own exception before one raised inside gloo: under load a peer's gloo error was seen recorded
    # before the submission's KeyError that caused it (1 grading in a CI leg)
    own = [ro for ro in causes if not (ro.error and _GLOO_INTERNAL.match(ro.error.get("message") or ""))]
    pool = own or causes or failed
    early = [ro for ro in res.ranks if ro.code == 0 and not ro.done and "missing_entry" not in ro.events]
    if not causes and early:   # the others only saw a peer vanish: the peer that left early is the cause
        return early[0].rank, early[0]
    first = min(pool, key=lambda ro: (float((ro.error or {}).get("time") or ro.ended or 0.0)))
    return first.rank, first


def _where(ro, lang: str) -> str:
    if ro.waiting is not None:
        return tr("grade_where", lang, rank=ro.rank, call=ro.waiting.call, where=ro.waiting.where)
    if ro.done:
        return tr("grade_where_finished", lang, rank=ro.rank)
    if ro.code is not None:
        return tr("grade_where_exited", lang, rank=ro.rank, code=ro.code)
    return tr("grade_where_unknown", lang, rank=ro.rank)


def _make_run(ex: Exercise, n: int, scenario: dict) -> tuple[Run, list, list | None]:
    seed = secrets.randbits(63)
    inputs = ex.make_inputs(seed, n) if ex.make_inputs is not None else [{} for _ in range(n)]
    later = None
    if ex.restart_inputs is not None and scenario.get("max_restarts"):
        later = [channel.encode(i) for i in ex.restart_inputs(seed, n, inputs)]
    return Run(world_size=n, seed=seed, inputs=inputs, scenario=scenario), [channel.encode(i) for i in inputs], later


def _grade_launched(ex: Exercise, path: Path, lang: str, sandboxed: bool) -> Verdict:
    """Run the submission on every world size (and scenario) of the exercise; the first failure decides."""
    title = ex.title[lang]
    elapsed, runs = 0.0, []
    for n, scenario in [(n, s) for n in ex.world_sizes for s in (ex.runs or ({},))]:
        run, encoded, later = _make_run(ex, n, scenario)
        res = runner.run(runner.JobSpec(
            exercise=ex.id, entry=ex.entry, submission=path, world_size=n, inputs=encoded, timeout=ex.timeout,
            startup_timeout=max(60.0, ex.timeout), env=dict(scenario.get("env", {})),
            max_restarts=scenario.get("max_restarts", 0), pg_timeout=ex.pg_timeout, setup=ex.setup, hide=ex.hide,
            limits=runner.sandbox.Limits(memory_gb=ex.memory_limit_gb), sandboxed=sandboxed, lang=lang, shared=ex.shared,
            faults=[scenario["fault"]] if scenario.get("fault") else [], later_inputs=later))
        elapsed += res.elapsed
        runs.append({"world_size": n, "elapsed": round(res.elapsed, 3), "sandboxed": res.sandboxed, "mode": res.mode,
                     "job": Path(res.job_dir).name,
                     "to_first_start": None if res.to_first_start is None else round(res.to_first_start, 3),
                     "startup": None if res.startup is None else round(res.startup, 3)})
        v = judge_apart(ex, run, res, lang, title, scenario)
        if v is not None:
            v.elapsed, v.details["runs"] = elapsed, runs
            return _noted(v, sandboxed, lang)
    key = _n_key("grade_pass", max(ex.world_sizes)) if len(ex.world_sizes) == 1 else "grade_pass_sizes_all"
    sizes = str(ex.world_sizes[0]) if len(ex.world_sizes) == 1 else _sizes(ex.world_sizes, lang)
    v = _verdict(ex, "pass", tr(key, lang, title=title, sizes=sizes), lang, runs=runs)
    v.elapsed = elapsed
    return _noted(v, sandboxed, lang)


def _noted(v: Verdict, sandboxed: bool, lang: str) -> Verdict:
    v.details["sandboxed"] = sandboxed
    if not sandboxed:
        v.feedback += "\n" + tr("grade_unsandboxed_note", lang)
    return v


CHECK_SECONDS = 60.0          # a judgment's wall-clock budget (the references of every exercise take < 5 s)
CHECK_MEMORY = 2 << 30        # and the memory it may add to the grader's


def judge_apart(ex: Exercise, run: Run, res, lang: str, title: str, scenario: dict) -> Verdict | None:
    """:func:`_judge` in a forked child of this process, under a clock and a memory limit
    (:func:`dtrain_lab.sandbox.apart.call`): what the checks compute from a rank's values (hostile
    input: a (1, N) tensor where a list of buckets was expected took a grade from 20 s to 71 s and
    2.2 GiB) cannot stall or exhaust the grader. A check that overruns or dies is an ``error``
    verdict for this submission."""
    def judged():
        v = _judge(ex, run, res, lang, title, scenario)
        return None if v is None else asdict(v)

    try:
        doc = apart.call(judged, seconds=CHECK_SECONDS, memory=CHECK_MEMORY)
    except apart.ApartError as exc:
        if "Autograd-and-Fork" not in str(exc):
            why = tr("grade_check_overran", lang, seconds=int(exc.overran)) if exc.overran else channel.cut(str(exc), 300)
            return _verdict(ex, "error", tr("grade_checks_failed", lang, title=title, why=why), lang,
                            world_size=run.world_size)
        # this process ran a backward on fake tensors in a CUDA build of torch (a learner's own cell):
        # no forked child of it can run autograd, so the checks run here, as they did before
        return _judge(ex, run, res, lang, title, scenario)
    return None if doc is None else Verdict(**doc)


def _judge(ex: Exercise, run: Run, res, lang: str, title: str, scenario: dict) -> Verdict | None:
    n = run.world_size
    scen = [tr("grade_scenario", lang, name=scenario["name"][lang])] if scenario.get("name") else []
    if res.hung:
        if res.phase == "startup":
            return _verdict(ex, "hang", "\n".join([tr(_n_key("grade_hang_startup", n), lang, title=title, n=n)] + scen),
                            lang, world_size=n)
        lines = [tr(_n_key("grade_hang", n), lang, title=title, n=n, limit=res.limit)] + scen
        lines += [_where(ro, lang) for ro in res.ranks]
        return _verdict(ex, "hang", "\n".join(lines), lang, world_size=n,
                        stacks={ro.rank: (ro.stack or "")[-8000:] for ro in res.ranks})
    if res.start_error:   # the grader's machine could not start the job: not the submission's doing
        return _verdict(ex, "error", tr("grade_sandbox_failed", lang, title=title, why=channel.cut(res.start_error, 300)),
                        lang, world_size=n)
    run.timeline = {ro.rank: ro.trace for ro in res.ranks}
    run.traces = {ro.rank: trace.calls(ro.trace) for ro in res.ranks}
    run.exits = {ro.rank: ro.code for ro in res.ranks}
    run.attempts, run.faults, run.wire_bytes = res.attempts, list(res.faults), res.wire_bytes
    run.ended = {ro.rank: ro.ended for ro in res.ranks}
    run.elapsed = res.elapsed
    broken = [ro for ro in res.ranks if "start" not in ro.events and "bwrap:" in ro.stderr]
    if broken:   # the sandbox itself did not start: not the submission's doing
        line = next(ln for ln in broken[0].stderr.splitlines() if "bwrap:" in ln)
        return _verdict(ex, "error", tr("grade_sandbox_failed", lang, title=title, why=channel.cut(line, 300)), lang,
                        world_size=n)
    if any("missing_entry" in ro.events for ro in res.ranks):
        return _verdict(ex, "error", tr("grade_missing_entry", lang, title=title, entry=ex.entry), lang)
    if not res.ok:
        rank, ro = _first_failure(res)
        if ro is None:
            rank, ro = next(((r.rank, r) for r in res.ranks if not r.done), (0, res.ranks[0]))
        exc = tr("grade_left_early", lang, code=ro.code) if ro.code == 0 else _exception(ro, lang)
        lines = [tr(_n_key("grade_crash", n), lang, title=title, n=n, rank=rank, exc=exc)] + scen
        if any(_is_secondary(r.error.get("message") if r.error else r.stderr[-2000:]) for r in res.ranks if r.code):
            lines.append(tr("grade_peer_gone", lang))
            mismatch = trace.first_mismatch(run.traces)
            if mismatch:
                lines.append(_describe_mismatch(mismatch, lang))
        return _verdict(ex, "crash", "\n".join(lines), lang, world_size=n,
                        output={r.rank: r.output[-4000:] for r in res.ranks})
    problems: list[str] = []

    def add(text: str) -> None:
        if text not in problems:
            problems.append(text)

    for ro in res.ranks:
        if not ro.done:
            if "result_too_large" in ro.events:
                add(tr("grade_result_too_large", lang, rank=ro.rank, mb=channel.MAX_BYTES >> 20))
            elif "returned" in ro.events:
                add(tr("grade_no_result", lang, rank=ro.rank))
            else:
                add(tr("grade_left_early_rank", lang, rank=ro.rank, code=ro.code))
            continue
        if isinstance(ro.result, channel.Unreadable) or ro.result is None and "done" not in ro.events:
            add(tr("grade_result_unreadable", lang, rank=ro.rank, why=getattr(ro.result, "why", "?")))
            continue
        run.results[ro.rank] = ro.result
    for check in ex.job_checks:
        for p in _safe(check, lang, run):
            add(f"  {p[lang]}")
    if ex.consistent_collectives:
        mismatch = trace.first_mismatch(run.traces)
        if mismatch:
            add(_describe_mismatch(mismatch, lang))
    for rank, result in sorted(run.results.items()):
        for check in ex.all_checks():
            for p in _safe(check, lang, run, rank, result):
                add(f"  rank {rank}: {p[lang]}")
    if not problems:   # right values: were they obtained the way the exercise teaches?
        for check in ex.pattern_checks:
            for p in _safe(check, lang, run):
                add(f"  {p[lang]}")
    if problems:
        head = [tr(_n_key("grade_wrong", n), lang, title=title, n=n)] + scen
        return _verdict(ex, "wrong", "\n".join(head + problems), lang, world_size=n)
    return None


def _safe(check, lang: str, *args) -> list:
    try:
        return list(check(*args) or [])
    except Exception as exc:  # noqa: BLE001 - a check that cannot run on this result is a failure
        return [problem("grade_check_crashed", exc=channel.cut(f"{type(exc).__name__}: {exc}", 200))]
