"""What an exercise is, and what its checks see: imported by the checks modules, never by a submission.

An exercise names the function a submission defines (``entry``), the world sizes and time limit
of its runs, the private inputs each rank gets (``make_inputs``, from the lab's contract module)
and its checks. Every check runs **in the grader's process, after the sandbox is gone**, on what
came back through :mod:`dtrain_lab.grading.channel`:

* ``checks``: ``f(run, rank, result) -> [problem, ...]``, once per rank; ``result`` is the value the
  rank's ``run()`` returned, decoded (tensors, numbers, strings, lists, dicts; other objects are an
  :class:`~dtrain_lab.grading.channel.Opaque` carrying a short repr);
* ``job_checks``: ``f(run) -> [problem, ...]``, once per run (the ranks' traces of collectives,
  their results side by side, when each rank finished);
* ``pattern_checks``: ``f(run) -> [problem, ...]``, the technique the exercise teaches, read from the
  traces (:mod:`dtrain_lab.grading.patterns`); they run once the values are right, so that a wrong
  answer is explained by what is wrong in it, and a right one obtained by a shortcut by what the
  exercise wanted.

:class:`Run` holds the inputs every rank was given (which no single rank saw), the seed they were
drawn from, each rank's result, its trace of collectives (self-reported by the rank: a hint for
feedback, never a proof) and its exit code and end time (observed from outside by the supervisor).

A problem is a message of the catalogue rendered in both languages: :func:`problem`. Values a
submission produced are quoted with :func:`~dtrain_lab.grading.channel.short`.

Other kinds of exercise:

* ``static_check(text, path) -> problems``: a text file that is read, never run (lab 11's ``.env``);
  a problem with ``"error": True`` means the file could not be graded at all. Hidden checks of such
  an exercise are called as ``check(None, text, path)``.
* ``runs``: scenarios run in turn per world size, each with its own environment for the ranks,
  ``max_restarts`` and ``fault`` (``{"attempt", "rank", "mark"}``: the supervisor SIGKILLs that rank
  from outside once its marks file holds ``mark``; lab 09 kills a rank and restarts the job, as
  torchrun would). Attempts and fired faults reach the checks as ``Run.attempts`` and ``Run.faults``,
  counted by the supervisor;
* ``setup``: ``"module:function"`` of a contract module, called in every rank before the submission
  is imported (where lab 09 arms a fault);
* ``pg_timeout``: the default group's timeout (seconds) while the submission runs;
* ``explain(outcome, feedback, source) -> problems`` adds explanations to a failed verdict;
* ``hide``: library modules a submission must not use for this exercise (they would be the
  answer): inside the sandbox importing them raises ImportError.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from dtrain_lab.i18n import LANGS, tr


@dataclass
class Exercise:
    id: str
    title: dict                     # {"zh": ..., "en": ...}
    entry: str = "run"              # the function the submission defines, called in every rank
    checks: list = field(default_factory=list)
    job_checks: list = field(default_factory=list)
    pattern_checks: list = field(default_factory=list)
    world_sizes: tuple = (2,)       # run once per world size; all must pass
    timeout: float = 20.0           # seconds after start-up, per run
    filename: str = ""              # what %%writefile writes in the lab notebook
    stub_marker: str = "YOUR CODE HERE"
    max_score: int = 1
    consistent_collectives: bool = True   # every rank must issue the same collectives in order
    memory_limit_gb: float = 4.0
    lab: str = ""
    shared: bool = False            # the ranks see one folder they can all write (/shared): file exercises only
    make_inputs: Callable[[int, int], list] | None = None   # (seed, world_size) -> per-rank inputs
    # (seed, world_size, inputs) -> per-rank inputs of the attempts after a restart (lab 09: the
    # batches before the last checkpoint are replaced, so that starting over gives a wrong answer)
    restart_inputs: Callable[[int, int, list], list] | None = None
    hidden: list = field(default_factory=list)
    static_check: Callable[[str, Any], list] | None = None
    pg_timeout: float | None = None
    explain: Callable[[str, str, str], list] | None = None
    runs: tuple = ()                # ({"name": {zh, en}, "env": {...}, "max_restarts": k}, ...)
    setup: str | None = None        # "dtrain_lab.grading.labNN:function", in every rank
    hide: tuple = ()                # library modules unimportable inside the sandbox

    def all_checks(self) -> list:
        return list(self.checks) + list(self.hidden)


@dataclass
class Run:
    """One run of a submission, as the grader knows it after the sandbox is gone."""

    world_size: int
    seed: int
    inputs: list                                         # every rank's private inputs
    results: dict = field(default_factory=dict)          # rank -> decoded result
    traces: dict = field(default_factory=dict)           # rank -> [collective, ...] (self-reported)
    timeline: dict = field(default_factory=dict)         # rank -> the trace with its marks (trace.mark)
    exits: dict = field(default_factory=dict)            # rank -> exit code (observed)
    attempts: int = 0                                    # attempts the supervisor started (observed)
    faults: list = field(default_factory=list)           # [(attempt, rank, mark)] its kills that fired (observed)
    ended: dict = field(default_factory=dict)            # rank -> wall time it ended (observed)
    wire_bytes: int | None = None                        # bytes the ranks sent each other over TCP, every
                                                         # attempt (observed: bwrap only, else None)
    scenario: dict = field(default_factory=dict)
    elapsed: float = 0.0


def problem(key: str, **fields) -> dict:
    """A problem: the catalogue message ``key`` in both languages. A field that is itself a problem
    (a dict of both languages) is used in the matching language."""
    def in_lang(value, lang):
        return value[lang] if isinstance(value, dict) and set(value) == set(LANGS) else value

    return {lang: tr(key, lang, **{k: in_lang(v, lang) for k, v in fields.items()}) for lang in LANGS}


def combine(*parts: dict, sep: str = " ") -> dict:
    """Problems joined into one, language by language (a case's prefix and what is wrong in it)."""
    return {lang: sep.join(p[lang] for p in parts) for lang in LANGS}


def joined(parts: list[dict]) -> dict:
    """Problems listed in one, language by language, with the list separator of each language."""
    return {lang: tr("grade_list_sep", lang).join(p[lang] for p in parts) for lang in LANGS}


def own_words(en: str, zh: str) -> dict:
    """A problem in an instructor's own words (hidden checks outside the course's catalogue)."""
    return dict(zip(LANGS, (str(zh), str(en))))   # LANGS is ("zh", "en")
