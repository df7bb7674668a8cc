"""Lesson self-checks (dtrain_lab.selfcheck): a right answer passes, a wrong one fails without the
answer in what is printed, bad input gets a clear error in the learner's language, and every checked
exercise exists in its lesson and names the self-check in its hint (both languages)."""
from __future__ import annotations

import re

import pytest

from conftest import ROOT
from dtrain_lab import selfcheck
from dtrain_lab.i18n import LabError

# the answers as the worked answers in docs/answers give them (verified there by running the code)
ANSWERS = {"01.1": 3, "01.4": 4e6, "05.1": (43, 2), "05.2": (6, 4, 3), "07.4": 36864, "08.2": 64, "09.6": 3220}


def test_every_checked_exercise_has_its_answer_here():
    assert set(ANSWERS) == set(selfcheck.EXERCISES)


@pytest.mark.parametrize("exercise", sorted(ANSWERS))
@pytest.mark.parametrize("lang", ["en", "zh"])
def test_right_and_wrong_answers(exercise, lang, capsys):
    right = ANSWERS[exercise]
    assert selfcheck.check(exercise, right, lang) is True
    assert "✓" in capsys.readouterr().out
    nums = list(right) if isinstance(right, tuple) else [right]
    for wrong in ([n * 1.5 + 1 for n in nums], [n * 0.5 - 1 for n in nums]):
        answer = tuple(wrong) if isinstance(right, tuple) else wrong[0]
        assert selfcheck.check(exercise, answer, lang) is False
        out = capsys.readouterr().out
        assert "✗" in out
        for n in nums:                   # the expected value is never printed
            assert not re.search(rf"(?<![\d.]){re.escape(str(n))}(?![\d])", out.replace(exercise, "")), out
    if isinstance(right, tuple):
        assert selfcheck.check(exercise, right[:-1], lang) is False


@pytest.mark.parametrize("bad", ["64", None, float("nan"), True, [1, "x"]])
def test_bad_input_gets_a_clear_error(bad):
    with pytest.raises(LabError) as e:
        selfcheck.check("08.2", bad, "zh")
    assert e.value.key == "selfcheck_not_a_number" and "自查" in e.value.message("zh")
    assert "self-check" in e.value.message("en")


def test_unknown_exercise():
    with pytest.raises(LabError):
        selfcheck.check("99.9", 1)


@pytest.mark.parametrize("exercise", sorted(ANSWERS))
def test_the_hint_names_the_self_check(exercise):
    """The lesson's exercise N exists and its hint (both languages) shows the call."""
    from dtrain_lab.authoring import parse

    lesson, n = exercise.split(".")
    src = next((ROOT / "lessons" / "_source").glob(f"{lesson}_*.md"))
    cells = [c for c in parse(src.read_text(encoding="utf-8"), src.name) if c.kind == "md"]
    for lang in ("en", "zh"):
        hints = next(c.text[lang] for c in cells if "<details>" in c.text[lang])
        nth = hints.split("<details>")[int(n)]          # [0] is what comes before the first hint
        assert f'check("{exercise}"' in nth, f"lesson {lesson} ({lang}): hint {n} does not show check(\"{exercise}\", ...)"
