"""Monitoring and profiling a distributed training step.

* :class:`StepTimer` splits each step into **data**, **compute** (forward + backward),
  **comm** (communication) and **optimizer** time, plus whatever fell outside those phases
  (``other``). Phases may nest: time spent in an inner phase is taken out of the outer one, so a
  synchronous all-reduce timed as ``comm`` inside ``compute`` (see :func:`timed_allreduce_hook`)
  is not counted twice.

  - CPU: ``time.perf_counter`` at each boundary. With gloo the collectives used here are
    synchronous, so the time of a call is the time of the communication (waiting for the slowest
    rank included).
  - GPU: kernels run asynchronously; ``perf_counter`` would time the *launch*, not the work. Each
    boundary records a ``torch.cuda.Event(enable_timing=True)`` on the current stream and the
    elapsed times are read once per step, after ``end_step`` synchronises on the last event.
    Chosen automatically when the device is a CUDA device; never touched on CPU.

* throughput (samples/s, tokens/s) from the samples/tokens given to :meth:`StepTimer.end_step`;
* :func:`memory_stats`: CPU: resident set size (psutil) and the bytes of given tensors;
  GPU: ``torch.cuda.max_memory_allocated`` / ``memory_reserved``;
* :func:`gather_summaries`: every rank's summary gathered to rank 0 (``gather_object``), with the
  **straggler** named: the rank with the most *busy* time (step time minus communication). With
  synchronous collectives every rank's step lasts about as long as the slowest one's; the fast
  ranks spend the difference waiting inside the collective, so their ``comm`` grows, while the
  straggler's own work (data + compute + optimizer) is the largest;
* :func:`profile_step`: a ``torch.profiler`` trace of a few steps written as Chrome-trace JSON
  (open it in chrome://tracing or https://ui.perfetto.dev), and :func:`trace_facts`, which counts
  the collective events in it;
* :func:`progress`: a progress bar that only rank 0 prints (tqdm when installed, else plain lines).

Checked against torch 2.13 (``torch/profiler/profiler.py``: ``profile(activities=..., record_shapes=...,
profile_memory=...)``, ``prof.step()``, ``export_chrome_trace(path)``; ``ProfilerActivity.CUDA``).

This module deliberately does not use ``from __future__ import annotations``: DDP inspects the
signature of a communication hook, and string annotations can make it reject the hook.
"""
import contextlib
import json
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence

import torch

from dtrain_lab.i18n import LabError, tr
from dtrain_lab.i18n.display import pad

PHASES = ("data", "compute", "comm", "optimizer")
COLLECTIVE_PATTERNS = ("all_reduce", "allreduce", "all_gather", "allgather", "reduce_scatter",
                       "gloo", "nccl", "c10d::")

# Column and phase labels in the learner's language (the phase names themselves stay the API's).
_LABEL_KEYS = {"rank": "mon_col_rank", "data": "mon_col_data", "compute": "mon_col_compute", "comm": "mon_col_comm",
               "optimizer": "mon_col_optimizer", "other": "mon_col_other", "step": "mon_col_step",
               "busy": "mon_col_busy", "samples/s": "mon_col_sps"}

__all__ = ["PHASES", "StepTimer", "timed_allreduce_hook", "memory_stats", "gather_summaries", "RankTable",
           "profile_step", "trace_facts", "progress", "format_split"]


def _is_cuda(device: Any) -> bool:
    try:
        return torch.device(device).type == "cuda"
    except (TypeError, RuntimeError):
        return False


class _Interval:
    __slots__ = ("name", "start", "end", "child", "fixed")

    def __init__(self, name: str, start: Any, fixed: Optional[float] = None):
        self.name, self.start, self.end, self.child, self.fixed = name, start, None, [], fixed


