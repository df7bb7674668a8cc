"""A Gradescope autograder per lab: ``dtrain-lab autograder build LAB --out FILE.zip``.

    dtrain-lab autograder build lab10 --out lab10_autograder.zip          # LAB: lab10, 10 or lab_10_deadlocks
    dtrain-lab autograder build 11 --exercise lab11.roce --out roce.zip    # one .env exercise per assignment
    dtrain-lab autograder build --help                                     # lists the labs

The zip holds, at its root, what Gradescope's specification asks for
(gradescope-autograders.readthedocs.io/en/latest/specs/) and what they need:

* ``setup.sh``: run once, as root, when Gradescope builds the image; installs the course wheel with
  its pinned dependencies into ``/opt/dtrain-lab/venv`` (torch's CPU build from
  https://download.pytorch.org/whl/cpu) and creates the unprivileged user submissions run as;
* ``run_autograder``: run as root for every submission; calls ``python -m
  dtrain_lab.grading.autograder run`` and, should that fail, still leaves a valid score-0 results.json;
* ``autograder.json`` (the lab, its exercises, the language, the visibility), ``wheels/`` (the course
  as a wheel, built from this checkout with ``pip wheel --no-deps``) and ``hidden/`` (instructor
  hidden-check modules, ``--hidden-checks FILE.py``, imported in the root grader process only).

A submission is one ``.ipynb`` (lab 11 also: one ``.env``). None, several or a malformed one gives
an error row, score 0 and still a valid results.json. Each configured exercise gets a test row:
``name``, ``score``, ``max_score``, ``status``, ``output`` (at most 64 KiB), ``visibility``;
per-test time is not a field of Gradescope's test objects, so it goes in ``extra_data.execution_time``,
and the whole run's in the top-level ``execution_time``. results.json is rewritten (atomically)
after each exercise, so a grader stopped half-way still reports what it graded.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from dtrain_lab import caps
from dtrain_lab.grading.gradebook import gradescope_json, write_atomic
from dtrain_lab.grading.intake import ROOT, lab_exercises, labs, resolve_lab
from dtrain_lab.i18n import LANGS, LabError, both, get_lang, tr

CPU_TORCH_INDEX = "https://download.pytorch.org/whl/cpu"
VISIBILITIES = ("visible", "after_due_date", "after_published", "hidden")
MODE_NOTE = {"unsandboxed": "ag_mode_unsandboxed", "refused": "ag_mode_refused"}
FILES = Path(__file__).resolve().parent / "autograder_files"


# --- build ------------------------------------------------------------------------------------------

def _pins(wheel: Path) -> dict[str, str]:
    """``{"torch": "2.13.0", "deepspeed": "0.19.8"}``: the exact pins in the wheel's metadata."""
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        text = z.read(meta).decode("utf-8")
    return dict(re.findall(r"^Requires-Dist: ([A-Za-z0-9_.-]+)==([^\s;]+)\s*$", text, re.M))


def build_wheel(dest: Path) -> Path:
    """The course as a wheel, built from a copy of this checkout (nothing is written into it)."""
    if not (ROOT / "pyproject.toml").is_file():
        raise LabError("ag_no_checkout", root=str(ROOT))
    with tempfile.TemporaryDirectory(prefix="dtrain-wheel-") as tmp:
        src = Path(tmp) / "src"
        src.mkdir()
        for name in ("pyproject.toml", "README.md", "LICENSE"):
            if (ROOT / name).exists():
                shutil.copy2(ROOT / name, src / name)
        shutil.copytree(ROOT / "dtrain_lab", src / "dtrain_lab",
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "autograder_files"))
        cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(dest), str(src)]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        wheels = sorted(dest.glob("dtrain_lab-*.whl"))
        if r.returncode != 0 or not wheels:
            raise LabError("ag_wheel_failed", why=(r.stderr or r.stdout).strip()[-1500:])
        return wheels[-1]


