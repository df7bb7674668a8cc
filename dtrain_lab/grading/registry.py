"""Where the grader finds an exercise: each lab's checks module, loaded when one of its exercises is asked for.

A lab's exercises are the list ``EXERCISES`` of ``dtrain_lab.grading.checks.<lab>`` (for example
``checks.lab10`` for ``lab10.rank_branch``). This module imports a checks module by name only when
one of its exercises is needed, and no checks module imports this one: the arrow goes one way
(checks modules import :mod:`dtrain_lab.grading.exercise`). Checks modules are never importable
inside the sandbox.

Instructors add hidden checks with :func:`add_hidden_check`, typically from a private module named in
``DTRAIN_HIDDEN_CHECKS=module1,module2`` (imported in the grader's process only, once the built-in
exercises are loaded); they run like the others, outside the sandbox, and never enter it.
"""
from __future__ import annotations

import importlib
import os

from dtrain_lab.grading.exercise import Exercise, Run, own_words, problem  # noqa: F401 (re-exported)

LABS = ("lab02", "lab04", "lab05", "lab08", "lab09", "lab10", "lab11", "lab13")   # every lab's checks module: checks/<lab>.py
CHECKS_PACKAGE = "dtrain_lab.grading.checks"

_REGISTRY: dict[str, Exercise] = {}
_loaded: set[str] = set()
_hidden_loaded = False


def _load(lab: str) -> None:
    if lab in _loaded or lab not in LABS:
        return
    _loaded.add(lab)
    module = importlib.import_module(f"{CHECKS_PACKAGE}.{lab}")
    for ex in module.EXERCISES:
        if ex.id in _REGISTRY:
            raise ValueError(f"exercise {ex.id!r} defined twice")
        _REGISTRY[ex.id] = ex


def _load_hidden() -> None:
    global _hidden_loaded
    if _hidden_loaded:
        return
    _hidden_loaded = True
    for name in filter(None, (n.strip() for n in os.environ.get("DTRAIN_HIDDEN_CHECKS", "").split(","))):
        importlib.import_module(name)


def get(exercise_id: str) -> Exercise:
    _load(str(exercise_id).split(".", 1)[0])
    _load_hidden()
    if exercise_id not in _REGISTRY:
        for lab in LABS:
            _load(lab)
        from dtrain_lab.i18n import LabError

        raise LabError("unknown_exercise", id=exercise_id, known=", ".join(sorted(_REGISTRY)))
    return _REGISTRY[exercise_id]


def all_exercises() -> list[Exercise]:
    for lab in LABS:
        _load(lab)
    _load_hidden()
    return [_REGISTRY[k] for k in sorted(_REGISTRY)]


def add_hidden_check(exercise_id: str, check) -> None:
    """For instructors: a check the learner's copy does not contain, ``check(run, rank, result)``."""
    get(exercise_id).hidden.append(check)
