"""Read a ``.env`` file exactly as ``docker run --env-file`` does.

The rules, from the Docker CLI's own parser (``pkg/kvfile`` in github.com/docker/cli, used by
``opts.ParseEnvFile``) and its reference page (``docker container run``, "Set environment variables"):

* The file must be UTF-8; a UTF-8 byte-order mark at the start of the first line is removed.
* Lines end at ``\\n``; a ``\\r`` before it is dropped (Go's ``bufio.ScanLines``). A line longer
  than 64 KiB is an error (``bufio.MaxScanTokenSize``).
* Leading whitespace of a line is removed. An empty line, or one whose first other character is
  ``#``, is skipped.
* ``KEY=VALUE``: the key is everything before the first ``=``. It may not be empty, nor contain a
  space or a tab (so ``export KEY=VALUE`` and ``KEY = VALUE`` are errors). Docker accepts any other
  character in a key (``1NCCL``, ``NCCL-DEBUG``); :func:`dtrain_lab.nccl.lint.lint_env_file` points
  out names no shell could set.
* The value is everything after the first ``=``, **taken literally**: quotes stay part of the value
  (``A="x"`` sets the four characters ``"x"``), so do ``#`` and anything after it, ``$``, backslashes
  and trailing whitespace. Nothing is expanded or executed.
* ``KEY`` alone (no ``=``) takes the value of ``KEY`` from the environment of the process that runs
  ``docker run``; when that has no ``KEY``, the line sets nothing. Here that environment is the
  ``environ`` argument, empty unless the caller passes one: a grader must never leak its own
  environment into a learner's configuration.
* A later line for the same key wins (the container sees the last one).
"""
from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from dtrain_lab import i18n

_BOM = b"\xef\xbb\xbf"
MAX_LINE = 64 * 1024  # bufio.MaxScanTokenSize: a longer line makes docker fail ("token too long")


class EnvFileError(i18n.LabError):
    """A line ``docker run --env-file`` would refuse (or an unreadable file): bilingual, learner's
    language first, like every ``LabError``; ``lineno`` and ``line`` say where."""

    def __init__(self, key: str, **fields):
        super().__init__(key, **fields)
        self.lineno = fields.get("lineno")
        self.line = fields.get("line")


@dataclass
class EnvFile:
    """A parsed ``.env`` file: ``values`` (what the container sees), ``passthrough`` (names given
    without ``=``, with the line each was on), ``lines`` (the line of each value's last assignment)."""

    path: str
    values: dict[str, str] = field(default_factory=dict)
    passthrough: dict[str, int] = field(default_factory=dict)
    lines: dict[str, int] = field(default_factory=dict)


def _is_go_space(ch: str) -> bool:
    # Go's unicode.IsSpace: Python's str.isspace also counts \x1c-\x1f, which Go does not.
    return ch.isspace() and ch not in "\x1c\x1d\x1e\x1f"


def _lstrip_go(s: str) -> str:
    i = 0
    while i < len(s) and _is_go_space(s[i]):
        i += 1
    return s[i:]


def _read_bytes(path: Path, refuse_symlinks: bool) -> bytes:
    # O_NONBLOCK: opening a FIFO must not wait for a writer (it is refused just below)
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | (getattr(os, "O_NOFOLLOW", 0) if refuse_symlinks else 0)
    try:
        if refuse_symlinks and path.is_symlink():
            raise EnvFileError("env_file_symlink", path=str(path))
        fd = os.open(path, flags)
    except EnvFileError:
        raise
    except OSError as exc:
        raise EnvFileError("env_file_unreadable", path=str(path), reason=exc.strerror or str(exc)) from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise EnvFileError("env_file_not_regular", path=str(path))
        with os.fdopen(os.dup(fd), "rb") as f:
            return f.read()
    finally:
        os.close(fd)


def read_env_file(path, environ: Mapping[str, str] | None = None, *, refuse_symlinks: bool = False) -> EnvFile:
    """Parse ``path`` as ``docker run --env-file`` does (see the module docstring for the rules).

    ``environ`` plays the part of the environment ``docker run`` runs in (for ``KEY`` lines without
    ``=``); by default it is empty. With ``refuse_symlinks`` a symbolic link is an error instead of
    being followed. Raises :class:`EnvFileError` on a line Docker would refuse."""
    path = Path(path)
    environ = {} if environ is None else environ
    data = _read_bytes(path, refuse_symlinks)
    out = EnvFile(str(path))
    raw_lines = data.split(b"\n")
    if raw_lines and raw_lines[-1] == b"":
        raw_lines.pop()  # the text after the last newline is a line only if it is not empty
    for lineno, raw in enumerate(raw_lines, 1):
        if raw.endswith(b"\r"):
            raw = raw[:-1]
        if lineno == 1 and raw.startswith(_BOM):
            raw = raw[len(_BOM):]
        if len(raw) >= MAX_LINE:
            raise EnvFileError("env_file_line_too_long", path=str(path), lineno=lineno, line=f"{raw[:60]!r}…",
                               limit=MAX_LINE)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise EnvFileError("env_file_bad_utf8", path=str(path), lineno=lineno, line=repr(raw[:80])) from None
        line = _lstrip_go(text)
        if not line or line.startswith("#"):
            continue
        key, eq, value = line.partition("=")
        where = {"path": str(path), "lineno": lineno, "line": line}
        if not key:
            raise EnvFileError("env_file_no_name", **where)
        if " " in key or "\t" in key:
            if key.startswith(("export ", "export\t")):
                raise EnvFileError("env_file_export", name=key[len("export"):].strip(), **where)
            raise EnvFileError("env_file_key_whitespace", name=key, **where)
        if eq:
            out.values[key] = value
            out.lines[key] = lineno
            out.passthrough.pop(key, None)
        else:
            out.passthrough[key] = lineno
            if key in environ:
                out.values[key] = environ[key]
                out.lines[key] = lineno
            # else: docker adds nothing for this line (an earlier KEY=VALUE line still holds)
    return out


def parse_env_file(path, environ: Mapping[str, str] | None = None, *, refuse_symlinks: bool = False) -> dict[str, str]:
    """The variables a container started with ``docker run --env-file path`` would see (see the
    module docstring for the rules). Raises :class:`EnvFileError` on a line Docker would refuse."""
    return read_env_file(path, environ, refuse_symlinks=refuse_symlinks).values
