"""A class's results on disk: ``results.json`` and ``gradebook.csv``, each written atomically.

Atomic: a temporary file in the same folder, ``fsync``, ``os.replace`` over the old file, ``fsync``
of the folder; a reader (or a crash) sees the old file or the whole new one, never half of one.
The CSV is safe to open in a spreadsheet, whatever its list separator: every cell is quoted, and a
cell that would start a formula (a file named ``=HYPERLINK(…).ipynb``), or that holds a separator
followed by what would start one (a folder named ``alice;=1+2``, where ``;`` separates cells), is
written as text.
"""
from __future__ import annotations

import csv
import io
import json
import os
import re
import tempfile
from pathlib import Path

from dtrain_lab.i18n import LabError, rendered, tr

COLUMNS = ("student", "file", "exercise", "score", "max_score", "outcome")
OUTPUT_LIMIT = 64 * 1024            # Gradescope: bytes of UTF-8 per test output and for the top-level output


def error_row(key: str, lang: str, *, exercise: str = "", max_score: int = 0, **fields) -> dict:
    """A verdict (as a dict) for what could not be graded, the reason in both languages in details."""
    return {"exercise": exercise, "passed": False, "score": 0.0, "max_score": max_score, "outcome": "error",
            "feedback": tr(key, lang, **fields), "lang": lang, "details": {"reason": rendered(key, **fields), "key": key},
            "elapsed": 0.0}


FORMULA_START = ("=", "+", "-", "@", "\t", "\r", "\n", "|", "%")
# a formula can start the cell, or start after any character a spreadsheet may split cells at
_FORMULA_AT = re.compile(r'(^|[,;\t|"])([ "]*)(?=[=+\-@|%])')


def csv_cell(value) -> str:
    """A CSV cell a spreadsheet shows as text: a file named ``=HYPERLINK(…)`` is not a formula, nor is
    any piece of it that a spreadsheet splitting on ``,``, ``;``, tab or ``|`` would read as a cell
    (``alice;=1+2`` becomes ``alice;'=1+2``). Line breaks become spaces: one record is one line."""
    text = re.sub(r"[\r\n]", " ", str(value))
    if text[:1] == "\t":   # a cell starting with a tab is read as a formula by some spreadsheets (OWASP)
        text = "'" + text
    return _FORMULA_AT.sub(lambda m: m.group(1) + m.group(2) + "'", text)


def gradebook_csv(results: dict) -> str:
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n", quoting=csv.QUOTE_ALL)
    w.writerow(COLUMNS)
    for sub in results["submissions"]:
        for r in sub["verdicts"]:
            w.writerow([csv_cell(sub["student"]), csv_cell(sub["file"]), r["exercise"], f"{r['score']:g}",
                        r["max_score"], r["outcome"]])
    return out.getvalue()


def write_atomic(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` so that ``path`` holds either the old or the whole new content, even on a crash."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dfd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def write_results(results: dict, out: str | os.PathLike) -> tuple[Path, Path]:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    json_path, csv_path = out / "results.json", out / "gradebook.csv"
    write_atomic(json_path, json.dumps(results, ensure_ascii=False, indent=2))
    write_atomic(csv_path, gradebook_csv(results))
    return json_path, csv_path


def truncate(text: str, limit: int = OUTPUT_LIMIT) -> str:
    """At most ``limit`` bytes of UTF-8, cut on a character boundary, saying that it was cut."""
    data = text.encode("utf-8")
    if len(data) <= limit:
        return text
    note = f"\n… [{len(data) - limit} bytes cut]"
    return data[:limit - len(note.encode("utf-8"))].decode("utf-8", errors="ignore") + note


def gradescope_json(verdicts: list, *, lang: str, output: str = "", visibility: str = "visible",
                    execution_time: float | None = None, extra: dict | None = None, file: str | None = None,
                    notes: list | tuple = ()) -> dict:
    """Gradescope's results.json for ONE submission, from its verdicts (``Verdict`` or their dicts)."""
    from dtrain_lab.grading import registry

    tests = []
    for v in verdicts:
        d = v if isinstance(v, dict) else v.to_json()
        try:
            title = registry.get(d["exercise"]).title[lang]
        except (LabError, KeyError):
            title = ""
        name = f"{title} ({d['exercise']})" if title else (d["exercise"] or tr("ag_submission_test", lang))
        tests.append({"name": name, "score": float(d["score"]), "max_score": float(d["max_score"]),
                      "status": "passed" if d["passed"] else "failed", "output": truncate(d["feedback"]),
                      "visibility": visibility,
                      "extra_data": {"exercise": d["exercise"], "outcome": d["outcome"],
                                     "execution_time": round(float(d.get("elapsed") or 0.0), 3)}})
    total = sum(t["extra_data"]["execution_time"] for t in tests)
    result = {"score": sum(t["score"] for t in tests),
              "execution_time": int(round(execution_time if execution_time is not None else total)),
              "output": truncate("\n".join([output or tr("ag_output", lang, score=sum(t["score"] for t in tests),
                                                         max_score=sum(t["max_score"] for t in tests), file=file or "-"),
                                             *notes])),
              "visibility": visibility, "stdout_visibility": "hidden", "tests": tests}
    if extra:
        result["extra_data"] = extra
    return result
