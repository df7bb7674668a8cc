"""Grading a class: ``dtrain-lab grade FOLDER -j N``.

    dtrain-lab grade submissions/ -j 2                 # results.json + gradebook.csv in submissions_grades/
    dtrain-lab grade submissions/ -j 4 --lab 10 --out grades/

Every file under ``FOLDER`` gets a row, whatever it is:

* ``NAME.ipynb`` (or ``NAME/….ipynb``): a learner's lab notebook; each ``%%writefile`` cell that
  writes an exercise's file is graded (with ``--lab``, every exercise of the lab gets a row, a
  missing one scoring 0);
* ``….env`` named after a lab 11 exercise (``alice_lab11_roce.env``): read, never run;
* a malformed notebook, a loose ``.py``, a symbolic link, an oversized or unknown file: an
  ``error`` row with the reason in both languages. Nothing a file holds stops the run.

The student is the first folder under ``FOLDER`` when files sit in per-student folders, else the
file's name without its suffix.

Isolation. Before any submission runs, each file is copied (a UTF-8 byte-order mark removed) into
a private folder of its own (mode 0700) under a fresh temporary root; what is graded is that
copy, so no submission can change another's file or its own after the snapshot. Each submission
is then graded by a worker process of its own (``python -m dtrain_lab.grading.classrun --worker
DIR``, its own session), at most ``-j`` at a time; the worker calls :func:`dtrain_lab.grading.grade`
for each exercise, which runs the code in the grader's sandbox. A worker that outlives its budget
is killed with its process group and gets ``error`` rows; a verdict it reports is checked against
the registry (known exercise, score within the exercise's points) before it is recorded.

Results. Only after every worker has exited (and any process left under this one is killed) are
``results.json`` and ``gradebook.csv`` (student, file, exercise, score, max_score, outcome) written,
each atomically: a temporary file, ``fsync``, ``os.replace``, ``fsync`` of the folder. A class's
results are never a Gradescope ``results.json``: Gradescope grades one submission per container
(``dtrain-lab autograder build``).
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from dtrain_lab.grading import intake
from dtrain_lab.grading.gradebook import error_row, gradescope_json, write_atomic, write_results
from dtrain_lab.grading.intake import lab_of, match_file, notebook_exercises, read_regular, shown, without_bom
from dtrain_lab.i18n import LabError, get_lang, tr

IGNORED_DIRS = (".ipynb_checkpoints", "__MACOSX")
FORMAT = "dtrain-lab/class-results/1"


@dataclass
class Item:
    """One file of the class folder and what will be done with it."""
    rel: str                       # path under the folder, "/"-separated
    student: str
    kind: str = "error"            # "notebook" | "env" | "error"
    exercises: list = field(default_factory=list)   # exercise ids to grade
    error: tuple | None = None     # (message key, fields) when kind == "error"
    private: Path | None = None    # the private folder holding the copy
    rows: list = field(default_factory=list)
    elapsed: float = 0.0
    data: bytes | None = field(default=None, repr=False)   # the file's bytes until they are copied


def _student(rel: str) -> str:
    parts = rel.split("/")
    if len(parts) > 1:
        return parts[0]
    name = parts[0]
    return name[:-len(Path(name).suffix)] if Path(name).suffix else name


def scan(folder: Path, lang: str, lab: str | None = None) -> list[Item]:
    """Every file under ``folder`` (links not followed), classified; reads each file once."""
    from dtrain_lab.grading import registry

    items: list[Item] = []
    for dirpath, dirnames, filenames in os.walk(folder, followlinks=False):
        dirnames.sort()
        for name in sorted(filenames) + sorted(d for d in dirnames if os.path.islink(os.path.join(dirpath, d))):
            path = Path(dirpath) / name
            rel = shown(path, folder)
            item = Item(rel=rel, student=_student(rel))
            items.append(item)
            if path.is_symlink():
                item.error = ("class_symlink", {"file": rel})
                continue
            if any(part in IGNORED_DIRS or part.startswith(".") for part in rel.split("/")):
                item.error = ("class_hidden_file", {"file": rel})
                continue
            suffix = path.suffix.lower()
            if suffix == ".py":
                item.error = ("class_loose_py", {"file": rel})
                continue
            if suffix not in (".ipynb", ".env"):
                item.error = ("class_unknown_file", {"file": rel})
                continue
            try:
                size = path.lstat().st_size
                if size > intake.MAX_FILE_BYTES:
                    item.error = ("class_too_large", {"file": rel, "size": size, "limit": intake.MAX_FILE_BYTES})
                    continue
                data = read_regular(path, intake.MAX_FILE_BYTES)
            except OSError as exc:
                item.error = ("class_unreadable", {"file": rel, "why": exc.strerror or str(exc)})
                continue
            if data is None:   # a named pipe, a device, a socket
                item.error = ("class_unknown_file", {"file": rel})
                continue
            if len(data) > intake.MAX_FILE_BYTES:
                item.error = ("class_too_large", {"file": rel, "size": len(data), "limit": intake.MAX_FILE_BYTES})
                continue
            data = without_bom(data)
            if suffix == ".ipynb":
                found, why = notebook_exercises(data)
                if found is None:
                    item.error = ("class_bad_notebook", {"file": rel, "why": why})
                    continue
                if lab:
                    found = [i for i in found if registry.get(i).lab == lab]
                if not found and not lab:
                    item.error = ("class_no_exercises", {"file": rel})
                    continue
                item.kind, item.exercises = "notebook", found
            else:
                matched = match_file(name, ".env")
                if lab:
                    matched = [i for i in matched if registry.get(i).lab == lab]
                if len(matched) != 1:
                    known = ", ".join(e.filename for e in registry.all_exercises() if e.filename.endswith(".env"))
                    item.error = ("class_unknown_env", {"file": rel, "known": known})
                    continue
                item.kind, item.exercises = "env", matched
            item.data = data
    return items


def _snapshot(items: list[Item], root: Path, sandbox: bool | None) -> None:
    """Copy every gradable file into its own private folder before anything runs."""
    for n, item in enumerate(items):
        if item.kind != "error":
            copy_in(root / f"s{n:05d}", item, sandbox)


def copy_in(private: Path, item: Item, sandbox: bool | None) -> None:
    """One submission's private folder (mode 0700): its file under ``in/`` and the worker's ``job.json``."""
    (private / "in").mkdir(parents=True, mode=0o700)
    os.chmod(private, 0o700)
    name = "submission.ipynb" if item.kind == "notebook" else Path(item.rel).name
    (private / "in" / name).write_bytes(item.data)
    item.data = None
    job = {"kind": item.kind, "file": f"in/{name}", "rel": item.rel, "exercises": item.exercises, "sandbox": sandbox}
    (private / "job.json").write_text(json.dumps(job))
    item.private = private


def budget(exercise_ids: list[str]) -> float:
    """Seconds a worker may take: every launch's start-up and time limits, with slack."""
    from dtrain_lab.grading import registry

    total = 30.0
    for ex in map(registry.get, exercise_ids):
        launches = len(ex.world_sizes) * max(1, len(ex.runs or ()))
        total += 15.0 + launches * (max(60.0, ex.timeout) + ex.timeout + 15.0)
    return total


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def _checked_rows(item: Item, lang: str) -> list[dict]:
    """The worker's verdicts, accepted only where they fit the registry; a gap is an error row."""
    from dtrain_lab.grading import OUTCOMES, registry

    try:
        reported = json.loads((item.private / "result.json").read_text(encoding="utf-8"))
        reported = {r["exercise"]: r for r in reported if isinstance(r, dict) and isinstance(r.get("exercise"), str)}
    except (OSError, ValueError, TypeError, KeyError):
        reported = {}
    rows = []
    for ex_id in item.exercises:
        ex, r = registry.get(ex_id), reported.get(ex_id)
        if r is None or r.get("outcome") not in OUTCOMES or not isinstance(r.get("feedback"), str):
            log = _tail(item.private / "worker.log")
            rows.append(error_row("class_worker_failed", lang, exercise=ex_id, max_score=ex.max_score,
                                   file=item.rel, why=log or LabError("class_why_no_verdict")))
            continue
        try:
            score = min(max(float(r.get("score", 0.0)), 0.0), float(ex.max_score))
        except (TypeError, ValueError):
            score = 0.0
        rows.append({**r, "exercise": ex_id, "max_score": ex.max_score, "passed": r["outcome"] == "pass",
                     "score": score if r["outcome"] == "pass" else 0.0})
    return rows


