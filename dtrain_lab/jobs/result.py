"""What a launch returns: :class:`LaunchResult` with one :class:`RankResult` per rank, and the
readers of what ranks report (``runtime.report()`` writes ``report.<rank>.<attempt>.jsonl``)."""
from __future__ import annotations

import glob
import json
import os
from dataclasses import dataclass, field
from typing import Sequence

from dtrain_lab.i18n import tr
from dtrain_lab.jobs.diagnose import WaitSite


def read_jsonl(path: str) -> list[dict]:
    """The JSON objects of a rank's report file, one a line; a line cut off by a killed rank (or not
    an object) is skipped, a missing file gives ``[]``."""
    items = []
    try:
        with open(path, errors="replace") as f:
            for line in f:
                try:
                    item = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if isinstance(item, dict):
                    items.append(item)
    except OSError:
        pass
    return items


def load_reports(rr: "RankResult", job_dir: str | os.PathLike) -> None:
    """Append to ``rr.reports`` (and merge into ``rr.metrics``) what rank ``rr.rank`` reported in
    ``job_dir``, every restart attempt's file in order."""
    for path in sorted(glob.glob(os.path.join(str(job_dir), f"report.{rr.rank}.*.jsonl"))):
        for item in read_jsonl(path):
            rr.reports.append(item)
            rr.metrics.update(item)


def gathered(ranks: Sequence["RankResult"], key: str) -> list:
    """``r.metrics[key]`` for each of ``ranks`` in order; a KeyError names the rank that lacks it."""
    out = []
    for r in ranks:
        if key not in r.metrics:
            raise KeyError(f"rank {r.rank} reported no {key!r} (it reported {sorted(r.metrics)})")
        out.append(r.metrics[key])
    return out


@dataclass
class RankResult:
    rank: int
    stdout: str = ""
    stderr: str = ""
    output: str = ""                       # stdout and stderr interleaved as they were read
    metrics: dict = field(default_factory=dict)   # all report() calls merged, later keys win
    reports: list = field(default_factory=list)   # every report() call, in order
    exception: str | None = None           # "ValueError: ..." if the rank raised
    traceback: str | None = None
    stack: str | None = None               # faulthandler dump taken on a hang
    waiting: WaitSite | None = None        # where it waited, parsed from ``stack``
    truncated: bool = False


@dataclass
class LaunchResult:
    """The outcome of :func:`~dtrain_lab.jobs.launch.launch`. ``ok`` means every rank exited 0
    within the limits."""

    target: str
    nproc: int
    ok: bool
    returncode: int | None
    hung: bool
    elapsed: float
    startup: float | None = None            # seconds until the first rank's init_process_group returned
    phase: str | None = None                # where a hang happened: "startup" or "run"
    interrupted: bool = False
    first_failure: int | None = None        # the rank that failed first
    exception: str | None = None            # that rank's exception
    ranks: list[RankResult] = field(default_factory=list)
    agent_output: str = ""                   # torchrun's own messages
    log_dir: str = ""
    command: list[str] = field(default_factory=list)
    killed: int = 0                          # processes the launcher had to kill
    limit: float = 0.0                       # the time limit that ran out, for a hang

    @property
    def output(self) -> dict[int, str]:
        return {r.rank: r.output for r in self.ranks}

    @property
    def metrics(self) -> dict[int, dict]:
        return {r.rank: r.metrics for r in self.ranks}

    @property
    def stacks(self) -> dict[int, str | None]:
        return {r.rank: r.stack for r in self.ranks}

    @property
    def waiting(self) -> dict[int, WaitSite | None]:
        return {r.rank: r.waiting for r in self.ranks}

    def gathered(self, key: str) -> list:
        """``metrics[r][key]`` for every rank in rank order (KeyError names the rank that lacks it)."""
        return gathered(self.ranks, key)

    def _hang_lines(self, lang: str | None) -> list[str]:
        key = "launch_hung_startup" if self.phase == "startup" else "launch_hung"
        lines = [tr(key, lang, limit=self.limit)]
        for r in self.ranks:
            if r.waiting is None:
                lines.append(tr("where_unknown", lang, rank=r.rank))
            else:
                lines.append(tr("where_waiting", lang, rank=r.rank, call=r.waiting.call, where=r.waiting.where))
        if self.phase != "startup" and len({str(r.waiting.call) if r.waiting else None for r in self.ranks}) > 1:
            lines.append(tr("where_hint", lang))
        return lines

    def summary(self, lang: str | None = None, timing: bool = True) -> str:
        """What happened, in ``lang`` (default: the learner's); ``timing`` adds ``[x s, start-up y s]``."""
        if self.interrupted:
            lines = [tr("launch_interrupted", lang)]
        elif self.hung:
            lines = self._hang_lines(lang)
        elif self.ok:
            lines = [tr("launch_ok", lang, nproc=self.nproc)]
        else:
            lines = [tr("launch_failed", lang, code=self.returncode,
                        rank="?" if self.first_failure is None else self.first_failure)]
            if self.exception:
                lines.append(tr("launch_exception", lang, rank=self.first_failure, exc=self.exception))
        if timing:
            if self.startup is None:
                lines.append(tr("launch_timing", lang, elapsed=self.elapsed))
            else:
                lines.append(tr("launch_timing_startup", lang, elapsed=self.elapsed, startup=self.startup))
        return "\n".join(lines)

    def __repr__(self) -> str:
        state = "hung" if self.hung else ("ok" if self.ok else f"failed rc={self.returncode}")
        return f"LaunchResult({self.target!r}, nproc={self.nproc}, {state}, elapsed={self.elapsed:.1f}s)"
