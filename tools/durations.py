"""Per-file test seconds from a JUnit XML report, written to tests/durations.json.

    make durations            (runs the suite once with --junitxml, then this)
    python tools/durations.py report.xml

The suite runs with ``--dist loadfile --no-loadscope-reorder``: every file goes whole to one
worker, in collection order. ``tests/conftest.py`` puts the files that took longest first (longest
processing time first), so the workers finish together instead of one running a long notebook
alone at the end. The figures only order the files; no test reads them as a limit.
"""
from __future__ import annotations

import collections
import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "durations.json"


def file_of(classname: str) -> str | None:
    """``tests.test_launch`` -> ``tests/test_launch.py``; ``lessons.zh.10_x.ipynb`` -> ``lessons/zh/10_x.ipynb``
    (classnames join folders and the file name with dots; the first split that names a file wins)."""
    parts = classname.split(".")
    for cut in range(1, len(parts)):
        head, tail = "/".join(parts[:cut]), ".".join(parts[cut:])
        for cand in (f"{head}/{tail}", f"{head}/{tail}.py"):
            if (ROOT / cand).is_file():
                return cand
        # a class inside a module: tests.test_x.TestY
        for k in range(cut + 1, len(parts)):
            cand = "/".join(parts[:cut]) + "/" + ".".join(parts[cut:k]) + ".py"
            if (ROOT / cand).is_file():
                return cand
    return None


def per_file(report: Path) -> dict[str, float]:
    seconds: dict[str, float] = collections.defaultdict(float)
    for case in ET.parse(report).getroot().iter("testcase"):
        name = file_of(case.get("classname", ""))
        if name:
            seconds[name] += float(case.get("time", 0) or 0)
    return {k: round(v, 1) for k, v in sorted(seconds.items(), key=lambda kv: -kv[1])}


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__)
        return 2
    data = per_file(Path(argv[0]))
    if not data:
        print(f"no test cases found in {argv[0]}")
        return 1
    OUT.write_text(json.dumps(data, indent=0, ensure_ascii=False) + "\n")
    print(f"{len(data)} files, {sum(data.values()):.0f} s in all -> {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
