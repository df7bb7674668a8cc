"""Grading a class as a SLURM job array: ``dtrain-lab grade FOLDER --slurm``.

    dtrain-lab grade submissions/ --slurm --partition cpu --max-concurrent 16 --wait
    dtrain-lab grade submissions/ --slurm --status          # tasks graded, running, pending
    dtrain-lab grade submissions/ --slurm                   # again: grades only what is missing or failed

The files are read and classified exactly as for ``-j N`` (:func:`dtrain_lab.grading.classrun.scan`).
Each gradable file is copied into a private folder (mode 0700) under ``OUT/.slurm/``, which must be on a
file system every node sees (so must this Python environment). One array task grades ``--chunk``
submissions (default 1), each by the same worker process and in the same sandbox as ``-j N``, with the
same per-submission budget; the task writes each submission's checked rows (``rows.json``) atomically.

A dependent job (``--dependency=afterany``) merges when every task has ended, whatever its end:
``results.json`` and ``gradebook.csv`` are written atomically into ``OUT``, in the same format and with
the same rows as ``-j N``. A submission whose task died (node failure, time limit, cancelled) has no
``rows.json``: it becomes an error row that says so, with SLURM's state of the task where SLURM still
knows it, never a missing student. ``--wait`` waits for the merge and shows progress meanwhile.

Run again on the same ``FOLDER`` and ``OUT``: a submission whose file is unchanged and whose rows are
final keeps them; a new or changed file, one without rows (its task died) and one whose grading itself
failed (the worker failed or ran out of time) are graded again. Each submission has one folder and one
``rows.json``, replaced whole, so a row is never written twice. A second run while the first one's jobs
are still queued is refused.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

from dtrain_lab.grading import classrun
from dtrain_lab.grading.gradebook import error_row, write_atomic, write_results
from dtrain_lab.i18n import LabError, tr

STATE = ".slurm"
STATE_FORMAT = "dtrain-lab/slurm-class/1"
# rows made by the grading machinery, not by the submission: a run again grades these files again
RETRY_KEYS = ("class_worker_failed", "class_worker_timeout", "class_task_died", "class_interrupted")
MERGE_TIME = "00:15:00"


# ------------------------------------------------------------------------------------------ SLURM itself
def _slurm(*cmd: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout)


def check_slurm(partition: str | None) -> None:
    """A clear error (both languages) where SLURM's commands are missing or ``partition`` does not exist."""
    missing = [c for c in ("sbatch", "squeue", "sinfo") if shutil.which(c) is None]
    if missing:
        raise LabError("slurm_missing", commands=", ".join(missing))
    if partition is not None:
        r = _slurm("sinfo", "-h", "-o", "%R")
        known = sorted({p.strip() for p in r.stdout.split() if p.strip()})
        if r.returncode != 0:
            raise LabError("slurm_unreachable", why=(r.stderr or r.stdout).strip()[-300:])
        if partition not in known:
            raise LabError("slurm_no_partition", partition=partition, known=", ".join(known) or "-")


def queued(job_ids: list[str]) -> dict[str, int]:
    """How many tasks of ``job_ids`` SLURM lists in each state (``{"RUNNING": 2, "PENDING": 5}``)."""
    ids = [j for j in job_ids if j]
    if not ids:
        return {}
    r = _slurm("squeue", "-h", "-r", "-j", ",".join(ids), "-o", "%T")
    counts: dict[str, int] = {}
    if r.returncode == 0:
        for state in r.stdout.split():
            counts[state] = counts.get(state, 0) + 1
    return counts


def task_state(job_id: str) -> str | None:
    """SLURM's state of one job or array task (``123_4``) while it still knows it, else None."""
    r = _slurm("scontrol", "show", "job", "-o", job_id)
    for tok in r.stdout.split():
        if tok.startswith("JobState="):
            return tok.split("=", 1)[1]
    return None


def _not_in_the_sandbox(state: Path) -> None:
    """The submissions' copies must lie where no sandbox sees them. ``-j N`` keeps them in a private
    temporary folder; here they are under ``OUT``, which must therefore not lie inside a folder every
    rank's sandbox binds read-only (Python, the environment, the package: ``bwrap._python_paths``)."""
    from dtrain_lab.sandbox import bwrap

    where = os.path.realpath(state)
    for p in bwrap._python_paths():
        real = os.path.realpath(p).rstrip("/") + "/"
        if (where + "/").startswith(real):
            raise LabError("slurm_out_visible", out=str(state.parent), inside=p)


# ------------------------------------------------------------------------------------------ the state folder
def _key(item: classrun.Item, data: bytes, sandbox) -> str:
    h = hashlib.sha256(data)
    h.update(json.dumps([item.kind, item.exercises, sandbox]).encode())
    return h.hexdigest()


