"""The Chinese texts follow docs/glossary.md: no English term left untranslated in the prose (a gloss
in full-width parentheses after its Chinese is fine), no variant the glossary rejects, and every
collective glossed the first time a lesson or lab names it."""
from __future__ import annotations

import re

import pytest

from conftest import ROOT
from dtrain_lab.authoring import parse

GLOSSARY = ROOT / "docs" / "glossary.md"


def table(title: str) -> list[tuple[str, str]]:
    """The two-column table under the ``### title`` heading of the glossary."""
    text = GLOSSARY.read_text(encoding="utf-8")
    section = text.split(f"### {title}", 1)[1].split("\n#", 1)[0]
    # cells split at unescaped pipes; "\\|" is a pipe inside a cell (a regular expression's alternation)
    rows = [re.split(r"(?<!\\)\|", line.strip()[1:-1]) for line in section.splitlines() if line.startswith("|")]
    out = [(a.strip().strip("`").replace("\\|", "|"), b.strip()) for a, b in rows[2:]]   # past the header and the rule
    assert out, f"no rows under '### {title}' in docs/glossary.md"
    return out


UNTRANSLATED = [(re.compile(rx, re.I), zh) for rx, zh in table("English words never left untranslated in Chinese prose")]
VARIANTS = table("Chinese variants the course does not use")
COLLECTIVES = table("Collectives glossed on first use in each lesson and lab")


def prose(md: str) -> str:
    """The words a reader reads: code blocks, code spans, formulas, link targets and HTML blanked out
    (same length, so that positions keep their neighbours)."""
    blank = lambda m: re.sub(r"[^\n]", " ", m.group(0))  # noqa: E731
    for rx in (r"```.*?```", r"`[^`\n]*`", r"\$\$.*?\$\$", r"\$[^$\n]*\$", r"\]\([^)]*\)", r"<[^>]+>", r"https?://\S+"):
        md = re.sub(rx, blank, md, flags=re.S)
    return md


def is_gloss(text: str, start: int, end: int, zh: str) -> bool:
    """``text[start:end]`` stands in full-width parentheses that open within a few characters after ``zh``."""
    opening = text.rfind("（", 0, start)
    if opening < 0 or text.rfind("）", 0, start) > opening or "）" not in text[end:end + 80]:
        return False
    return zh in text[max(0, opening - 8):start]


def chinese_texts():
    """(where, text, unit): zh markdown of every lesson and lab source (unit: the notebook, for the
    first-use glosses), the Chinese README and instructor guide."""
    for src in sorted(ROOT.glob("lessons/_source/*.md")) + sorted(ROOT.glob("solutions/_source/*.md")):
        for cell in parse(src.read_text(encoding="utf-8"), src.name):
            if cell.kind == "md":
                yield f"{src.relative_to(ROOT)}:{cell.line}", cell.text["zh"], src.stem
    for path in [ROOT / "README.zh.md", *sorted((ROOT / "docs").glob("*.zh.md")),
                 *sorted((ROOT / "docs" / "answers" / "zh").glob("*.md"))]:
        yield str(path.relative_to(ROOT)), path.read_text(encoding="utf-8"), None


def catalogue_texts():
    """(where, text): the zh of every message in the course's catalogues (what a notebook prints)."""
    import tomllib

    for path in sorted((ROOT / "dtrain_lab").rglob("*.toml")):
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except tomllib.TOMLDecodeError:
            continue
        for key, entry in data.items():
            if isinstance(entry, dict) and isinstance(entry.get("zh"), str):
                yield f"{path.relative_to(ROOT)}:[{key}]", entry["zh"]


def _excerpt(text: str, m) -> str:
    return text[max(0, m.start() - 20):m.end() + 20].replace("\n", " ").strip()


def test_the_glossary_tables_are_read():
    assert len(UNTRANSLATED) >= 6 and len(VARIANTS) >= 5 and len(COLLECTIVES) >= 3


def test_no_english_term_left_untranslated_in_chinese_prose():
    found = []
    for where, text, _ in chinese_texts():
        words = prose(text)
        for rx, zh in UNTRANSLATED:
            for m in rx.finditer(words):
                if not is_gloss(words, m.start(), m.end(), zh):
                    found.append(f"{where}: '{m.group(0)}' → {zh}: …{_excerpt(words, m)}…")
    assert not found, f"{len(found)} English terms in Chinese prose (docs/glossary.md):\n" + "\n".join(found)


def test_no_rejected_chinese_variant():
    found = []
    texts = [(where, text) for where, text, _ in chinese_texts()] + list(catalogue_texts())
    for where, text in texts:
        for bad, good in VARIANTS:
            for m in re.finditer(bad, text):
                found.append(f"{where}: {bad} → {good}: …{_excerpt(text, m)}…")
    assert not found, "\n".join(found)


def test_collectives_are_glossed_on_first_use_in_each_lesson_and_lab():
    first: dict[tuple[str, str], str] = {}
    for where, text, unit in chinese_texts():
        if unit is None:
            continue
        words = re.sub(r"(?m)^#.*$", "", prose(text))   # a title carries no gloss: the first use in the text does
        for name, gloss in COLLECTIVES:
            if (unit, name) in first:
                continue
            m = re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", words, re.I)
            if m:
                follows = words[m.end():m.end() + len(gloss) + 3].lstrip("* ")
                first[(unit, name)] = "" if follows.startswith(f"（{gloss}") else f"{where}: …{_excerpt(words, m)}…"
    missing = [f"{name}（{dict(COLLECTIVES)[name]}）, first named at {at}" for (_, name), at in sorted(first.items()) if at]
    assert not missing, "collectives without their gloss on first use:\n" + "\n".join(missing)


@pytest.mark.parametrize("text,bad", [("保存的激活", True), ("保存的激活值", False), ("激活检查点", False),
                                      ("融合的注意力内核", True), ("notebook 内核", False), ("1F1B 的稳定阶段", True),
                                      ("1F1B 的稳态", False)])
def test_the_variant_patterns_tell_terms_apart(text, bad):
    assert any(re.search(rx, text) for rx, _ in VARIANTS) is bad


@pytest.mark.parametrize("text,ok", [("把钩子（hook）挂上", True), ("通信钩子*（communication hook）", True),
                                     ("这个 hook 会触发", False), ("（hook 在这里）", False)])
def test_a_gloss_is_told_from_a_stray_term(text, ok):
    m = re.search(r"hook", text)
    assert is_gloss(text, m.start(), m.end(), "钩子") is ok
