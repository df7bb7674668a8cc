"""Redraw every stored figure of the given notebooks from the inputs stored beside it (SVG, its PNG
copy and the title), without running the notebook: after a change to a drawing or to its labels.

    .venv/bin/python tools/redraw_figures.py lessons/*/*.ipynb

The run's recorded data (the output's metadata) stay as they are; a change to what a run records needs
the notebook executed again (python -m dtrain_lab.authoring execute NAME)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import nbformat

from dtrain_lab import figures
from dtrain_lab.authoring import write


def redraw(path: Path) -> int:
    nb = json.loads(path.read_text(encoding="utf-8"))
    lang = path.parent.name
    n = 0
    for cell in nb["cells"]:
        for o in cell.get("outputs", []):
            meta = o.get("metadata", {}).get(figures.METADATA_KEY)
            if meta is not None:
                o["data"] = figures.bundle(meta["name"], meta["inputs"], lang)
                n += 1
    if n:
        write(nbformat.from_dict(nb), path)
    return n


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        if n := redraw(Path(arg)):
            print(f"{arg}: {n} figures redrawn")