class StepTimer:
    """Times the phases of each training step.

    ::

        timer = StepTimer(device)
        for step in range(n):
            timer.start_step()
            with timer.phase("data"):      x, y = next(batches)
            with timer.phase("compute"):   loss_fn(model(x), y).backward()
            with timer.phase("optimizer"): opt.step(); opt.zero_grad()
            timer.end_step(samples=len(x))
        timer.summary()     # mean seconds per phase, throughput, ...

    ``comm`` is usually timed from inside backward by :func:`timed_allreduce_hook`, or around an
    explicit collective with ``timer.phase("comm")``. Phase names other than :data:`PHASES` are
    allowed (they appear in the summary too).
    """

    def __init__(self, device: Any = "cpu", enabled: bool = True, clock: Callable[[], float] = time.perf_counter):
        self.clock = clock              # CPU path only (a test can pass a clock it controls)
        self.device = torch.device(device)
        self.cuda = _is_cuda(self.device)
        self.enabled = enabled
        self.steps: List[Dict[str, float]] = []
        self._stack: List[_Interval] = []
        self._top: List[_Interval] = []
        self._step_start: Any = None
        self._samples: List[int] = []
        self._tokens: List[int] = []

    # ---------------------------------------------------------------------------- clocks
    def _mark(self) -> Any:
        if self.cuda:   # GPU path: an event on the current stream, read after the step's sync
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return self.clock()

    def _seconds(self, a: Any, b: Any) -> float:
        if self.cuda:
            return a.elapsed_time(b) / 1000.0   # elapsed_time is in milliseconds
        return b - a

    # ---------------------------------------------------------------------------- steps
    def start_step(self) -> None:
        if not self.enabled:
            return
        if self._step_start is not None:
            raise LabError("mon_step_open")
        self._top, self._stack = [], []
        self._step_start = self._mark()

    @contextlib.contextmanager
    def phase(self, name: str):
        """Time the block as phase ``name`` (exclusive of phases nested inside it)."""
        if not self.enabled:
            yield
            return
        if self._step_start is None:
            raise LabError("mon_no_step", name=name)
        iv = _Interval(name, self._mark())
        (self._stack[-1].child if self._stack else self._top).append(iv)
        self._stack.append(iv)
        try:
            yield
        finally:
            iv.end = self._mark()
            self._stack.pop()

    def add(self, name: str, seconds: float) -> None:
        """Add a duration measured elsewhere to phase ``name`` of the open step, taken out of the
        phase it happened in (the innermost open one). CPU only: on GPU use :meth:`phase`."""
        if not self.enabled or self._step_start is None:
            return
        iv = _Interval(name, None, fixed=float(seconds))
        (self._stack[-1].child if self._stack else self._top).append(iv)

    def end_step(self, samples: int = 0, tokens: int = 0) -> Dict[str, float]:
        """Close the step; returns its split ``{phase: seconds, "other": ..., "step": ...}``."""
        if not self.enabled:
            return {}
        if self._step_start is None:
            raise LabError("mon_step_not_open")
        if self._stack:
            raise LabError("mon_phase_open", name=self._stack[-1].name)
        end = self._mark()
        if self.cuda:
            end.synchronize()   # every event of this step has completed once the last one has
        split: Dict[str, float] = {p: 0.0 for p in PHASES}

        def walk(ivs: List[_Interval]) -> float:
            total = 0.0
            for iv in ivs:
                dur = iv.fixed if iv.fixed is not None else self._seconds(iv.start, iv.end)
                inner = walk(iv.child)
                split[iv.name] = split.get(iv.name, 0.0) + max(dur - inner, 0.0)
                total += dur
            return total

        covered = walk(self._top)
        step = self._seconds(self._step_start, end)
        split["other"] = max(step - covered, 0.0)
        split["step"] = step
        self.steps.append(split)
        self._samples.append(int(samples))
        self._tokens.append(int(tokens))
        self._step_start, self._top = None, []
        return split

    # ---------------------------------------------------------------------------- results
    def summary(self, skip: int = 0) -> Dict[str, Any]:
        """Mean seconds per step of every phase over the steps after the first ``skip`` (warm-up),
        totals, and throughput = samples (tokens) / total step time."""
        steps = self.steps[skip:]
        if not steps:
            raise LabError("mon_no_steps", skip=skip, n=len(self.steps))
        names = list(dict.fromkeys(k for s in steps for k in s))
        total = {k: sum(s.get(k, 0.0) for s in steps) for k in names}
        n = len(steps)
        samples, tokens = sum(self._samples[skip:]), sum(self._tokens[skip:])
        wall = total["step"]
        return {
            "steps": n,
            "mean": {k: v / n for k, v in total.items()},
            "total": total,
            "samples": samples,
            "tokens": tokens,
            "samples_per_s": samples / wall if wall > 0 else 0.0,
            "tokens_per_s": tokens / wall if wall > 0 else 0.0,
            "busy": (total["step"] - total.get("comm", 0.0)) / n,
            "clock": "cuda_event" if self.cuda else getattr(self.clock, "__name__", type(self.clock).__name__),
        }