def _load(state: Path) -> dict:
    try:
        doc = json.loads((state / "class.json").read_text(encoding="utf-8"))
        return doc if doc.get("format") == STATE_FORMAT else {}
    except (OSError, ValueError):
        return {}


def _rows_file(state: Path, name: str) -> dict | None:
    try:
        doc = json.loads((state / name / "rows.json").read_text(encoding="utf-8"))
        return doc if isinstance(doc, dict) and isinstance(doc.get("rows"), list) else None
    except (OSError, ValueError):
        return None


def _final(doc: dict | None) -> bool:
    """Rows that a run again keeps: they exist and none was made by a failure of the grading itself."""
    return doc is not None and not doc.get("retry")


def _item(entry: dict, state: Path) -> classrun.Item:
    item = classrun.Item(rel=entry["rel"], student=entry["student"], kind=entry["kind"],
                         exercises=list(entry["exercises"]))
    if entry.get("error_row"):   # a file that could not be graded: its row, made when the folder was read
        item.rows = [entry["error_row"]]
    if entry.get("dir"):
        item.private = state / entry["dir"]
    return item


# ------------------------------------------------------------------------------------------ submitting
def submit(folder: str | os.PathLike, out: str | os.PathLike, *, lang: str, lab: str | None = None,
           partition: str | None = None, max_concurrent: int | None = None, chunk: int = 1,
           sandbox: bool | None = None, python: str | None = None, sbatch: list[str] = ()) -> dict:
    """Prepare ``OUT/.slurm`` and submit the array and its merge job; returns the state document."""
    from dtrain_lab.grading import registry

    folder, out = Path(folder), Path(out)
    if chunk < 1:
        raise LabError("class_bad_jobs", jobs=chunk)
    if max_concurrent is not None and max_concurrent < 1:
        raise LabError("class_bad_jobs", jobs=max_concurrent)
    if any("\n" in opt or "\r" in opt or not opt.startswith("-") for opt in sbatch):
        why = f"--sbatch takes one option per use, each starting with '-': {list(sbatch)!r}"
        raise LabError("slurm_submit_failed", why=why[:400])
    check_slurm(partition)
    lab = classrun.lab_of(lab)
    state = out / STATE
    _not_in_the_sandbox(state)
    state.mkdir(parents=True, exist_ok=True)
    os.chmod(state, 0o700)
    previous = _load(state)
    busy = queued([j for s in previous.get("submits", []) for j in (s.get("array"), s.get("merge"))])
    if busy:
        raise LabError("slurm_still_running", state=str(state), queued=sum(busy.values()))
    items = classrun.scan(folder, lang, lab)
    if sandbox is not False and any(registry.get(i).static_check is None for item in items for i in item.exercises):
        from dtrain_lab import caps

        if not caps.sandbox_probe().ok:
            raise LabError("class_no_sandbox", reason=caps.sandbox_probe().reason)
    old = {e["rel"]: e for e in previous.get("items", [])}
    used = {e["dir"] for e in old.values() if e.get("dir")}
    entries, todo, kept = [], [], 0
    for item in items:
        entry = {"rel": item.rel, "student": item.student, "kind": item.kind, "exercises": item.exercises,
                 "error_row": error_row(item.error[0], lang, **item.error[1]) if item.error else None,
                 "dir": None, "key": None}
        entries.append(entry)
        if item.kind == "error" or not item.exercises:
            continue
        entry["key"] = _key(item, item.data, sandbox)
        before = old.get(item.rel)
        if before and before.get("dir"):
            entry["dir"] = before["dir"]
            if before.get("key") == entry["key"] and _final(_rows_file(state, before["dir"])):
                kept += 1
                item.data = None
                continue
        else:
            n = 0
            while f"s{n:05d}" in used:
                n += 1
            entry["dir"] = f"s{n:05d}"
            used.add(entry["dir"])
        _prepare(state / entry["dir"], item, sandbox)
        todo.append(entry["dir"])
    doc = {"format": STATE_FORMAT, "folder": str(folder), "out": str(out), "lab": lab, "lang": lang,
           "items": entries, "submits": previous.get("submits", []), "started": time.time()}
    submit_rec = {"todo": todo, "kept": kept, "array": None, "merge": None, "chunk": chunk}
    py = python or sys.executable
    logs = state / "logs"
    logs.mkdir(exist_ok=True)
    dependency = []
    if todo:
        n = len(doc["submits"])
        batch = state / f"batch-{n}.txt"
        chunks = [todo[i:i + chunk] for i in range(0, len(todo), chunk)]
        write_atomic(batch, "\n".join(" ".join(c) for c in chunks) + "\n")
        by_dir = {e["dir"]: e for e in entries}
        seconds = max(sum(classrun.budget(by_dir[d]["exercises"]) for d in c) for c in chunks)
        array = f"0-{len(chunks) - 1}" + (f"%{max_concurrent}" if max_concurrent else "")
        script = "\n".join([
            "#!/bin/bash",
            "#SBATCH --job-name=dtrain-grade",
            f"#SBATCH --array={array}",
            "#SBATCH --ntasks=1",
            "#SBATCH --cpus-per-task=2",
            f"#SBATCH --time={math.ceil(seconds / 60) + 2}",
            f"#SBATCH --output={logs}/%A_%a.out",
            *([f"#SBATCH --partition={partition}"] if partition else []),
            *(f"#SBATCH {opt}" for opt in sbatch),
            "# Written by `dtrain-lab grade FOLDER --slurm`: one task grades one line of the batch file.",
            f"exec {shlex.quote(py)} -m dtrain_lab.grading.slurm task {shlex.quote(str(state))} {shlex.quote(batch.name)}",
        ]) + "\n"
        write_atomic(state / f"array-{n}.sbatch", script)
        r = _slurm("sbatch", "--parsable", str(state / f"array-{n}.sbatch"))
        if r.returncode != 0:
            raise LabError("slurm_submit_failed", why=(r.stderr or r.stdout).strip()[-400:])
        submit_rec["array"] = r.stdout.strip().split(";")[0]
        submit_rec["batch"] = batch.name
        submit_rec["tasks"] = len(chunks)
        dependency = [f"--dependency=afterany:{submit_rec['array']}"]
    doc["submits"].append(submit_rec)
    write_atomic(state / "class.json", json.dumps(doc, ensure_ascii=False, indent=1))
    merge_cmd = f"{shlex.quote(py)} -m dtrain_lab.grading.slurm merge {shlex.quote(str(state))}"
    r = _slurm("sbatch", "--parsable", "--job-name=dtrain-grade-merge", f"--time={MERGE_TIME}",
               f"--output={logs}/merge-%j.out", *dependency,
               *([f"--partition={partition}"] if partition else []), "--wrap", merge_cmd)
    if r.returncode != 0:
        raise LabError("slurm_submit_failed", why=(r.stderr or r.stdout).strip()[-400:])
    submit_rec["merge"] = r.stdout.strip().split(";")[0]
    write_atomic(state / "class.json", json.dumps(doc, ensure_ascii=False, indent=1))
    return doc


