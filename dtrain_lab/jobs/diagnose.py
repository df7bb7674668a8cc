"""Hang diagnosis: read the Python stacks a launch collects from every rank and say where each waits.

On a time-out :func:`dtrain_lab.launch` sends ``SIGUSR1`` to every rank; the ``faulthandler``
registered in each rank at start-up (``dtrain_lab/jobs/_inject/sitecustomize.py``) writes every thread's
stack, even while the rank is blocked inside a C++ collective. This module turns such a dump into
one line per rank: the collective (or other call) it waits in, and the line of the program that
called it.
"""
from __future__ import annotations

import glob
import linecache
import re
from dataclasses import dataclass, field
from pathlib import Path

from dtrain_lab.i18n import tr
from dtrain_lab.jobs import _procs

_THREAD_RE = re.compile(r"^(Current thread|Thread) (0x[0-9a-f]+)", re.I)
_FRAME_RE = re.compile(r'^\s+File "(?P<file>.+)", line (?P<line>\d+) in (?P<func>.+)$')

# Where library frames live: a frame in one of these is "inside" torch/Python, not the learner's code.
_LIBRARY_MARKERS = ("site-packages", "dist-packages", "/lib/python3", "<frozen ", "/torch/")
_DIST_MARKERS = ("torch/distributed/", "torch/nn/parallel/distributed.py")  # DDP calls C++ comms directly


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


def program_frames(frames: list[Frame]) -> list[Frame]:
    """``frames`` (innermost first) without those that a forked rank's stack also shows below the
    program: the fork runner's (:mod:`dtrain_lab.sandbox.child`), and torchrun's agent's below it
    (``--start-method fork``: see :mod:`dtrain_lab.jobs._forked_rank`). What is left is what the same
    program shows as a fresh ``python -m``."""
    for i, f in enumerate(frames):
        if f.file.endswith(("dtrain_lab/sandbox/child.py", "dtrain_lab/jobs/_forked_rank.py")):
            return frames[:i] or frames
    return frames


def wait_site(stack_text: str) -> WaitSite | None:
    threads = parse_faulthandler(stack_text)
    t = main_thread(threads)
    if t is None or not t.frames:
        return None
    frames = program_frames(t.frames)
    call = None
    for f in frames:  # innermost torch.distributed function = the collective being waited on
        if any(m in f.file for m in _DIST_MARKERS) and f.func not in ("wrapper", "_fn", "inner"):
            call = f.func
            break
    user = next((f for f in frames if not _is_library(f)), frames[0])
    if call is None and any("torch/autograd/" in f.file for f in frames):
        # inside the C++ autograd engine: DDP's gradient all-reduce runs from hooks in backward
        call = "backward"
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
    frames = list(reversed(program_frames(t.frames)))[-limit:]
    return "\n".join(f"    {f.short}" for f in frames)


def collect_stacks(job_dir: Path, ranks: dict) -> None:
    """Ask every rank of a hung job for its stack (SIGUSR1 -> faulthandler) and parse where each
    waits: ``ranks[r].stack`` and ``ranks[r].waiting`` (a :class:`WaitSite`)."""
    asked = []
    for marker in glob.glob(str(job_dir / "started.*")):
        try:
            r = int(Path(marker).name.split(".")[1])
            attempt = Path(marker).name.split(".")[2]
            pid = int(Path(marker).read_text().strip())
        except (OSError, ValueError, IndexError):
            continue
        if _procs.sigusr1(pid):
            asked.append((r, job_dir / f"stack.{r}.{attempt}.{pid}"))
    _procs.wait_stable_all([str(path) for _, path in asked], timeout=3.0)
    for r, path in asked:
        text = _procs.read_text(str(path))
        if r in ranks and text:
            ranks[r].stack = text
            ranks[r].waiting = wait_site(text)


# ------------------------------------------------------------------------------------ diagnosis
# What a rank reports when *another* rank died (its peer closed the socket): a consequence, never
# the cause of a failure.
SECONDARY_ERRORS = ("Connection closed by peer", "Connection reset by peer", "Broken pipe",
                    "remote worker crashing", "Socket Timeout", "communicator was aborted")


def is_secondary_error(message: str) -> bool:
    """True for the errors a rank gets because *another* rank died (its peer closed the socket)."""
    return any(s in message for s in SECONDARY_ERRORS)


# Patterns in the first failure's message -> a diagnosis key (messages in dtrain_lab.i18n).
_EXCEPTION_PATTERNS = (
    ("Detected mismatch between collectives", "diag_desync_detected"),
    ("failed to pass monitoredBarrier", "diag_monitored_barrier"),
    ("Expected to have finished reduction", "diag_unused_parameters"),
    ("EADDRINUSE", "diag_address_in_use"),
    ("Received data size doesn't match", "diag_size_mismatch"),
    ("Timed out waiting", "diag_pg_timeout"),
    ("Watchdog caught collective operation timeout", "diag_pg_timeout"),
)


def diagnose(result, lang: str | None = None) -> list[str]:
    """What a :class:`~dtrain_lab.jobs.launch.LaunchResult` of a failed or hung job most likely means.

    Reads the same evidence an engineer would: which collective each rank of a hung job waits in
    (different collectives: the ranks' programs diverged; one rank outside any collective: it is
    stuck in its own code; all in the same one: look at the network or at a rank outside this job),
    and the first failure's message (desync detected, a named rank missing a monitored barrier,
    DDP's unused-parameter error, a busy port, a size mismatch, a process-group timeout).
    Returns one hint per line, in the learner's language; empty for a job that ended well.
    """
    hints: list[str] = []
    if getattr(result, "hung", False):
        if result.phase == "startup":
            return [tr("diag_startup", lang)]
        sites = {r.rank: r.waiting for r in result.ranks}
        calls = {rank: (w.call if w else None) for rank, w in sites.items()}
        in_dist = {rank: c for rank, c in calls.items() if c is not None and _is_collective(sites[rank])}
        outside = sorted(rank for rank in calls if rank not in in_dist)
        if outside and in_dist:
            hints.append(tr("diag_rank_outside", lang, ranks=", ".join(map(str, outside)),
                            waiting=", ".join(f"{r}: {c}" for r, c in sorted(in_dist.items()))))
        elif len(set(in_dist.values())) > 1:
            # A rank inside backward is in DDP's all-reduce, and DDP segfaults under
            # TORCH_DISTRIBUTED_DEBUG=DETAIL on the pinned torch 2.13 CPU build (lesson 10,
            # section 3): no DETAIL advice for that case.
            ddp = "backward" in in_dist.values()
            hints.append(tr("diag_different_collectives_ddp" if ddp else "diag_different_collectives", lang,
                            calls="; ".join(f"rank {r}: {c}" for r, c in sorted(in_dist.items()))))
            if ddp:
                hints.append(tr("diag_uneven", lang))
        elif in_dist:
            hints.append(tr("diag_same_collective", lang, call=next(iter(in_dist.values()))))
        return hints
    if getattr(result, "ok", True):
        return hints
    message = result.exception or ""
    for pattern, key in _EXCEPTION_PATTERNS:
        if pattern in message:
            hints.append(tr(key, lang, rank=result.first_failure))
            break
    if not hints:
        key = "diag_secondary" if is_secondary_error(message) else "diag_first_failure"
        hints.append(tr(key, lang, rank=result.first_failure))
    return hints


def _is_collective(site: WaitSite | None) -> bool:
    """The rank waits inside torch.distributed (or in backward, where DDP's all-reduce runs)."""
    if site is None:
        return False
    return site.call == "backward" or any(any(m in f.file for m in _DIST_MARKERS) for f in site.frames)
