"""How long a lesson takes to study, by one rule for every lesson and both languages.

The rule (stated in ``docs/instructor_guide.md`` §"How long a lesson takes"):

* prose is **studied, not skimmed**: 100 Latin-script words and 200 Chinese characters a minute,
  about half of an ordinary reading rate for technical text (a Chinese text's API names and English
  terms count as words; the same rule reads both languages, with no branch on the language);
* code is read at 6 non-blank, non-comment lines a minute;
* every code cell costs half a minute to run and look at, plus its own run time (the seconds the
  notebook's cells took in the last measured run of the suite on 2 CPU cores, ``tests/durations.json``,
  written by ``make durations``);
* the exercises and the collapsed hints are not part of a lesson's time (they are stated apart).

A lesson's stated time (``*Time:* about N minutes`` / ``*用时：* 约 N 分钟``) is this figure for the
slower of its two languages, rounded up to a multiple of 5 (at most one step more), and a lesson must
fit in 75 minutes; one that does not is split (``tests/test_study_time.py``)."""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

WORDS_PER_MIN = 100            # Latin-script words
HAN_PER_MIN = 200              # Chinese characters
CODE_LINES_PER_MIN = 6
MIN_PER_CODE_CELL = 0.5
MAX_MINUTES = 75
STATED = re.compile(r"\*(?:Time:|用时：)\*\s*(?:about|约)\s*(\d+)\s*(?:minutes|分钟)")
_EXERCISES = re.compile(r"^##\s+(?:Exercises|练习)\s*$", re.M)
_HAN = re.compile(r"[\u3400-\u9fff]")
_WORD = re.compile(r"[A-Za-z0-9][A-Za-z0-9_'’-]*")


def reading_minutes(text: str) -> float:
    """Minutes to study ``text``: its Latin-script words and its Chinese characters, each at its rate."""
    return len(_WORD.findall(text)) / WORDS_PER_MIN + len(_HAN.findall(text)) / HAN_PER_MIN


@dataclass
class StudyTime:
    lesson: str
    lang: str
    prose_min: float
    code_cells: int
    code_lines: int
    run_s: float

    @property
    def minutes(self) -> float:
        return (self.prose_min + self.code_lines / CODE_LINES_PER_MIN
                + self.code_cells * MIN_PER_CODE_CELL + self.run_s / 60)

    @property
    def stated_should_be(self) -> int:
        return 5 * math.ceil(self.minutes / 5)


def study_time(source: Path, lang: str, run_s: float) -> StudyTime:
    """The study time of a lesson source in ``lang``: everything up to its exercises."""
    from dtrain_lab.authoring import parse

    prose = 0.0
    cells = lines = 0
    for cell in parse(source.read_text(encoding="utf-8"), source.name):
        if cell.kind == "md":
            text = cell.text[lang]
            if _EXERCISES.search(text):
                break
            text = re.sub(r"<details>.*?</details>", "", text, flags=re.S)   # collapsed hints
            prose += reading_minutes(text)
        elif cell.kind == "code":
            cells += 1
            lines += sum(1 for line in cell.text["*"].splitlines() if line.strip() and not line.strip().startswith("#"))
    return StudyTime(source.stem, lang, prose, cells, lines, run_s)


def stated(source: Path, lang: str) -> int | None:
    """The time the lesson states in ``lang`` (its first markdown cell that states one)."""
    from dtrain_lab.authoring import parse

    for cell in parse(source.read_text(encoding="utf-8"), source.name):
        if cell.kind == "md" and (m := STATED.search(cell.text[lang])):
            return int(m.group(1))
    return None
