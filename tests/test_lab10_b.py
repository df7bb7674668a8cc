"""Lab 10 exercises (second half): the broken program, a plausible wrong fix and
the learner's stub all fail."""
import pytest

from lab10_cases import HALVES, check_exercise


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", HALVES[1])
def test_exercise(name, tmp_path):
    check_exercise(name, tmp_path)