def _tail(path: Path, limit: int = 400) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return ""
    return text[-limit:]


def run_class(folder: str | os.PathLike, *, jobs: int = 2, lang: str | None = None, lab: str | None = None,
              quiet: bool = True, sandbox: bool | None = None) -> dict:
    """Grade every file under ``folder``; returns the results (see :func:`write_results`).

    ``sandbox=False`` (``--no-sandbox``) runs submissions without the OS sandbox; otherwise a class
    whose exercises run code is refused as a whole (:class:`LabError`) where this machine has none."""
    from dtrain_lab.grading import registry

    lang = lang or get_lang()
    folder = Path(folder)
    if not folder.is_dir():
        raise LabError("class_not_folder", folder=str(folder))
    jobs = max(1, int(jobs))
    lab = lab_of(lab)
    t0 = time.monotonic()
    items = scan(folder, lang, lab)
    if sandbox is not False and any(registry.get(i).static_check is None for item in items for i in item.exercises):
        from dtrain_lab import caps

        if not caps.sandbox_probe().ok:
            raise LabError("class_no_sandbox", reason=caps.sandbox_probe().reason)
    root = Path(tempfile.mkdtemp(prefix="dtrain-class-"))
    os.chmod(root, 0o700)
    try:
        _snapshot(items, root, sandbox)
        interrupted = _run_workers([i for i in items if i.kind != "error" and i.exercises], jobs, lang, quiet)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return results(items, folder=str(folder), lab=lab, lang=lang, jobs=jobs, elapsed=time.monotonic() - t0,
                   interrupted=interrupted)