def build(lab: str, out: str | os.PathLike, *, exercises: list[str] | None = None, lang: str | None = None,
          visibility: str = "visible", hidden_checks: list[str] = (), allow_unsandboxed: bool = False,
          wheel: str | os.PathLike | None = None) -> Path:
    """Write the autograder zip of ``lab`` to ``out``; returns its path. ``wheel``: a course wheel
    built before (by default one is built from this checkout)."""
    lang = lang or get_lang()
    lab = resolve_lab(lab)
    ids = lab_exercises(lab, exercises)
    if visibility not in VISIBILITIES:
        raise LabError("ag_bad_visibility", value=visibility, known=", ".join(VISIBILITIES))
    out = Path(out)
    from dtrain_lab.grading import registry

    config = {"lab": lab, "name": labs()[lab], "exercises": ids, "lang": lang, "visibility": visibility,
              "hidden_checks": [Path(h).stem for h in hidden_checks],
              "allow_unsandboxed": bool(allow_unsandboxed),
              "max_score": sum(registry.get(i).max_score for i in ids)}
    with tempfile.TemporaryDirectory(prefix="dtrain-ag-") as tmp:
        wheel = Path(wheel) if wheel else build_wheel(Path(tmp))
        pins = _pins(wheel)
        failed = gradescope_json([], lang=lang, output=both("ag_internal_error", why="run_autograder"))
        fill = {"@LAB_NAME@": config["name"], "@TORCH_INDEX@": CPU_TORCH_INDEX,
                "@TORCH_VERSION@": pins["torch"], "@DEEPSPEED_VERSION@": pins["deepspeed"],
                "@FAILED_JSON@": json.dumps(failed, ensure_ascii=False)}
        out.parent.mkdir(parents=True, exist_ok=True)
        part = out.with_name(out.name + ".part")
        with zipfile.ZipFile(part, "w", zipfile.ZIP_DEFLATED) as z:
            for name in ("setup.sh", "run_autograder"):
                text = (FILES / name).read_text(encoding="utf-8")
                for key, value in fill.items():
                    text = text.replace(key, value)
                info = zipfile.ZipInfo(name, date_time=time.localtime()[:6])
                info.external_attr = 0o100755 << 16     # executable once unzipped
                info.compress_type = zipfile.ZIP_DEFLATED
                z.writestr(info, text)
            z.writestr("autograder.json", json.dumps(config, ensure_ascii=False, indent=2))
            z.write(wheel, f"wheels/{wheel.name}")
            for h in hidden_checks:
                z.write(h, f"hidden/{Path(h).name}")
        os.replace(part, out)
    return out


# --- run (inside Gradescope's container) ------------------------------------------------------------

def _files(folder: Path) -> list[Path]:
    found = []
    for dirpath, dirnames, filenames in os.walk(folder, followlinks=False):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and d != "__MACOSX")
        found += [Path(dirpath) / f for f in sorted(filenames) if not f.startswith(".")]
    return found


def _row(key: str, lang: str, *, exercise: str = "", max_score: int = 0, **fields) -> dict:
    from dtrain_lab.grading.gradebook import error_row

    return error_row(key, lang, exercise=exercise, max_score=max_score, **fields)


