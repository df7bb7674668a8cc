"""Text columns that line up in both languages: a Chinese character takes two columns of a terminal
or a notebook's output, which ``f"{text:>10}"`` (it counts characters) does not know.

Used by :mod:`dtrain_lab.viz` (which re-exports these for the lessons) and by the launcher's rank
table (:mod:`dtrain_lab.jobs.monitor`), below the course layer.
"""
from __future__ import annotations

import unicodedata


def width(text: str) -> int:
    """Columns ``text`` takes in a monospaced output: a Chinese character takes two."""
    return sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)


def pad(text, columns: int, align: str = "<") -> str:
    """``text`` padded to ``columns`` display columns (``align``: ``<`` left, ``>`` right), so that
    tables with Chinese headers line up."""
    text = str(text)
    fill = " " * max(0, columns - width(text))
    return fill + text if align == ">" else text + fill


def columns(*cells) -> str:
    """One line of a text table from ``(text, spec)`` pairs, ``spec`` like ``"<14"`` or ``">12"``
    (alignment, then width in display columns): a header in Chinese lines up with its numbers."""
    return "".join(pad(text, int(spec[1:]), spec[0]) for text, spec in cells)