def results(items: list[Item], *, folder: str, lab: str | None, lang: str, jobs, elapsed: float,
            interrupted: bool) -> dict:
    """The class's results from its items' rows (error rows where a file could not be graded or was not
    reached), in the format of ``results.json``: the same for ``-j N`` and for a SLURM array."""
    from dtrain_lab.grading import registry

    for item in items:
        if item.kind == "error" and not item.rows:
            key, fields = item.error
            item.rows = [error_row(key, lang, **fields)]
        elif not item.rows:   # interrupted before it was graded
            item.rows = [error_row("class_interrupted", lang, exercise=i, max_score=registry.get(i).max_score,
                                    file=item.rel) for i in item.exercises]
        if lab:
            done = {r["exercise"] for r in item.rows}
            item.rows += [error_row("class_not_submitted", lang, exercise=e.id, max_score=e.max_score,
                                     title=e.title[lang], file=item.rel)
                          for e in registry.all_exercises() if e.lab == lab and e.id not in done and item.kind != "env"]
        item.rows.sort(key=lambda r: r["exercise"])
    return {"format": FORMAT, "folder": folder, "lab": lab, "lang": lang, "jobs": jobs,
            "elapsed": round(elapsed, 3), "interrupted": interrupted,
            "submissions": [{"student": i.student, "file": i.rel, "kind": i.kind, "elapsed": round(i.elapsed, 3),
                             "score": sum(r["score"] for r in i.rows), "max_score": sum(r["max_score"] for r in i.rows),
                             "verdicts": i.rows} for i in items]}