def _prepare(private: Path, item: classrun.Item, sandbox) -> None:
    """A fresh private folder for one submission, as ``-j N`` makes it (:func:`classrun.copy_in`)."""
    if private.exists():
        shutil.rmtree(private)
    classrun.copy_in(private, item, sandbox)


# ------------------------------------------------------------------------------------------ one array task
def task(state: Path, batch: str) -> int:
    """Grade this task's line of ``batch`` (``SLURM_ARRAY_TASK_ID``), each submission as ``-j`` would."""
    doc = _load(state)
    lang = doc["lang"]
    index = int(os.environ["SLURM_ARRAY_TASK_ID"])
    names = (state / batch).read_text().splitlines()[index].split()
    by_dir = {e["dir"]: e for e in doc["items"] if e.get("dir")}
    items = [_item(by_dir[name], state) for name in names]
    for item in items:   # what an earlier, killed attempt of this task left
        for leftover in ("work", "result.json", "rows.json", "worker.log"):
            p = item.private / leftover
            shutil.rmtree(p) if p.is_dir() else p.unlink(missing_ok=True)
    classrun._run_workers(list(items), 1, lang, quiet=True)   # (it takes items off the list it is given)
    for item in items:
        # the grading failed, or this node could not build the sandbox: not the submission's doing
        retry = any(r.get("outcome") == "error" and (r.get("details", {}).get("key") in RETRY_KEYS
                                                     or r.get("details", {}).get("refused")) for r in item.rows)
        write_atomic(item.private / "rows.json", json.dumps({"rows": item.rows, "elapsed": round(item.elapsed, 3),
                                                             "retry": retry}, ensure_ascii=False))
        print(f"{item.rel}: {sum(r['score'] for r in item.rows):g}/{sum(r['max_score'] for r in item.rows):g}",
              flush=True)
    return 0