def grade_submission(root: Path, config: dict, write, how: dict | None = None) -> tuple[list[dict], str | None]:
    """Grade the one submission under ``root/submission``: (rows, its name). ``write(rows, name)`` is
    called after each exercise, so that a grader stopped half-way still reports what it graded."""
    from dtrain_lab.grading import grade, registry
    from dtrain_lab.grading.intake import (MAX_FILE_BYTES, match_file, notebook_exercises, read_regular, shown,
                                           without_bom)

    lang, ids = config["lang"], config["exercises"]
    static = [i for i in ids if registry.get(i).filename.endswith(".env")]
    kinds = (".ipynb", ".env") if static else (".ipynb",)
    kind_text = tr("ag_kind_env" if static else "ag_kind_notebook", lang)
    sub = root / "submission"
    files = _files(sub) if sub.is_dir() else []
    candidates = [f for f in files if f.suffix.lower() in kinds and not f.is_symlink()]
    extra = [_row("class_symlink" if f.is_symlink() else "class_loose_py" if f.suffix == ".py" else "class_unknown_file",
                  lang, file=shown(f, sub)) for f in files if f not in candidates]
    zero = [_row("ag_not_graded", lang, exercise=i, max_score=registry.get(i).max_score,
                 title=registry.get(i).title[lang]) for i in ids]
    if len(candidates) != 1:
        head = (_row("ag_no_submission", lang, kind=kind_text) if not candidates else
                _row("ag_several", lang, n=len(candidates), kind=kind_text,
                     names=", ".join(shown(f, sub) for f in candidates)))
        return [head] + extra + zero, None
    file = candidates[0]
    rel = shown(file, sub)
    try:
        data = read_regular(file, MAX_FILE_BYTES)
    except OSError as exc:
        return [_row("class_unreadable", lang, file=rel, why=exc.strerror or str(exc))] + extra + zero, rel
    if data is None:
        return [_row("class_unknown_file", lang, file=rel)] + extra + zero, rel
    if len(data) > MAX_FILE_BYTES:
        return [_row("class_too_large", lang, file=rel, size=file.lstat().st_size, limit=MAX_FILE_BYTES)] + extra + zero, rel
    data = without_bom(data)
    work = Path(tempfile.mkdtemp(prefix="dtrain-ag-"))
    try:
        if file.suffix.lower() == ".env":
            only = static if len(static) == 1 else [i for i in match_file(file.name, ".env") if i in static]
            if len(only) != 1:
                known = ", ".join(registry.get(i).filename for i in static)
                return [_row("class_unknown_env", lang, file=rel, known=known)] + extra + zero, rel
            todo = {only[0]: data}
        else:
            found, why = notebook_exercises(data)
            if found is None:
                return [_row("class_bad_notebook", lang, file=rel, why=why)] + extra + zero, rel
            from dtrain_lab.grading import submissions_in_notebook

            nb = work / "submission.ipynb"
            nb.write_bytes(data)
            sources = submissions_in_notebook(nb)
            todo = {i: sources[i].encode("utf-8") for i in ids if i in sources}
        rows = {i: r for i, r in zip(ids, zero)}
        for i in ids:
            if i not in todo:
                rows[i] = _row("class_not_submitted", lang, exercise=i, max_score=registry.get(i).max_score,
                               title=registry.get(i).title[lang], file=rel)
        for ex_id, body in todo.items():
            path = work / registry.get(ex_id).filename
            path.write_bytes(body)
            try:
                rows[ex_id] = grade(ex_id, path, lang=lang, **(how or {})).to_json()
            except Exception as exc:  # noqa: BLE001 - one exercise's failure never costs the others
                rows[ex_id] = _row("class_worker_failed", lang, exercise=ex_id, max_score=registry.get(ex_id).max_score,
                                   file=rel, why=f"{type(exc).__name__}: {exc}"[:400])
            write(list(rows.values()) + extra, rel)
        return list(rows.values()) + extra, rel
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run(root: str | os.PathLike) -> int:
    """``run_autograder``'s work: grade ``root/submission`` into ``root/results/results.json``.

    This process (root, in Gradescope's container) is the grader: it decides every verdict and is the
    only writer of results.json (its folder is root's alone). It makes itself a child subreaper, so
    that nothing the submission started outlives the grade, and writes the final results only after
    every such process is gone."""
    from dtrain_lab.grading.classrun import Reaper

    root = Path(root)
    t0 = time.monotonic()
    results = root / "results" / "results.json"
    (root / "results").mkdir(parents=True, exist_ok=True)
    config, lang = {}, get_lang()
    reaper = Reaper()
    try:
        config = json.loads((root / "source" / "autograder.json").read_text(encoding="utf-8"))
        lang = config.get("lang") if config.get("lang") in LANGS else lang
        _load_hidden_checks(root / "source" / "hidden", config.get("hidden_checks", []))
        import dtrain_lab

        mode, how = sandbox_mode(config.get("allow_unsandboxed", False), lang)
        extra = {"lab": config["lab"], "package": str(Path(dtrain_lab.__file__).parent),
                 "version": dtrain_lab.__version__, "sandbox": mode}
        notes = [tr(MODE_NOTE[mode["mode"]], lang, reason=mode["reason"])] if mode["mode"] in MODE_NOTE else []

        def write(rows, file=None):
            doc = gradescope_json(rows, lang=lang, visibility=config.get("visibility", "visible"),
                                  execution_time=time.monotonic() - t0, extra=extra, file=file, notes=notes)
            write_atomic(results, json.dumps(doc, ensure_ascii=False, indent=2))

        rows, file = grade_submission(root, config, write, how)
        reaper.close()          # every process of the grade is gone before the final write
        write(rows, file)
    except Exception as exc:  # noqa: BLE001 - Gradescope must always get a results.json
        reaper.close()
        doc = gradescope_json([], lang=lang, output=tr("ag_internal_error", lang, why=f"{type(exc).__name__}: {exc}"),
                              execution_time=time.monotonic() - t0)
        write_atomic(results, json.dumps(doc, ensure_ascii=False, indent=2))
        print(f"dtrain-lab autograder: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return 0


def sandbox_mode(allow_unsandboxed: bool = False, lang: str | None = None) -> tuple[dict, dict]:
    """How submissions are isolated in this container, and the ``grade()`` keywords for it:

    * ``namespaces``: the grader's bubblewrap sandbox works here (proven by starting one);
    * ``unsandboxed``: it does not (Docker's default seccomp profile forbids namespaces), and the zip
      was built with ``--allow-unsandboxed``: the code runs without namespaces, and every
      results.json says so. It still never runs as root: every job's ranks run as a uid of their own
      (:mod:`dtrain_lab.sandbox.runas`), which can neither signal this
      grader nor write its results folder (root's alone), and results.json is written by this
      process after every process of the submission is gone;
    * ``refused``: it does not, and the zip does not allow that, or the submission could not be kept
      from the grader's uid (this grader is not root, or what the ranks import is not readable by
      other users): launched exercises are not run (an ``error`` row says why); ``.env`` exercises,
      which are only read, are graded."""
    probe = caps.sandbox_probe()
    if probe.ok:
        return {"mode": "namespaces", "reason": ""}, {}
    if allow_unsandboxed:
        from dtrain_lab.sandbox import runas

        if os.geteuid() != 0:
            why = tr("ag_unsandboxed_needs_root", lang, uid=os.geteuid())
        else:
            bad = runas.unreachable_as(runas.fresh_uid())
            why = tr("ag_unsandboxed_unreadable", lang, path=bad) if bad else ""
        if not why:
            runas.run_unsandboxed_as_others()
            return {"mode": "unsandboxed", "reason": probe.reason}, {"sandbox": False}
        return {"mode": "refused", "reason": f"{probe.reason}; {why}"}, {}
    return {"mode": "refused", "reason": probe.reason}, {}


def _load_hidden_checks(folder: Path, names: list[str]) -> None:
    """Instructor checks: imported here, in the root grader process, never inside a sandbox."""
    import importlib

    if not names:
        return
    sys.path.insert(0, str(folder))
    try:
        for name in names:
            importlib.import_module(name)
    finally:
        sys.path.remove(str(folder))


# --- command line -----------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    import argparse

    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(prog="dtrain-lab autograder", description=tr("ag_help"))
    sub = ap.add_subparsers(dest="cmd", required=True)
    listing = "labs: " + ", ".join(f"{k[4:]} = {k} = {v}" for k, v in labs().items())
    b = sub.add_parser("build", help="write a Gradescope autograder zip for one lab", epilog=listing,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    b.add_argument("lab", metavar="LAB", help="lab10, 10 or lab_10_deadlocks (" + ", ".join(labs()) + ")")
    b.add_argument("--out", required=True, metavar="FILE.zip")
    b.add_argument("--exercise", action="append", metavar="ID", help="only these exercises (repeatable)")
    b.add_argument("--visibility", default="visible", choices=VISIBILITIES)
    b.add_argument("--hidden-checks", action="append", default=[], metavar="FILE.py",
                   help="instructor check module, imported in the root grader only (repeatable)")
    b.add_argument("--lang", choices=LANGS, help="language of the feedback (default: yours)")
    b.add_argument("--allow-unsandboxed", action="store_true",
                   help="where the container has no sandbox, run submissions anyway, unprotected (results say so)")
    r = sub.add_parser("run", help="inside Gradescope: grade $AUTOGRADER_ROOT/submission (run_autograder calls it)")
    r.add_argument("--root", default=os.environ.get("AUTOGRADER_ROOT", "/autograder"))
    args = ap.parse_args(argv)
    if args.cmd == "run":
        return run(args.root)
    for h in args.hidden_checks:
        if not Path(h).is_file() or Path(h).suffix != ".py":
            raise LabError("ag_bad_hidden", file=h)
    out = build(args.lab, args.out, exercises=args.exercise, lang=args.lang, visibility=args.visibility,
                hidden_checks=args.hidden_checks, allow_unsandboxed=args.allow_unsandboxed)
    with zipfile.ZipFile(out) as z:
        config = json.loads(z.read("autograder.json"))
    print(tr("ag_built", args.lang, out=str(out), lab=config["name"], n=len(config["exercises"]),
             points=config["max_score"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