def _run_workers(pending: list[Item], jobs: int, lang: str, quiet: bool) -> bool:
    """Grade ``pending``, at most ``jobs`` workers at a time; True if interrupted (Ctrl-C)."""
    from dtrain_lab.grading import registry

    reaper = Reaper()
    running: list[tuple[Item, subprocess.Popen, float, float, object]] = []
    try:
        while pending or running:
            while pending and len(running) < jobs:
                item = pending.pop(0)
                log = open(item.private / "worker.log", "wb")
                cmd = [sys.executable, "-m", "dtrain_lab.grading.classrun", "--worker", str(item.private)]
                proc = subprocess.Popen(cmd + ([] if quiet else ["--verbose"]), stdin=subprocess.DEVNULL,
                                        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                        env={**os.environ, "DTRAIN_LANG": lang})
                now = time.monotonic()
                running.append((item, proc, now, now + budget(item.exercises), log))
            time.sleep(0.1)
            reaper.orphans(keep={proc.pid for _, proc, *_ in running})
            for entry in list(running):
                item, proc, started, deadline, log = entry
                if proc.poll() is None and time.monotonic() < deadline:
                    continue
                timed_out = proc.poll() is None
                _kill_group(proc)   # whatever the worker left in its group goes with it
                log.close()
                item.elapsed = time.monotonic() - started
                if timed_out:
                    item.rows = [error_row("class_worker_timeout", lang, exercise=i, max_score=registry.get(i).max_score,
                                           file=item.rel, limit=deadline - started) for i in item.exercises]
                else:
                    item.rows = _checked_rows(item, lang)
                running.remove(entry)
        return False
    except KeyboardInterrupt:
        for _item, proc, _, _, log in running:
            _kill_group(proc)
            log.close()
        return True
    finally:
        reaper.close()


class Reaper:
    """Nothing a grade starts may outlive the class run, not even a double-forked ``setsid`` daemon
    the sandbox did not catch: this process becomes a *child subreaper* (Linux ``prctl
    PR_SET_CHILD_SUBREAPER``), so orphans of the workers' descendants are re-parented to it instead
    of to init, and are killed (with what they started) as soon as they show up and at the end.
    Processes that were already this process's children are left alone."""

    def __init__(self):
        import psutil

        self.me = psutil.Process()
        self.before = {c.pid for c in self.me.children()}
        self.previous = _subreaper(True)

    def orphans(self, keep: set) -> None:
        import psutil

        try:
            strays = [c for c in self.me.children() if c.pid not in keep and c.pid not in self.before]
        except psutil.Error:
            return
        victims = []
        for c in strays:
            try:
                victims += c.children(recursive=True) + [c]
            except psutil.Error:
                victims.append(c)
        for v in victims:
            try:
                v.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(victims, timeout=5)

    def close(self) -> None:
        self.orphans(keep=set())
        if self.previous is not None:
            _subreaper(self.previous)


def _subreaper(on: bool) -> bool | None:
    """Set PR_SET_CHILD_SUBREAPER (36); return the previous setting (PR_GET, 37), None off Linux."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    old = ctypes.c_int(0)
    if libc.prctl(37, ctypes.byref(old), 0, 0, 0) != 0 or libc.prctl(36, int(on), 0, 0, 0) != 0:
        return None
    return bool(old.value)


def worker(private: Path, verbose: bool = False) -> int:
    """One submission, in its own process: grade each exercise of ``job.json``, write ``result.json``."""
    from dtrain_lab.grading import grade, registry, submissions_in_notebook

    lang = get_lang()
    job = json.loads((private / "job.json").read_text())
    file = private / job["file"]
    work = private / "work"
    work.mkdir(mode=0o700)
    sources = submissions_in_notebook(file) if job["kind"] == "notebook" else {}
    rows = []
    for ex_id in job["exercises"]:
        ex = registry.get(ex_id)
        try:
            if job["kind"] == "notebook":
                path = work / ex.filename
                path.write_text(sources[ex_id], encoding="utf-8")
            else:
                path = file
            v = grade(ex_id, path, lang=lang, quiet=not verbose, sandbox=job.get("sandbox"))
            rows.append(v.to_json())
        except Exception as exc:  # noqa: BLE001 - one exercise's failure never costs the others
            rows.append(error_row("class_worker_failed", lang, exercise=ex_id, max_score=ex.max_score,
                                   file=job["rel"], why=f"{type(exc).__name__}: {exc}"[:400]))
    write_atomic(private / "result.json", json.dumps(rows, ensure_ascii=False))
    return 0


def parse(argv: list[str]):
    """``dtrain-lab grade FOLDER ...``'s options, checked: ``(args, folder, out, lang)``."""
    import argparse

    ap = argparse.ArgumentParser(prog="dtrain-lab grade", description=tr("class_help"))
    ap.add_argument("folder")
    ap.add_argument("-j", "--jobs", type=int, default=2, help="submissions graded at the same time (default 2)")
    ap.add_argument("--lab", help="only this lab's exercises; every one gets a row (10, lab10, lab_10_deadlocks)")
    ap.add_argument("--out", help="folder for results.json and gradebook.csv (default: FOLDER_grades next to FOLDER)")
    ap.add_argument("--json", action="store_true", help="also print the results as JSON")
    ap.add_argument("--gradescope", metavar="OUT", help="refused for a class: see dtrain-lab autograder build")
    ap.add_argument("--lang", choices=("zh", "en"))
    ap.add_argument("--verbose", action="store_true", help="show every rank's output while grading")
    ap.add_argument("--no-sandbox", action="store_true",
                    help="run submissions without the OS sandbox (only for code you trust: your own)")
    sl = ap.add_argument_group("SLURM", "grade as a SLURM job array (OUT must be on a file system every node sees)")
    sl.add_argument("--slurm", action="store_true", help="submit one array task per submission (or per --chunk)")
    sl.add_argument("--partition", help="SLURM partition for the array and the merge job")
    sl.add_argument("--max-concurrent", type=int, help="at most this many array tasks at once (--array=...%%K)")
    sl.add_argument("--chunk", type=int, default=1, help="submissions per array task (default 1)")
    sl.add_argument("--sbatch", action="append", default=[], metavar="OPTION",
                    help="one more sbatch option for the array tasks, e.g. --sbatch=--gpus-per-task=1 (repeatable)")
    sl.add_argument("--wait", action="store_true", help="wait for the merge, showing progress")
    sl.add_argument("--status", action="store_true", help="show progress of the last --slurm run and exit")
    args = ap.parse_args(argv)
    lang = args.lang or get_lang()
    folder = Path(args.folder)
    if not folder.is_dir():
        raise LabError("class_not_folder", folder=str(folder))
    out = Path(args.out) if args.out else folder.resolve().parent / f"{folder.resolve().name}_grades"
    if out.resolve() == folder.resolve() or folder.resolve() in out.resolve().parents:
        raise LabError("class_out_inside", out=str(out), folder=str(folder))
    if args.jobs < 1:
        raise LabError("class_bad_jobs", jobs=args.jobs)
    return args, folder, out, lang


