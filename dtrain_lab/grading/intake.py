"""What a handed-in file is, before anything of it runs: a notebook's graded cells, a lab 11 ``.env``
file's exercise, the lab a name like ``lab10`` means. Shared by the class run
(:mod:`~dtrain_lab.grading.classrun`) and the Gradescope autograder (:mod:`~dtrain_lab.grading.autograder`).

Files are read as bytes, at most :data:`MAX_FILE_BYTES`, and a UTF-8 byte-order mark at the start is
dropped (:func:`without_bom`): Windows editors write one, and a file is graded exactly as without it.
"""
from __future__ import annotations

import json
import re
import tempfile
from pathlib import Path

from dtrain_lab.i18n import LabError

MAX_FILE_BYTES = 20 * 1024 * 1024   # a lab notebook with its outputs is well under this
BOM = b"\xef\xbb\xbf"
ROOT = Path(__file__).resolve().parents[2]     # the checkout, when there is one


def without_bom(data: bytes) -> bytes:
    return data[len(BOM):] if data.startswith(BOM) else data


def read_regular(path: Path, limit: int) -> bytes | None:
    """At most ``limit + 1`` bytes of ``path``, or None when it is not a regular file (a named pipe
    would block the reader forever, a device never ends). Opened without following a link and
    without blocking, then checked on the open file itself, so nothing can be swapped in between."""
    import os
    import stat

    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        chunks, left = [], limit + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def shown(path: Path, base: Path) -> str:
    """``path`` under ``base``, "/"-separated, for messages and results: a name that is not UTF-8 is
    shown with U+FFFD, so that results.json and the CSV can always be written."""
    return path.relative_to(base).as_posix().encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def labs() -> dict[str, str]:
    """``{"lab_10": "lab_10_deadlocks", ...}``: every lab the registry grades, with its notebook's
    name where this is a checkout (``solutions/_source/lab_NN_*.md``)."""
    from dtrain_lab.grading import registry

    names = {p.stem[:6]: p.stem for p in sorted((ROOT / "solutions" / "_source").glob("lab_[0-9][0-9]_*.md"))}
    return {lab: names.get(lab, lab) for lab in sorted({e.lab for e in registry.all_exercises() if e.lab})}


def resolve_lab(text: str) -> str:
    """``lab10``, ``10``, ``lab_10``, ``lab-10`` or ``lab_10_deadlocks`` -> ``lab_10``."""
    known = labs()
    m = re.fullmatch(r"(?:lab[_-]?)?0*(\d{1,3})(?:[_-](\w[\w-]*))?", str(text).strip().lower())
    lab = f"lab_{int(m.group(1)):02d}" if m else None
    if lab not in known or (m.group(2) and known[lab] != lab and f"{lab}_{m.group(2)}" != known[lab]):
        raise LabError("ag_unknown_lab", lab=str(text), known=", ".join(f"{k} ({v})" for k, v in known.items()))
    return lab


def lab_exercises(lab: str, only: list[str] | None = None) -> list[str]:
    from dtrain_lab.grading import registry

    ids = [e.id for e in registry.all_exercises() if e.lab == lab]
    for ex_id in only or ():
        if ex_id not in ids:
            raise LabError("ag_unknown_exercise", id=ex_id, lab=lab, known=", ".join(ids))
    return [i for i in ids if not only or i in only]


def lab_of(lab: str | None) -> str | None:
    """``10``, ``lab10``, ``lab_10`` or ``lab_10_deadlocks`` -> the registry's ``lab_10``."""
    if lab is None:
        return None
    return resolve_lab(lab)


def match_file(name: str, suffix: str) -> list[str]:
    """Exercise ids whose file ``name`` ends with (``alice_lab11_roce.env`` -> ``lab11.roce``)."""
    from dtrain_lab.grading import registry

    return [e.id for e in registry.all_exercises()
            if e.filename.endswith(suffix) and (name == e.filename or name.endswith(e.filename)
                                                and name[-len(e.filename) - 1] in "_-. ")]


def notebook_exercises(data: bytes) -> tuple[list[str] | None, LabError | None]:
    """The exercise ids a notebook's graded cells write, or (None, why it is not a notebook): a
    :class:`LabError`, which a message renders in its own language."""
    from dtrain_lab.grading import submissions_in_notebook

    try:
        nb = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        return None, LabError("class_why_not_utf8", byte=exc.start)
    except ValueError as exc:
        return None, LabError("class_why_not_json", detail=str(exc)[:200])
    if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list) \
            or not all(isinstance(c, dict) and isinstance(c.get("source", ""), (str, list)) for c in nb["cells"]):
        return None, LabError("class_why_not_notebook")
    with tempfile.TemporaryDirectory(prefix="dtrain-nb-") as tmp:
        path = Path(tmp) / "nb.ipynb"
        path.write_bytes(data)
        try:
            return sorted(submissions_in_notebook(path)), None
        except Exception as exc:  # noqa: BLE001 - any malformation is a row, never a stopped run
            return None, LabError("class_why_not_json", detail=f"{type(exc).__name__}: {exc}"[:200])