def timed_allreduce_hook(timer: StepTimer, bucket) -> torch.futures.Future[torch.Tensor]:
    """A DDP communication hook (``ddp.register_comm_hook(timer, timed_allreduce_hook)``) that
    averages each gradient bucket with a *blocking* all-reduce timed as ``comm``.

    Blocking on purpose: it gives up DDP's overlap of communication with backward, so that the
    communication time can be read apart from the computation (PyTorch's default hook is
    asynchronous; its time would hide inside backward). Use it to measure, not to train fast."""
    import torch.distributed as dist

    buf = bucket.buffer()
    timing = timer.enabled and timer._step_start is not None   # outside a step: reduce, untimed
    with (timer.phase("comm") if timing else contextlib.nullcontext()):
        dist.all_reduce(buf)
        buf.div_(dist.get_world_size())
    timer._hook_calls = getattr(timer, "_hook_calls", 0) + 1
    fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    fut.set_result(buf)
    return fut


# ------------------------------------------------------------------------------------ memory
def memory_stats(device: Any = "cpu", tensors: Iterable[torch.Tensor] = ()) -> Dict[str, Any]:
    """Memory in MiB. CPU: ``rss_mib`` of this process (psutil, when installed) and
    ``tensor_mib`` of the given tensors; GPU: ``max_allocated_mib`` / ``reserved_mib`` of the device."""
    out: Dict[str, Any] = {"tensor_mib": sum(t.numel() * t.element_size() for t in tensors) / 2**20}
    if _is_cuda(device):
        out["max_allocated_mib"] = torch.cuda.max_memory_allocated(device) / 2**20
        out["reserved_mib"] = torch.cuda.memory_reserved(device) / 2**20
        return out
    try:
        import psutil
        out["rss_mib"] = psutil.Process().memory_info().rss / 2**20
    except ImportError:
        out["rss_mib"] = None
    return out


# ------------------------------------------------------------------------------------ per-rank table
@dataclass
class RankTable:
    """Every rank's summary (from :meth:`StepTimer.summary`), on rank 0."""

    rows: List[Dict[str, Any]] = field(default_factory=list)   # one per rank, rank order

    @property
    def slowest(self) -> int:
        """The straggler: the rank with the most busy (non-communication) time per step."""
        return max(range(len(self.rows)), key=lambda r: self.rows[r]["busy"])

    @property
    def fastest(self) -> int:
        return min(range(len(self.rows)), key=lambda r: self.rows[r]["busy"])

    def table(self, lang: Optional[str] = None) -> str:
        cols = list(PHASES) + ["other", "step"]
        head = " ".join([pad(_label("rank", lang), 4, ">")] + [pad(_label(c, lang), 10, ">") for c in cols]
                        + [pad(_label("busy", lang), 10, ">"), pad(_label("samples/s", lang), 10, ">")])
        lines = [tr("mon_table_title", lang), head]
        for r, row in enumerate(self.rows):
            m = row["mean"]
            lines.append(f"{r:>4} " + " ".join(f"{m.get(c, 0.0) * 1e3:>8.2f}ms" for c in cols)
                         + f" {row['busy'] * 1e3:>8.2f}ms {row['samples_per_s']:>10.1f}")
        s, f = self.slowest, self.fastest
        lines.append(tr("mon_straggler", lang, rank=s, busy=self.rows[s]["busy"] * 1e3,
                        fast=f, fast_busy=self.rows[f]["busy"] * 1e3,
                        wait=(self.rows[f]["mean"].get("comm", 0.0) - self.rows[s]["mean"].get("comm", 0.0)) * 1e3))
        return "\n".join(lines)


def _label(name: str, lang: Optional[str] = None) -> str:
    key = _LABEL_KEYS.get(name)
    return tr(key, lang) if key else name


