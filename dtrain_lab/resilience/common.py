"""What the resilience modules share: durable renames, step checks and bilingual warnings."""
from __future__ import annotations

import os
import warnings
from typing import Any

from dtrain_lab.i18n import LabError, both


class CheckpointError(LabError):
    """A checkpoint that must not be loaded (missing, truncated, corrupted, uncommitted)."""


def fsync_dir(path: str | os.PathLike) -> None:
    """Make a rename/unlink inside ``path`` durable (no-op where directories cannot be opened)."""
    try:
        fd = os.open(str(path), os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def check_step(step: Any) -> int:
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise LabError("rec_bad_step", value=step)
    return step


def warn_both(key: str, **fields) -> None:
    """A bilingual ``RuntimeWarning`` (learner's language first), pointing at the caller's caller."""
    warnings.warn(both(key, **fields), RuntimeWarning, stacklevel=3)
