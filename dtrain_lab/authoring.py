"""One source per notebook, two languages out: how the course's notebooks are written and built.

A lesson is written once, in ``lessons/_source/NN_name.md``, as a sequence of cells::

    %% md
    %% en
    English markdown ...
    %% zh
    中文 markdown ...
    %% setup
    import dtrain_lab
    dtrain_lab.set_lang("{LANG}")
    %% code
    result = dtrain_lab.launch(...)

``%% setup`` is the one code cell that differs between the languages (``{LANG}`` becomes ``zh`` or
``en``); every other code cell is shared, so zh and en can never drift apart. :func:`build` makes
``lessons/zh/NN_name.ipynb`` and ``lessons/en/NN_name.ipynb``; ``execute`` runs them and keeps the
outputs nbval compares, dropping what a run measures (cells marked ``# NBVAL_IGNORE_OUTPUT``,
images): a learner never opens a number measured on someone else's machine.

    python -m dtrain_lab.authoring build            # regenerate notebooks (no execution)
    python -m dtrain_lab.authoring build --keep-outputs   # ... keeping each code cell's stored output
    python -m dtrain_lab.authoring execute [NAMES]  # regenerate, execute, store reference outputs
"""
from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path

LANGS = ("zh", "en")
ROOT = Path(__file__).resolve().parent.parent
KINDS = ("lessons", "labs", "solutions")


@dataclass
class Cell:
    kind: str                  # "md", "code", "setup"
    text: dict                 # lang -> text (md), or {"*": text} for code
    line: int                  # where it starts in the source

    def source(self, lang: str, variant: str = "solution") -> str:
        if self.kind == "md":
            return self.text[lang]
        if self.kind == "setup":
            return self.text["*"].replace("{LANG}", lang)
        return render(self.text["*"], variant)


class SourceError(ValueError):
    pass


_BLOCK = re.compile(r"^### (BEGIN|END) (SOLUTION|STUB)\s*$")


def render(code: str, variant: str) -> str:
    """The code of a cell for the ``solution`` notebook or the ``learner`` copy.

    ``### BEGIN SOLUTION`` … ``### END SOLUTION`` is kept in the solution and dropped from the
    learner's copy; ``### BEGIN STUB`` … ``### END STUB`` is the reverse (what the learner starts
    from: a stub or the broken program to fix). The marker lines themselves never appear.
    """
    out, mode = [], None
    for line in code.split("\n"):
        m = _BLOCK.match(line.strip())
        if m:
            kind = m.group(2).lower()
            if m.group(1) == "BEGIN":
                if mode is not None:
                    raise SourceError(f"nested {kind} block")
                mode = kind
            else:
                if mode != kind:
                    raise SourceError(f"END {kind.upper()} without BEGIN")
                mode = None
            continue
        if mode is None or (mode == "solution") == (variant == "solution"):
            out.append(line)
    if mode is not None:
        raise SourceError(f"unterminated {mode} block")
    return "\n".join(out)


def blocks(code: str) -> dict:
    """``{"solution": text, "learner": text}`` of one code cell."""
    return {v: render(code, v) for v in ("solution", "learner")}


_MARK = re.compile(r"^%% (md|en|zh|code|setup)\s*$")


def parse(text: str, name: str = "<source>") -> list[Cell]:
    cells: list[Cell] = []
    current: Cell | None = None
    lang: str | None = None
    buf: list[str] = []

    def flush() -> None:
        if current is None:
            if "".join(buf).strip():
                raise SourceError(f"{name}: text before the first '%% ' marker")
            return
        body = "\n".join(buf).strip("\n")
        key = lang if current.kind == "md" else "*"
        if key is None:
            if body.strip():
                raise SourceError(f"{name}:{current.line}: markdown cell text must follow '%% en' or '%% zh'")
            return
        current.text[key] = body

    for i, line in enumerate(text.splitlines(), 1):
        m = _MARK.match(line)
        if not m:
            buf.append(line)
            continue
        flush()
        buf = []
        tag = m.group(1)
        if tag in ("en", "zh"):
            if current is None or current.kind != "md":
                raise SourceError(f"{name}:{i}: '%% {tag}' outside a '%% md' cell")
            if tag in current.text:
                raise SourceError(f"{name}:{i}: '%% {tag}' twice in one cell")
            lang = tag
        else:
            current = Cell(kind=tag, text={}, line=i)
            cells.append(current)
            lang = None
    flush()
    for c in cells:
        if c.kind == "md" and set(c.text) != set(LANGS):
            raise SourceError(f"{name}:{c.line}: markdown cell needs both '%% en' and '%% zh'")
        if c.kind != "md" and not c.text.get("*", "").strip():
            raise SourceError(f"{name}:{c.line}: empty code cell")
    if sum(c.kind == "setup" for c in cells) != 1:
        raise SourceError(f"{name}: exactly one '%% setup' cell is required")
    return cells


