"""Every lab's learner copies are "not yet", in both languages, and grading them launches nothing.

One test for every lab that has graded exercises (the registry's labs), in English and in Chinese:
each exercise's learner copy, as the lab's one source writes it (``solutions/_source/lab_NN_*.md``),
graded as a learner would grade it, is an ``error`` verdict marked ``not_yet`` that did not pass, in
the learner's language (Chinese characters in the feedback exactly when the language is zh), and
nothing was launched: the grader's ``runner.run`` (every launched grade goes through it) and the
launcher itself refuse. The built learner notebook (``labs/<lang>/lab_NN_*.ipynb``) holds a graded
cell for every exercise of the lab and no other, and grading the whole notebook gives "not yet" for
each of them, in its language, again without a launch.
"""
import importlib
import re
from pathlib import Path

import pytest

from conftest import ROOT, grade, grade_notebook, submit
from dtrain_lab import authoring
from dtrain_lab.grading import registry, submissions_in_notebook

HAN = r"[\u4e00-\u9fff]"
LABS = sorted({e.lab for e in registry.all_exercises()})


def _only(pattern: str) -> Path:
    found = sorted(ROOT.glob(pattern))
    assert len(found) == 1, (pattern, found)
    return found[0]


def learner_copies(lab: str) -> dict[str, str]:
    """``{file name: learner copy}`` of every ``%%writefile`` cell of the lab's source (``.py`` and ``.env``)."""
    out = {}
    for cell in authoring.parse(_only(f"solutions/_source/{lab}_*.md").read_text(encoding="utf-8")):
        text = cell.text.get("*", "")
        if cell.kind == "code" and text.startswith("%%writefile "):
            first, _, body = text.partition("\n")
            out[Path(first.split()[1]).name] = authoring.blocks(body)["learner"]
    return out


def in_learner_language(feedback: str, marker: str, lang: str) -> bool:
    """Chinese characters in ``feedback`` exactly when ``lang`` is zh, the quoted stub line left out
    (the feedback quotes the copy's marker line in backticks, and labs 10 and 11 write it in both
    languages)."""
    feedback = re.sub(r"`[^`]*" + re.escape(marker) + r"[^`]*`", "``", feedback)
    return bool(re.search(HAN, feedback)) == (lang == "zh")


def test_every_lab_is_covered():
    assert LABS == ["lab_02", "lab_04", "lab_05", "lab_08", "lab_09", "lab_10", "lab_11", "lab_13"]


@pytest.mark.parametrize("lang", ["en", "zh"])
@pytest.mark.parametrize("lab", LABS)
def test_learner_copies_are_not_yet_without_launching(tmp_path, monkeypatch, lab, lang):
    def refuse(*a, **kw):
        raise AssertionError("a stub was launched")

    monkeypatch.setattr(importlib.import_module("dtrain_lab.grading.runner"), "run", refuse)
    monkeypatch.setattr(importlib.import_module("dtrain_lab.jobs.launch"), "launch", refuse)
    exercises = sorted(e.id for e in registry.all_exercises() if e.lab == lab)
    copies = learner_copies(lab)
    for ex_id in exercises:
        ex = registry.get(ex_id)
        assert ex.stub_marker and ex.stub_marker in copies[ex.filename], ex_id
        v = grade(ex_id, submit(tmp_path, ex_id, copies[ex.filename], f"{lang}-{ex_id}"), lang=lang)
        assert v.outcome == "error" and not v.passed and v.details.get("not_yet"), v.feedback
        assert in_learner_language(v.feedback, ex.stub_marker, lang), v.feedback
    nb = _only(f"labs/{lang}/{lab}_*.ipynb")
    assert set(submissions_in_notebook(nb)) == set(exercises)
    verdicts = grade_notebook(nb, lang=lang, workdir=str(tmp_path))
    assert sorted(v.exercise for v in verdicts) == exercises
    for v in verdicts:
        ex = registry.get(v.exercise)
        assert v.outcome == "error" and not v.passed and v.details.get("not_yet"), v.feedback
        assert in_learner_language(v.feedback, ex.stub_marker, lang), v.feedback
