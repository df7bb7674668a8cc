"""Every lesson states how long it takes by one rule (dtrain_lab.studytime), the same figure in both
languages, and fits in 75 minutes; lessons known to be over it are listed, and must really be over it
(so the list cannot outlive a split)."""
from __future__ import annotations

import json

import pytest

from conftest import ROOT
from dtrain_lab import studytime

SOURCES = sorted((ROOT / "lessons" / "_source").glob("*.md"))
DURATIONS = json.loads((ROOT / "tests" / "durations.json").read_text())
# over the rule's 75 minutes: to be split (issue 24, item 3); their stated time is the rule's figure
TO_SPLIT: set[str] = set()


def _times(src):
    run_s = DURATIONS.get(f"lessons/en/{src.stem}.ipynb", 0.0)
    return {lang: studytime.study_time(src, lang, run_s) for lang in ("en", "zh")}


@pytest.mark.parametrize("src", SOURCES, ids=lambda p: p.stem)
def test_stated_time_follows_the_rule(src):
    times = _times(src)
    en, zh = studytime.stated(src, "en"), studytime.stated(src, "zh")
    assert en is not None and zh is not None, f"{src.name}: no stated time in both languages"
    assert en == zh, f"{src.name}: {en} min in en, {zh} min in zh"
    rule = max(t.minutes for t in times.values())
    # at least the rule's figure, and not padded: within one 5-minute step above it (a re-measured run
    # time moves the figure a little; it must not break a lesson's stated time)
    assert en % 5 == 0 and rule <= en < rule + 10, (
        f"{src.name}: states {en} min; the rule gives {rule:.1f} "
        f"({', '.join(f'{t.lang}: {t.minutes:.1f}' for t in times.values())}), so about {5 * -(-rule // 5):.0f}")
    assert (rule > studytime.MAX_MINUTES) == (src.stem in TO_SPLIT), f"{src.name}: {rule:.1f} min"


def test_the_rule_counts_what_it_says():
    t = studytime.StudyTime("x", "en", prose_min=10, code_cells=4, code_lines=30, run_s=60)
    assert t.minutes == pytest.approx(10 + 5 + 2 + 1) and t.stated_should_be == 20
    assert studytime.reading_minutes("用两个 rank 做 All-Reduce") == pytest.approx(4 / 200 + 2 / 100)
    assert studytime.reading_minutes("Two ranks all-reduce: it's 2 calls.") == pytest.approx(6 / 100)
