"""Every lesson's exercises come with a collapsed hint and a worked answer, in both languages.

In each lesson notebook (``lessons/{en,zh}/NN_*.ipynb``), the markdown cell headed ``## Exercises``
(``## 练习``) holds a numbered list; the markdown cell right after it holds one
``<details><summary>Hint N</summary> ... </details>`` (``提示 N``) per exercise, numbered 1..n.
``docs/answers/{en,zh}/NN.md`` holds the worked answers: one ``## Exercise N`` (``## 练习 N``)
section per exercise, numbered 1..n. The two languages have the same number of exercises.
"""
import json
import re

import pytest

from conftest import ROOT

# every lesson source: "02", "02b", ... (a lesson split in two keeps its number and adds a letter)
LESSONS = sorted(p.stem.split("_")[0] for p in (ROOT / "lessons" / "_source").glob("*.md"))
LANGS = ("en", "zh")
HEADING = {"en": "## Exercises", "zh": "## 练习"}
SUMMARY = {"en": re.compile(r"<summary>\s*Hint (\d+)\s*</summary>"),
           "zh": re.compile(r"<summary>\s*提示 (\d+)\s*</summary>")}
SECTION = {"en": re.compile(r"^## Exercise (\d+)\b", re.M), "zh": re.compile(r"^## 练习 (\d+)(?!\d)", re.M)}
ITEM = re.compile(r"^(\d+)\. ", re.M)


def notebook(nn: str, lang: str):
    found = sorted((ROOT / "lessons" / lang).glob(f"{nn}_*.ipynb"))
    assert len(found) == 1, f"lessons/{lang}: expected one notebook {nn}_*.ipynb, found {found}"
    return found[0], json.loads(found[0].read_text(encoding="utf-8"))


def exercises_and_hints(nn: str, lang: str) -> tuple[list[int], str]:
    path, nb = notebook(nn, lang)
    cells = nb["cells"]
    where = [i for i, c in enumerate(cells) if c["cell_type"] == "markdown"
             and any(line.strip() == HEADING[lang] for line in "".join(c["source"]).splitlines())]
    assert len(where) == 1, f"{path.name}: expected one markdown cell headed '{HEADING[lang]}', found {len(where)}"
    i = where[0]
    items = [int(n) for n in ITEM.findall("".join(cells[i]["source"]))]
    assert items and items == list(range(1, len(items) + 1)), f"{path.name}: exercises numbered {items}"
    assert i + 1 < len(cells) and cells[i + 1]["cell_type"] == "markdown", \
        f"{path.name}: no markdown hint cell right after the exercises"
    return items, "".join(cells[i + 1]["source"])


@pytest.mark.parametrize("lang", LANGS)
@pytest.mark.parametrize("nn", LESSONS)
def test_one_hint_per_exercise(nn, lang):
    items, hints = exercises_and_hints(nn, lang)
    numbers = [int(n) for n in SUMMARY[lang].findall(hints)]
    assert numbers == items, f"lesson {nn} ({lang}): {len(items)} exercises, hints numbered {numbers}"
    assert hints.count("<details>") == hints.count("</details>") == len(items), \
        f"lesson {nn} ({lang}): {len(items)} exercises, {hints.count('<details>')} <details> blocks"


@pytest.mark.parametrize("nn", LESSONS)
def test_languages_agree(nn):
    assert len(exercises_and_hints(nn, "en")[0]) == len(exercises_and_hints(nn, "zh")[0]), \
        f"lesson {nn}: the en and zh notebooks number their exercises differently"


@pytest.mark.parametrize("lang", LANGS)
@pytest.mark.parametrize("nn", LESSONS)
def test_answers_one_section_per_exercise(nn, lang):
    items, _ = exercises_and_hints(nn, lang)
    path = ROOT / "docs" / "answers" / lang / f"{nn}.md"
    assert path.is_file(), f"missing {path.relative_to(ROOT)}"
    numbers = [int(n) for n in SECTION[lang].findall(path.read_text(encoding="utf-8"))]
    assert numbers == items, f"{path.relative_to(ROOT)}: {len(items)} exercises, sections numbered {numbers}"
