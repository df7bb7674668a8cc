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
``en``); every other code cell is shared, so zh and en can never drift apart. A paired markdown cell
has the same headings (count and level) in both languages, or the source is rejected.

A code cell's marker may carry nbval's cell tags, which go into the cell's metadata (the learner's
code stays free of test markers)::

    %% code nbval-ignore-output      (a cell that measures: stored empty, never compared)
    %% code nbval-skip               (a cell nbval does not run)

:func:`build` makes ``lessons/zh/NN_name.ipynb`` and ``lessons/en/NN_name.ipynb``; ``execute`` runs
them and keeps the outputs nbval compares, dropping what a run measures: the outputs of cells tagged
``nbval-ignore-output``, and in every other output the measured parts that ``tests/nbval_sanitize.cfg``
lists in its ``measured-*`` sections (a job's ``[x s, start-up y s]``, a PID), which nbval removes from
the fresh output the same way. A learner never opens a number measured on someone else's machine, and
never an empty placeholder: empty displays are dropped, and plots are stored only from cells that
draw something deterministic (a cell that plots a measurement is tagged ``nbval-ignore-output``).

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


TAGS = ("nbval-ignore-output", "nbval-skip", "raises-exception")


@dataclass
class Cell:
    kind: str                  # "md", "code", "setup"
    text: dict                 # lang -> text (md), or {"*": text} for code
    line: int                  # where it starts in the source
    tags: tuple = ()           # nbval's cell tags (code cells)

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


_MARK = re.compile(r"^%% (md|en|zh|code|setup)((?:[ \t]+[\w-]+)*)[ \t]*$")
_FENCE = re.compile(r"^\s*(```|~~~)")
_HEADING = re.compile(r"^(#{1,6})[ \t]+\S")


def lab_programs(lab: str, source: Path) -> dict:
    """``{exercise id: {"solution": code, "learner": code}}`` from the ``%%writefile <lab>_*.py`` cells
    of a lab's source (``lab`` is the exercise prefix, e.g. ``"lab09"``): what the tests, the tools and
    the benchmarks grade."""
    out = {}
    for cell in parse(Path(source).read_text(encoding="utf-8")):
        text = cell.text.get("*", "")
        if cell.kind == "code" and text.startswith(f"%%writefile {lab}_"):
            first, _, body = text.partition("\n")
            out[f"{lab}." + Path(first.split()[1]).stem[len(lab) + 1:]] = blocks(body)   # .py and .env files
    return out


def headings(md: str) -> list[str]:
    """The heading marks (``#``, ``##``, ...) of a markdown text in order, code blocks left out."""
    out, fenced = [], False
    for line in md.splitlines():
        if _FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            m = _HEADING.match(line)
            if m:
                out.append(m.group(1))
    return out


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
        tag, tags = m.group(1), tuple(m.group(2).split())
        if tags and tag not in ("code", "setup"):
            raise SourceError(f"{name}:{i}: only code cells take tags, not '%% {tag}'")
        unknown = [t for t in tags if t not in TAGS]
        if unknown:
            raise SourceError(f"{name}:{i}: unknown cell tag {unknown[0]!r} (known: {', '.join(TAGS)})")
        if tag in ("en", "zh"):
            if current is None or current.kind != "md":
                raise SourceError(f"{name}:{i}: '%% {tag}' outside a '%% md' cell")
            if tag in current.text:
                raise SourceError(f"{name}:{i}: '%% {tag}' twice in one cell")
            lang = tag
        else:
            current = Cell(kind=tag, text={}, line=i, tags=tags)
            cells.append(current)
            lang = None
    flush()
    for c in cells:
        if c.kind == "md" and set(c.text) != set(LANGS):
            raise SourceError(f"{name}:{c.line}: markdown cell needs both '%% en' and '%% zh'")
        if c.kind == "md" and headings(c.text["en"]) != headings(c.text["zh"]):
            raise SourceError(f"{name}:{c.line}: the headings differ between the languages: "
                              f"en {' '.join(headings(c.text['en'])) or 'none'}, "
                              f"zh {' '.join(headings(c.text['zh'])) or 'none'}")
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
        tags = (["setup"] if c.kind == "setup" else []) + list(c.tags)
        if tags:
            cell.metadata["tags"] = tags
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


SANITIZE_CFG = ROOT / "tests" / "nbval_sanitize.cfg"
_SANITIZE = re.compile(r"^\[([^\]]+)\]\s*\nregex: (.*)\nreplace: (.*)$", re.M)


def measured_patterns(cfg: Path = SANITIZE_CFG) -> list[tuple[re.Pattern, str]]:
    """``(regex, replacement)`` of the ``measured-*`` sections of nbval's sanitize file: what a run
    measures (elapsed times, PIDs). nbval applies them to the fresh output; :func:`clean_outputs`
    applies them to the stored one, so both sides agree and the stored side holds no measurement."""
    if not cfg.exists():
        return []
    return [(re.compile(rx), rep) for sec, rx, rep in _SANITIZE.findall(cfg.read_text(encoding="utf-8"))
            if sec.startswith("measured-")]


def _ignored(cell) -> bool:
    tags = cell.get("metadata", {}).get("tags", [])
    legacy = re.search(r"^\s*#\s*NBVAL_(IGNORE_OUTPUT|SKIP)\s*$", cell.source, re.M)  # nbval's comment form
    return "nbval-ignore-output" in tags or "nbval-skip" in tags or legacy is not None


def clean_outputs(nb, patterns: list | None = None) -> None:
    """What is stored of a run: nothing of a cell tagged ``nbval-ignore-output`` or ``nbval-skip``;
    elsewhere the measured parts removed (:func:`measured_patterns`), displays that show nothing dropped
    (a job's live view ends empty) and no execution timestamps. Plots keep their image (a cell that
    plots a measurement is tagged ``nbval-ignore-output``)."""
    patterns = measured_patterns() if patterns is None else patterns

    def scrub(text):
        joined = "".join(text) if isinstance(text, list) else text
        for rx, rep in patterns:
            joined = rx.sub(rep, joined)
        return joined

    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        cell.metadata.pop("execution", None)
        if _ignored(cell):
            cell.outputs = []
            continue
        kept = []
        for out in cell.outputs:
            if out.get("output_type") == "stream":
                out["text"] = scrub(out.get("text", ""))
                if not out["text"]:
                    continue
            data = out.get("data")
            if data is not None:
                if "text/plain" in data:
                    data["text/plain"] = scrub(data["text/plain"])
                    if not data["text/plain"].strip():
                        del data["text/plain"]
                if not data:
                    continue
            kept.append(out)
        cell.outputs = kept


def execute(nb, cwd: Path, timeout: int = 900):
    from nbclient import NotebookClient

    NotebookClient(nb, timeout=timeout, kernel_name="python3", record_timing=False,
                   resources={"metadata": {"path": str(cwd)}}).execute()
    clean_outputs(nb)
    nb.metadata["language_info"] = {"name": "python"}   # not this machine's Python version: as build writes it
    nb.metadata.pop("widgets", None)    # nbclient's saved widget state: random model ids, a widget is live only
    return nb


def carry_outputs(nb, path: Path) -> None:
    """Give each code cell of ``nb`` the outputs stored for the same cell id in the notebook at ``path``.

    For edits that do not change what a cell prints (an import path, a comment); nbval re-runs every
    notebook in ``make test`` and fails on any output that no longer matches. The carried outputs are
    cleaned as :func:`execute` cleans them (a cell newly tagged ``nbval-ignore-output`` loses them).
    """
    import nbformat

    if not path.exists():
        return
    old = {c.get("id"): c for c in nbformat.read(str(path), as_version=4).cells if c.cell_type == "code"}
    for cell in nb.cells:
        if cell.cell_type == "code" and cell.get("id") in old:
            cell.outputs = old[cell["id"]].get("outputs", [])
            cell.execution_count = old[cell["id"]].get("execution_count")
    clean_outputs(nb)


def write(nb, path: Path) -> None:
    import nbformat

    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, str(path))


