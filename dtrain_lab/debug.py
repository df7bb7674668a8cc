"""Hang diagnosis: read the Python stacks a launch collects from every rank and say where each waits.

On a time-out :func:`dtrain_lab.launch` sends ``SIGUSR1`` to every rank; the ``faulthandler``
registered in each rank at start-up (``dtrain_lab/_inject/sitecustomize.py``) writes every thread's
stack, even while the rank is blocked inside a C++ collective. This module turns such a dump into
one line per rank: the collective (or other call) it waits in, and the line of the program that
called it.
"""
from __future__ import annotations

import linecache
import re
from dataclasses import dataclass, field

_THREAD_RE = re.compile(r"^(Current thread|Thread) (0x[0-9a-f]+)", re.I)
_FRAME_RE = re.compile(r'^\s+File "(?P<file>.+)", line (?P<line>\d+) in (?P<func>.+)$')

# Where library frames live: a frame in one of these is "inside" torch/Python, not the learner's code.
_LIBRARY_MARKERS = ("site-packages", "dist-packages", "/lib/python3", "<frozen ", "/torch/")
_DIST_MARKERS = ("torch/distributed/",)


@dataclass
class Frame:
    file: str
    line: int
    func: str

    @property
    def short(self) -> str:
        return f"{short_path(self.file)}:{self.line} in {self.func}"


@dataclass
class ThreadStack:
    ident: str
    current: bool
    frames: list[Frame] = field(default_factory=list)  # innermost first, as faulthandler prints


def short_path(path: str) -> str:
    """A path without the machine-specific prefix: ``torch/distributed/...`` or ``dtrain_lab/...``."""
    for marker in ("site-packages/", "dist-packages/"):
        if marker in path:
            return path.split(marker, 1)[1]
    m = re.search(r"(dtrain_lab/.*)$", path)
    if m:
        return m.group(1)
    return path.rsplit("/", 1)[-1]


def parse_faulthandler(text: str) -> list[ThreadStack]:
    threads: list[ThreadStack] = []
    for line in text.splitlines():
        m = _THREAD_RE.match(line)
        if m:
            threads.append(ThreadStack(ident=m.group(2), current=m.group(1).lower().startswith("current")))
            continue
        m = _FRAME_RE.match(line)
        if m and threads:
            threads[-1].frames.append(Frame(m.group("file"), int(m.group("line")), m.group("func").strip()))
    return threads


def _is_library(frame: Frame) -> bool:
    """Frames of torch, Python and dtrain_lab's own machinery (runtime, grader): not the learner's
    code. The course's demo programs count as the learner's: they are what a lesson is about."""
    if "/dtrain_lab/demos/" in frame.file:
        return False
    return any(marker in frame.file for marker in _LIBRARY_MARKERS) or "/dtrain_lab/" in frame.file


def main_thread(threads: list[ThreadStack]) -> ThreadStack | None:
    """The thread running the program: its outermost frame is ``<module>`` (or runpy's)."""
    for t in threads:
        if t.frames and t.frames[-1].func in ("<module>", "_run_module_as_main"):
            return t
    return threads[-1] if threads else None


@dataclass
class WaitSite:
    """Where one rank was when its stack was taken."""

    call: str          # e.g. "all_reduce", "barrier", "recv", or the innermost function
    where: str         # the learner's line that called it: "file.py:12 in main"
    frames: list[Frame]

    def __str__(self) -> str:
        return f"{self.call} ({self.where})"


def wait_site(stack_text: str) -> WaitSite | None:
    threads = parse_faulthandler(stack_text)
    t = main_thread(threads)
    if t is None or not t.frames:
        return None
    frames = t.frames
    call = None
    for f in frames:  # innermost torch.distributed function = the collective being waited on
        if any(m in f.file for m in _DIST_MARKERS) and f.func not in ("wrapper", "_fn", "inner"):
            call = f.func
            break
    user = next((f for f in frames if not _is_library(f)), frames[0])
    if call is None:
        # not in torch.distributed: name the statement the rank is executing (a C call such as
        # time.sleep has no Python frame of its own, so its caller's line is the best evidence)
        inner = frames[0]
        call = linecache.getline(inner.file, inner.line).strip() or inner.func
    return WaitSite(call=call, where=user.short, frames=frames)


def format_stack(stack_text: str, limit: int = 12) -> str:
    """The main thread's frames, outermost first (like a traceback), machine paths shortened."""
    t = main_thread(parse_faulthandler(stack_text))
    if t is None:
        return ""
    frames = list(reversed(t.frames))[-limit:]
    return "\n".join(f"    {f.short}" for f in frames)
