"""Every exercise's solution is graded for real once per language, in the solution notebooks.

``make test`` re-executes ``solutions/{zh,en}/lab_*.ipynb`` with nbval, which compares each cell's
fresh output with the stored one. The check cell under each exercise grades the file the cell above
wrote (sandboxed, launched: :func:`dtrain_lab.grading.check`) and prints the verdict, so a stored
"✓ … passed" line that a fresh grade does not print again fails the suite. The lab test files
therefore grade wrong answers only; this file makes sure no exercise escapes that proof: every
registered exercise has its check cell in both languages, after the cell that writes its file,
with the passing verdict stored, and the learner copies have the same check cell with nothing
stored but the untouched stub's "not attempted yet" (a learner copy never shows a passing verdict).
"""
import json
import re

import pytest

from conftest import ROOT
from dtrain_lab.grading import grader, registry
from dtrain_lab.i18n import tr

EXERCISES = registry.all_exercises()
CHECK = re.compile(r"""check\(\s*["']([\w.]+)["']""")


def _code_cells(path):
    nb = json.loads(path.read_text(encoding="utf-8"))
    return [c for c in nb["cells"] if c["cell_type"] == "code"]


def _text(cell) -> str:
    return "".join("".join(o.get("text", "")) for o in cell.get("outputs", []) if o.get("output_type") == "stream")


def _notebook(kind: str, lang: str, lab: str):
    found = sorted((ROOT / kind / lang).glob(f"{lab}_*.ipynb"))
    assert len(found) == 1, (kind, lang, lab, found)
    return found[0]


def _check_cells(cells, ex_id):
    return [i for i, c in enumerate(cells) if CHECK.search("".join(c["source"])) and
            CHECK.search("".join(c["source"])).group(1) == ex_id]


def _passing_lines(ex, lang):
    title = ex.title[lang]
    return {tr("grade_pass", lang, title=title, sizes=max(ex.world_sizes, default=0)), tr("grade_pass_one", lang, title=title),
            tr("grade_pass_sizes_all", lang, title=title, sizes=grader._sizes(ex.world_sizes, lang)),
            tr("grade_pass_static", lang, title=title)}


def test_every_lab_has_exercises():
    labs = {e.lab for e in EXERCISES}
    assert len(EXERCISES) >= 20 and len(labs) >= 7
    for lab in labs:
        for lang in ("zh", "en"):
            _notebook("solutions", lang, lab)
            _notebook("labs", lang, lab)


@pytest.mark.parametrize("lang", ["zh", "en"])
@pytest.mark.parametrize("ex", EXERCISES, ids=[e.id for e in EXERCISES])
def test_solution_notebook_stores_a_pass_that_nbval_regrades(ex, lang):
    cells = _code_cells(_notebook("solutions", lang, ex.lab))
    where = _check_cells(cells, ex.id)
    assert len(where) == 1, f"{ex.id}: {len(where)} check cells in solutions/{lang}"
    i = where[0]
    # the file it grades is written by a cell before it
    writes = [j for j, c in enumerate(cells[:i]) if "".join(c["source"]).startswith(f"%%writefile {ex.filename}")]
    assert writes, f"{ex.id}: no %%writefile {ex.filename} before its check cell"
    stored = _text(cells[i]).strip().split("\n")
    assert stored[0] in _passing_lines(ex, lang), (ex.id, lang, stored[:3])


@pytest.mark.parametrize("lang", ["zh", "en"])
@pytest.mark.parametrize("ex", EXERCISES, ids=[e.id for e in EXERCISES])
def test_learner_copy_has_the_check_cell_and_no_verdict(ex, lang):
    cells = _code_cells(_notebook("labs", lang, ex.lab))
    where = _check_cells(cells, ex.id)
    assert len(where) == 1, f"{ex.id}: {len(where)} check cells in labs/{lang}"
    # stored: at most the "not attempted yet" verdict of the untouched stub, never a pass
    stored = _text(cells[where[0]]).strip()
    title = ex.title[lang]
    assert not stored or stored.startswith(f"… {title}"), (ex.id, lang, stored[:200])
    assert not any(line.startswith("✓") for c in cells for line in _text(c).split("\n"))


def test_lab_programs_are_keyed_by_exercise_id_for_every_kind_of_file():
    """authoring.lab_programs names each %%writefile cell by its exercise id, .env files (lab 11) as
    well as .py ones: the keys are exactly the registry's exercises of the lab."""
    from dtrain_lab import authoring
    from dtrain_lab.grading import registry

    source = ROOT / "solutions" / "_source" / "lab_11_nccl.md"
    want = sorted(e.id for e in registry.all_exercises() if e.lab == "lab_11")
    assert sorted(authoring.lab_programs("lab11", source)) == want