START_PAGE = ROOT / "lessons" / "START_HERE.ipynb"


def _title(source: Path, lang: str) -> str:
    """The first ``# `` heading of a source's ``lang`` text."""
    for c in parse(source.read_text(encoding="utf-8"), source.name):
        if c.kind == "md":
            for line in c.text[lang].splitlines():
                if line.startswith("# "):
                    return line[2:].strip()
    return source.stem


def start_page():
    """``lessons/START_HERE.ipynb``, where ``make lab`` opens: where to begin in each language, every
    lesson and lab linked, generated from the sources so that it never goes stale."""
    import nbformat

    from dtrain_lab.i18n import tr

    lessons, labs = sources("lessons"), sources("labs")
    nb = nbformat.v4.new_notebook()
    nb.metadata = {"kernelspec": {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"},
                   "language_info": {"name": "python"}}
    for lang in LANGS:
        rows = []
        for src in lessons:
            lab = next((x for x in labs if x.stem.startswith(f"lab_{src.stem.split('_')[0]}_")), None)
            cell = f"[{_title(lab, lang)}](../labs/{lang}/{lab.stem}.ipynb)" if lab else ""
            rows.append(f"| [{_title(src, lang)}]({lang}/{src.stem}.ipynb) | {cell} |")
        md = tr("start_page", lang, lang_dir=lang, first=_title(lessons[0], lang),
                first_file=f"{lessons[0].stem}.ipynb") + "\n" + "\n".join(rows)
        cell = nbformat.v4.new_markdown_cell(md)
        cell["id"] = f"start-{lang}"
        nb.cells.append(cell)
    return nb


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
        if kind == "lessons":
            write(start_page(), START_PAGE)
    return 0


if __name__ == "__main__":
    sys.exit(main())
