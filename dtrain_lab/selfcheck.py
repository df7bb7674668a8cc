"""Self-checks for lesson exercises whose answer is a number: ``check("07.4", 36864)``.

A self-check tells the learner whether their number is right, in their language, and never prints the
expected value (a wrong answer gets the size of the miss, not the answer). It gives no credit and
records nothing: graded work goes through :mod:`dtrain_lab.grading`. Each expected value is computed
here from the course's own functions (the formula the exercise asks for, evaluated by the library), so
it follows the library if a model changes; nothing is stored in a notebook.

    from dtrain_lab.selfcheck import check
    check("08.2", 64)          # lesson 08, exercise 2
"""
from __future__ import annotations

import math
from collections.abc import Callable

from dtrain_lab.i18n import LabError, tr


def _ring_complete_chunk() -> int:
    """01.1: the chunk rank 2 holds complete after the reduce-scatter of a 4-rank ring."""
    from dtrain_lab.comm.collectives import ring_steps

    return ring_steps(2, 4, "reduce_scatter")[-1][1]


def _crossover_bytes() -> float:
    """01.4: n* = p·α/β for p = 8 with the calculator's α and β."""
    import inspect

    from dtrain_lab import viz

    defaults = inspect.signature(viz.alpha_beta_calculator).parameters
    return 8 * defaults["alpha"].default / defaults["beta"].default


def _zero_shard() -> tuple[int, int]:
    """05.1: (shard size, padding) of 127 parameters on 3 ranks (the flat buffer padded to a multiple of 3)."""
    shard = math.ceil(127 / 3)
    return shard, 3 * shard - 127


def _zero_min_ranks() -> tuple[int, int, int]:
    """05.2: the smallest N at which a 13B model's mixed-precision model states fit in 80 GB, stages 1-3."""
    from dtrain_lab.perfmodel import zero_memory

    return tuple(next(n for n in range(1, 4097) if zero_memory(13e9, s, n)["total"] <= 80e9) for s in (1, 2, 3))


def _tp_dp_break_even() -> float:
    """07.4: tokens per micro-batch at which one TP=8 GPT-3 layer (d = 12288, 4 All-Reduces of bf16
    activations) sends what DP=8 sends for its 12·d² bf16 gradients."""
    from dtrain_lab.parallel.tensor import dp_comm_bytes, tp_comm_bytes

    d = 12288
    per_token = tp_comm_bytes(1, d, 8, 2, allreduces=4)["sent_per_rank"]
    return dp_comm_bytes(12 * d * d, 8, 2)["sent_per_rank"] / per_token


def _pp_min_microbatches() -> int:
    """08.2: the smallest m with a bubble under 10 % for p = 8."""
    from dtrain_lab.parallel.pp_schedule import bubble_fraction

    return next(m for m in range(1, 10_000) if bubble_fraction(8, m) < 0.10)


def _young_daly_seconds() -> float:
    """09.6: Young/Daly's interval sqrt(2·C·MTBF) for C = 2 min, MTBF = 12 h, in seconds."""
    return math.sqrt(2 * 120 * 12 * 3600)


# exercise -> (expected, relative tolerance, unit key)
EXERCISES: dict[str, tuple[Callable[[], object], float]] = {
    "01.1": (_ring_complete_chunk, 0.0),
    "01.4": (_crossover_bytes, 0.01),
    "05.1": (_zero_shard, 0.0),
    "05.2": (_zero_min_ranks, 0.0),
    "07.4": (_tp_dp_break_even, 0.01),
    "08.2": (_pp_min_microbatches, 0.0),
    "09.6": (_young_daly_seconds, 0.03),
}


def _numbers(value) -> list[float]:
    values = list(value) if isinstance(value, (list, tuple)) else [value]
    out = []
    for v in values:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise LabError("selfcheck_not_a_number", value=repr(v)[:60])
        out.append(float(v))
    return out


def _compare(exercise: str, answer) -> tuple[list[float], list[float], float]:
    """(expected, given, relative tolerance) as numbers; a clear error for an unknown exercise or bad input."""
    if exercise not in EXERCISES:
        raise LabError("selfcheck_unknown", exercise=str(exercise)[:20], known=", ".join(EXERCISES))
    expected, tol = EXERCISES[exercise]
    return _numbers(expected()), _numbers(answer), tol


def _right(want: list[float], got: list[float], tol: float) -> bool:
    return len(want) == len(got) and all(abs(g - w) <= tol * abs(w) + 1e-9 for g, w in zip(got, want))


def is_right(exercise: str, answer) -> bool:
    """Whether ``answer`` is the exercise's answer (within its tolerance); prints nothing."""
    return _right(*_compare(exercise, answer))


def check(exercise: str, answer, lang: str | None = None) -> bool:
    """Print whether ``answer`` is right for lesson exercise ``exercise`` ("LL.N"), never the answer."""
    want, got, tol = _compare(exercise, answer)
    ok = _right(want, got, tol)
    if ok:
        print(tr("selfcheck_right", lang, exercise=exercise))
    elif len(want) != len(got):
        print(tr("selfcheck_count", lang, exercise=exercise, n=len(want), got=len(got)))
    else:
        side = "selfcheck_high" if any(g > w for g, w in zip(got, want)) else "selfcheck_low"
        print(tr("selfcheck_wrong", lang, exercise=exercise), tr(side, lang))
    return ok