# ------------------------------------------------------------------------------------------ merging
def merge(state: Path) -> dict:
    """``results.json`` and ``gradebook.csv`` in ``OUT`` from every submission's rows; a submission
    without rows gets an error row that says its task died."""
    from dtrain_lab.grading import registry

    doc = _load(state)
    lang, lab = doc["lang"], doc["lab"]
    task_of = {}
    for s in doc["submits"]:
        if s.get("array"):
            lines = (state / s["batch"]).read_text().splitlines()
            for i, line in enumerate(lines):
                for name in line.split():
                    task_of[name] = f"{s['array']}_{i}"
    items = []
    for entry in doc["items"]:
        item = _item(entry, state)
        items.append(item)
        if item.kind == "error" or not item.exercises:
            continue
        rows = _rows_file(state, entry["dir"])
        if rows is not None:
            item.rows, item.elapsed = rows["rows"], float(rows.get("elapsed", 0.0))
            continue
        job = task_of.get(entry["dir"], "-")
        how = task_state(job) if job != "-" else None
        log = classrun._tail(state / "logs" / f"{job}.out") if job != "-" else ""
        item.rows = [error_row("class_task_died", lang, exercise=i, max_score=registry.get(i).max_score,
                               file=item.rel, task=job, state=how or tr("slurm_state_unknown", lang),
                               why=log or "-") for i in item.exercises]
    results = classrun.results(items, folder=doc["folder"], lab=lab, lang=lang, jobs="slurm",
                               elapsed=time.time() - doc.get("started", time.time()), interrupted=False)
    write_results(results, doc["out"])
    return results


def progress(state: Path) -> dict:
    """Submissions of the latest submit graded so far, and its tasks running and pending in SLURM."""
    doc = _load(state)
    if not doc.get("submits"):
        return {}
    last = doc["submits"][-1]
    done = sum(1 for d in last["todo"] if _rows_file(state, d) is not None)
    counts = queued([last.get("array")])
    merged = not queued([last.get("merge")])
    return {"graded": done, "total": len(last["todo"]), "kept": last.get("kept", 0),
            "running": counts.get("RUNNING", 0) + counts.get("COMPLETING", 0), "pending": counts.get("PENDING", 0),
            "array": last.get("array"), "merge": last.get("merge"), "merged": merged}


def show_progress(p: dict, lang: str) -> str:
    return tr("slurm_progress", lang, graded=p["graded"], total=p["total"], kept=p["kept"], running=p["running"],
              pending=p["pending"])


def wait(state: Path, lang: str, poll: float = 2.0, timeout: float | None = None, out=sys.stderr) -> dict:
    """Until the merge job has left the queue, printing progress when it changes."""
    deadline = None if timeout is None else time.monotonic() + timeout
    last = None
    while True:
        p = progress(state)
        line = show_progress(p, lang)
        if line != last:
            print(line, file=out, flush=True)
            last = line
        if p.get("merged"):
            return p
        if deadline is not None and time.monotonic() > deadline:
            raise LabError("slurm_wait_timeout", seconds=timeout, state=str(state))
        time.sleep(poll)


def cli(argv: list[str]) -> int:
    """``dtrain-lab grade FOLDER --slurm [--partition P] [--max-concurrent K] [--chunk N] [--wait]``, ``--status``."""
    args, folder, out, lang = classrun.parse(argv)
    state = out / STATE
    if args.status:
        p = progress(state)
        if not p:
            raise LabError("slurm_no_state", out=str(out))
        print(show_progress(p, lang))
        if p["merged"] and (out / "results.json").exists():
            print(tr("slurm_merged", lang, json=str(out / "results.json"), csv=str(out / "gradebook.csv")))
        return 0
    doc = submit(folder, out, lang=lang, lab=args.lab, partition=args.partition,
                       max_concurrent=args.max_concurrent, chunk=args.chunk, sbatch=args.sbatch,
                       sandbox=False if args.no_sandbox else None)
    last = doc["submits"][-1]
    print(tr("slurm_submitted", lang, todo=len(last["todo"]), kept=last["kept"], tasks=last.get("tasks", 0),
             array=last["array"] or "-", merge=last["merge"], state=str(state)))
    if not args.wait:
        print(tr("slurm_watch", lang, cmd=f"dtrain-lab grade {shlex.quote(str(folder))} --slurm --status"
                                          + (f" --out {shlex.quote(str(out))}" if args.out else "")))
        return 0
    wait(state, lang)
    if not (out / "results.json").exists():
        raise LabError("slurm_merge_failed", log=str(state / "logs" / f"merge-{last['merge']}.out"))
    results = json.loads((out / "results.json").read_text(encoding="utf-8"))
    rows = [r for s in results["submissions"] for r in s["verdicts"]]
    print(tr("slurm_summary", lang, n=len(results["submissions"]), passed=sum(r["passed"] for r in rows),
             total=len(rows), json=str(out / "results.json"), csv=str(out / "gradebook.csv")))
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["task"]:
        return task(Path(argv[1]), argv[2])
    if argv[:1] == ["merge"]:
        merge(Path(argv[1]))
        return 0
    return cli(argv)


if __name__ == "__main__":
    sys.exit(main())
