"""Exercises: what the grader runs and how it judges the result.

An exercise names the function a submission must define (its *contract*), how many ranks to run it
on, its time limit, and ``check``: code that runs inside every rank, right after the learner's
function returned, and compares the result with a reference computed independently. ``checks``
return a list of ``Problem`` (empty: correct). Instructors add hidden checks with
:func:`add_hidden_check`; they run like the others and are never in a learner's copy.

Two optional kinds of exercise extend this:

* ``static_check``: the submission is a text file that is *read, never run* (a ``.env`` file, say).
  ``static_check(text, path)`` returns the problems; nothing is launched. A problem carrying
  ``"error": True`` means the file could not be graded at all (a malformed line, for example).
  Hidden checks of such an exercise are called as ``check(None, text, path)``.
* ``runs``: scenarios, each launched in turn (per world size) with its own environment and
  ``max_restarts`` (lab 09 kills a rank on the first attempt and lets torchrun restart the job);
  ``setup(rt)`` runs in every rank before the submission is imported (where a fault is armed).
* ``pg_timeout``: a launched exercise about the process-group timeout; the harness shortens the
  default group's timeout to this many seconds once every rank has joined. ``explain(outcome,
  feedback, source)`` adds problems to a failed verdict (say, why the timeout tripped).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

# check(rt, result, submission_module) -> list of problems (each a dict with "zh" and "en" text)
Check = Callable[[Any, Any, Any], list]


@dataclass
class Exercise:
    id: str
    title: dict                     # {"zh": ..., "en": ...}
    entry: str                      # the function the submission defines, called in every rank
    checks: list = field(default_factory=list)
    world_sizes: tuple = (2,)       # run once per world size; all must pass
    timeout: float = 20.0           # seconds after start-up, per run
    filename: str = ""              # what %%writefile writes in the lab notebook
    stub_marker: str = "YOUR CODE HERE"
    max_score: int = 1
    consistent_collectives: bool = True   # every rank must issue the same collectives in order
    memory_limit_gb: float = 4.0
    lab: str = ""
    hidden: list = field(default_factory=list)
    trace_checks: list = field(default_factory=list)   # f(traces: {rank: [call, ...]}) -> problems
    static_check: Callable[[str, Any], list] | None = None   # f(text, path) -> problems; never launched
    pg_timeout: float | None = None    # seconds: the default group's timeout while the submission runs
    explain: Callable[[str, str, str], list] | None = None   # f(outcome, feedback, source) -> problems
    runs: tuple = ()                   # scenarios: ({"name": {zh, en}, "env": {...}, "max_restarts": k}, ...)
    setup: Callable[[Any], None] | None = None   # f(rt), in every rank before the submission is imported

    def all_checks(self) -> list:
        return list(self.checks) + list(self.hidden)


_REGISTRY: dict[str, Exercise] = {}


def register(ex: Exercise) -> Exercise:
    if ex.id in _REGISTRY:
        raise ValueError(f"exercise {ex.id!r} registered twice")
    _REGISTRY[ex.id] = ex
    return ex


def add_hidden_check(exercise_id: str, check: Check) -> None:
    """For instructors: a check the learner's copy does not contain (e.g. from a private module
    imported through ``DTRAIN_HIDDEN_CHECKS=module1,module2``)."""
    get(exercise_id).hidden.append(check)


def get(exercise_id: str) -> Exercise:
    _load_builtin()
    if exercise_id not in _REGISTRY:
        from dtrain_lab.i18n import LabError

        raise LabError("unknown_exercise", id=exercise_id, known=", ".join(sorted(_REGISTRY)))
    return _REGISTRY[exercise_id]


def all_exercises() -> list[Exercise]:
    _load_builtin()
    return [_REGISTRY[k] for k in sorted(_REGISTRY)]


_loaded = False


def _load_builtin() -> None:
    global _loaded
    if _loaded:
        return
    _loaded = True
    import importlib
    import os

    from dtrain_lab.grading import lab10  # noqa: F401  (registers its exercises)
    from dtrain_lab.grading import lab11  # noqa: F401
    from dtrain_lab.grading import lab02, lab04  # noqa: F401
    from dtrain_lab.grading import lab05  # noqa: F401
    from dtrain_lab.grading import lab08  # noqa: F401
    from dtrain_lab.grading import lab09  # noqa: F401

    for name in filter(None, os.environ.get("DTRAIN_HIDDEN_CHECKS", "").split(",")):
        importlib.import_module(name.strip())


def problem(zh: str, en: str) -> dict:
    return {"zh": zh, "en": en}