def main(argv: list[str] | None = None) -> int:
    """``dtrain-lab grade FOLDER [-j N] [--lab LAB] [--out DIR] [--json] [--gradescope OUT]`` (``--slurm``:
    :mod:`dtrain_lab.grading.slurm`)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--worker"]:
        return worker(Path(argv[1]), verbose="--verbose" in argv)
    args, folder, out, lang = parse(argv)
    if args.slurm or args.status:
        raise LabError("slurm_use_cli")   # dtrain_lab.cli hands --slurm to dtrain_lab.grading.slurm
    if args.gradescope:
        n = sum(1 for item in scan(folder, lang, lab_of(args.lab)) if item.kind != "error")
        if n != 1:
            raise LabError("class_gradescope_many", n=n)
    results = run_class(folder, jobs=args.jobs, lang=lang, lab=args.lab, quiet=not args.verbose,
                        sandbox=False if args.no_sandbox else None)
    json_path, csv_path = write_results(results, out)
    if args.gradescope:
        sub = next(s for s in results["submissions"] if s["kind"] != "error")
        write_atomic(args.gradescope, json.dumps(gradescope_json(sub["verdicts"], lang=lang, file=sub["file"]),
                                                 ensure_ascii=False, indent=2))
    if args.json:
        print(json.dumps(results, ensure_ascii=False, indent=2))
    else:
        for sub in results["submissions"]:
            print(f"{sub['student']:<24} {sub['file']:<40} {sub['score']:g}/{sub['max_score']:g}")
            for r in sub["verdicts"]:
                if r["outcome"] == "error" and not r["exercise"]:
                    print(f"    {r['feedback']}")
    rows = [r for s in results["submissions"] for r in s["verdicts"]]
    print(tr("class_summary", lang, n=len(results["submissions"]),
             students=len({s["student"] for s in results["submissions"]}), elapsed=results["elapsed"],
             jobs=results["jobs"], passed=sum(r["passed"] for r in rows), total=len(rows),
             json=str(json_path), csv=str(csv_path)), file=sys.stderr)
    return 130 if results["interrupted"] else 0


if __name__ == "__main__":
    sys.exit(main())