def gather_summaries(summary: Dict[str, Any], dst: int = 0, group=None) -> Optional[RankTable]:
    """Gather every rank's ``summary`` to rank ``dst``: a :class:`RankTable` there, ``None`` elsewhere.
    Every rank of the group must call it (it is a collective)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return RankTable([summary])
    world = dist.get_world_size(group)
    me = dist.get_rank(group)
    out: Optional[list] = [None] * world if me == dst else None
    dist.gather_object(summary, out, dst=dst, group=group)
    return RankTable(out) if out is not None else None


# ------------------------------------------------------------------------------------ profiler
def profile_step(step_fn: Callable[[int], Any], path: str, steps: int = 2, warmup: int = 1,
                 device: Any = "cpu", record_shapes: bool = False, profile_memory: bool = False) -> str:
    """Run ``step_fn(i)`` for ``warmup`` untraced then ``steps`` traced steps under
    ``torch.profiler.profile`` and write the Chrome trace to ``path``. Returns ``path``.

    Every rank of a distributed job must run the same steps (they contain collectives); give each
    rank its own ``path``. The CUDA activity is added only when ``device`` is a CUDA device."""
    from torch.profiler import ProfilerActivity, profile, record_function

    if steps < 1 or warmup < 0:
        raise LabError("mon_bad_steps", steps=steps, warmup=warmup)
    for i in range(warmup):
        step_fn(i)
    activities = [ProfilerActivity.CPU]
    if _is_cuda(device):
        activities.append(ProfilerActivity.CUDA)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with profile(activities=activities, record_shapes=record_shapes, profile_memory=profile_memory) as prof:
        for i in range(warmup, warmup + steps):
            with record_function(f"train_step_{i}"):
                step_fn(i)
            prof.step()
    if _is_cuda(device):
        torch.cuda.synchronize(device)
    prof.export_chrome_trace(path)
    return path


def trace_facts(path: str, patterns: Sequence[str] = COLLECTIVE_PATTERNS) -> Dict[str, Any]:
    """Read a Chrome trace: number of complete events, the collective ones (names containing one of
    ``patterns``, case-insensitive) by name, the time in them (the ``c10d::`` spans, which enclose the
    backend's own ``gloo:``/``nccl:`` spans), and the ``train_step_*`` spans."""
    if not os.path.exists(path):
        raise LabError("mon_no_trace", path=path)
    with open(path) as f:
        data = json.load(f)
    events = data["traceEvents"] if isinstance(data, dict) else data
    complete = [e for e in events if e.get("ph") == "X"]
    pats = [p.lower() for p in patterns]
    coll: Dict[str, int] = {}
    coll_us, outer_us = 0.0, 0.0
    for e in complete:
        name = str(e.get("name", ""))
        if any(p in name.lower() for p in pats):
            coll[name] = coll.get(name, 0) + 1
            coll_us += float(e.get("dur", 0.0))
            if name.startswith("c10d::"):   # the dispatcher's span encloses the backend's: count it once
                outer_us += float(e.get("dur", 0.0))
    steps = [e for e in complete if str(e.get("name", "")).startswith("train_step_")]
    c10d = sum(n for k, n in coll.items() if k.startswith("c10d::"))             # one per dispatcher call
    backend = sum(n for k, n in coll.items() if k.split(":")[0] in ("gloo", "nccl"))  # the backend's own span
    return {"events": len(complete), "collective_events": sum(coll.values()), "collectives": coll,
            "c10d_calls": c10d, "backend_calls": backend,
            "collective_ms": (outer_us or coll_us) / 1e3, "step_spans": len(steps),
            "step_ms": [float(e.get("dur", 0.0)) / 1e3 for e in steps], "bytes": os.path.getsize(path)}


# ------------------------------------------------------------------------------------ progress
class _Plain:
    def __init__(self, it, total, desc, every, file):
        self.it, self.total, self.desc, self.file = it, total, desc, file
        self.every = max(1, every or (max(1, (total or 10) // 10)))
        self.postfix = ""

    def set_postfix_str(self, s: str) -> None:
        self.postfix = s

    def __iter__(self):
        t0, n = time.perf_counter(), 0
        for n, x in enumerate(self.it, 1):
            yield x
            if n % self.every == 0 or n == self.total:
                tot = f"/{self.total}" if self.total else ""
                rate = n / max(time.perf_counter() - t0, 1e-9)
                print(f"{self.desc} {n}{tot} [{rate:.1f} it/s] {self.postfix}".strip(), file=self.file, flush=True)


def progress(iterable: Iterable, total: Optional[int] = None, desc: str = "", rank: Optional[int] = None,
             plain: bool = False, every: Optional[int] = None, file=None):
    """Wrap ``iterable`` in a progress bar printed by rank 0 only (other ranks iterate silently).
    tqdm when installed (unless ``plain``), else one line every ``every`` items (default: ~10 lines)."""
    if rank is None:
        import torch.distributed as dist
        rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else int(os.environ.get("RANK", 0))
    if total is None:
        try:
            total = len(iterable)   # type: ignore[arg-type]
        except TypeError:
            total = None
    if rank != 0:
        return iterable
    file = file or sys.stderr
    if not plain:
        try:
            from tqdm.auto import tqdm
            return tqdm(iterable, total=total, desc=desc, file=file)
        except ImportError:
            pass
    return _Plain(iterable, total, desc, every, file)


def format_split(summary: Dict[str, Any], lang: Optional[str] = None) -> str:
    """One line: mean ms per phase and their share of the step."""
    m = summary["mean"]
    step = m["step"] or 1e-12
    parts = [f"{_label(k, lang)} {m.get(k, 0.0) * 1e3:.2f} ms ({100 * m.get(k, 0.0) / step:.0f}%)"
             for k in list(PHASES) + ["other"]]
    return tr("mon_split", lang, step=m["step"] * 1e3, parts=", ".join(parts),
              sps=summary["samples_per_s"], clock=summary["clock"])