def to_notebook(cells: list[Cell], lang: str, source_name: str, variant: str = "solution"):
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.metadata = {
        "kernelspec": {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"},
        "language_info": {"name": "python"},
        "dtrain_lab": {"lang": lang, "source": source_name, "variant": variant},
    }
    for i, c in enumerate(cells):
        src = c.source(lang, variant)
        cell = nbformat.v4.new_markdown_cell(src) if c.kind == "md" else nbformat.v4.new_code_cell(src)
        cell["id"] = f"cell-{i:03d}"  # same id in both languages: cells pair up by id
        if c.kind == "setup":
            cell.metadata["tags"] = ["setup"]
        nb.cells.append(cell)
    return nb


def sources(kind: str = "lessons") -> list[Path]:
    """Sources behind ``kind``'s notebooks: labs are generated from the solutions' sources."""
    folder = "solutions" if kind == "labs" else kind
    return sorted((ROOT / folder / "_source").glob("*.md"))


def notebook_path(source: Path, lang: str, kind: str | None = None) -> Path:
    kind = kind or source.parent.parent.name
    return ROOT / kind / lang / (source.stem + ".ipynb")


def build(source: Path, kind: str | None = None) -> dict:
    """``{lang: notebook}`` for ``kind`` ("lessons", "solutions" or "labs", the learner copy)."""
    kind = kind or source.parent.parent.name
    variant = "learner" if kind == "labs" else "solution"
    cells = parse(source.read_text(encoding="utf-8"), str(source.relative_to(ROOT)))
    return {lang: to_notebook(cells, lang, str(source.relative_to(ROOT)), variant) for lang in LANGS}


def _strip_measured(nb) -> None:
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        if "NBVAL_IGNORE_OUTPUT" in cell.source or "NBVAL_SKIP" in cell.source:
            cell.outputs = []
            continue
        for out in cell.outputs:
            data = out.get("data")
            if data:
                for key in [k for k in data if k.startswith("image/")]:
                    del data[key]


def execute(nb, cwd: Path, timeout: int = 900):
    from nbclient import NotebookClient

    NotebookClient(nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(cwd)}}).execute()
    _strip_measured(nb)
    return nb


def carry_outputs(nb, path: Path) -> None:
    """Give each code cell of ``nb`` the outputs stored for the same cell id in the notebook at ``path``.

    For edits that do not change what a cell prints (an import path, a comment); nbval re-runs every
    notebook in ``make test`` and fails on any output that no longer matches.
    """
    import nbformat

    if not path.exists():
        return
    old = {c.get("id"): c for c in nbformat.read(str(path), as_version=4).cells if c.cell_type == "code"}
    for cell in nb.cells:
        if cell.cell_type == "code" and cell.get("id") in old:
            cell.outputs = old[cell["id"]].get("outputs", [])
            cell.execution_count = old[cell["id"]].get("execution_count")


def write(nb, path: Path) -> None:
    import nbformat

    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, str(path))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m dtrain_lab.authoring")
    ap.add_argument("command", choices=["build", "execute"])
    ap.add_argument("names", nargs="*", help="source stems to process (default: all)")
    ap.add_argument("--kind", choices=KINDS, default=None)
    ap.add_argument("--keep-outputs", action="store_true",
                    help="build: keep each code cell's stored outputs (nbval checks them in make test)")
    args = ap.parse_args(argv)
    kinds = [args.kind] if args.kind else list(KINDS)
    for kind in kinds:
        for src in sources(kind):
            if args.names and not any(n in src.stem for n in args.names):
                continue
            for lang, nb in build(src, kind).items():
                out = notebook_path(src, lang, kind)
                if args.command == "execute":
                    print(f"executing {out.relative_to(ROOT)} ...", flush=True)
                    execute(nb, out.parent)
                elif args.keep_outputs:
                    carry_outputs(nb, out)
                write(nb, out)
                print(f"wrote {out.relative_to(ROOT)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
