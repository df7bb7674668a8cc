"""The ranks' output while a job runs: every rank's log files tailed (torchrun ``--redirects 3``
writes ``<log_dir>/<run>/attempt_<n>/<local_rank>/std{out,err}.log``), shown live with a
``[rankN]`` prefix and kept per rank for the :class:`~dtrain_lab.jobs.result.LaunchResult`."""
from __future__ import annotations

import glob
import sys
import time
from pathlib import Path

from dtrain_lab.i18n import tr
from dtrain_lab.jobs.result import RankResult
from dtrain_lab.jobs.runtime import in_notebook

MAX_LINE_CHARS = 4000


class Tail:
    """Incremental reader of one log file, yielding whole lines."""

    def __init__(self, path: str):
        self.path = path
        self.pos = 0
        self.partial = b""

    def read(self, final: bool = False) -> list[bytes]:
        """The whole lines written since the last read, undecoded (a caller decodes what it keeps)."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self.pos)
                data = f.read(4 << 20)
                self.pos = f.tell()
        except OSError:
            data = b""
        data = self.partial + data
        parts = data.split(b"\n")
        self.partial = parts.pop()
        if len(self.partial) > MAX_LINE_CHARS:  # a line with no end: cut it
            parts.append(self.partial)
            self.partial = b""
        if final and self.partial:
            parts.append(self.partial)
            self.partial = b""
        return parts


def _text(line: bytes) -> str:
    return line[:MAX_LINE_CHARS * 4].decode(errors="replace")[:MAX_LINE_CHARS]


class Display:
    """Live output: plain prefixed lines in a terminal; an updating view in a notebook."""

    def __init__(self, quiet: bool):
        self.quiet = quiet
        self.notebook = in_notebook() and not quiet
        self.recent: list[str] = []
        self.handle = None
        self.last_update = 0.0
        self.dirty = False
        if self.notebook:
            from IPython.display import display

            # The live view starts and ends empty (no data at all, so nothing is stored or compared
            # for it): what the notebook stores, and nbval compares, is the grouped output printed at
            # the end, not the interleaving of this run.
            self.handle = display({}, raw=True, display_id=True)

    def line(self, text: str, err: bool = False) -> None:
        if self.quiet:
            return
        if self.notebook:
            self.recent.append(text)
            del self.recent[:-40]
            self.dirty = True
            self.tick()
        else:
            stream = sys.stderr if err else sys.stdout
            print(text, file=stream, flush=True)

    def tick(self, force: bool = False) -> None:
        now = time.monotonic()
        if self.handle is not None and self.dirty and (force or now - self.last_update > 0.3):
            self.handle.update({"text/plain": "\n".join(self.recent)}, raw=True)
            self.last_update = now
            self.dirty = False

    def finish(self, grouped: str, summary: str) -> None:
        if self.quiet:
            return
        if self.handle is not None:
            self.handle.update({}, raw=True)
            if grouped:
                print(grouped, flush=True)
        print(summary, flush=True)


class RankOutput:
    """The ranks of one launch and everything they printed: :meth:`pump` reads what is new in every
    log file (shown live, up to ``max_live_lines`` per rank; kept, up to ``max_output_lines``).

    What is kept grows as lists, joined into each :class:`RankResult` once, by the final pump: a
    string grown line by line is copied at every line (a job printing 40 MB took 54 s to follow that
    way). A line past both limits is only counted, never decoded."""

    def __init__(self, log_dir: Path, rank_base: int, nproc: int, display: Display,
                 max_live_lines: int, max_output_lines: int):
        self.log_dir = log_dir
        self.rank_base = rank_base
        self.display = display
        self.max_live = max_live_lines
        self.max_stored = max_output_lines
        self.ranks = {rank_base + i: RankResult(rank=rank_base + i) for i in range(nproc)}
        self.live_count = {r: 0 for r in self.ranks}
        self.stored_lines = {r: 0 for r in self.ranks}
        self.kept: dict[int, dict[str, list[str]]] = {}
        self.tails: dict[str, tuple[int, str, Tail]] = {}

    def pump(self, final: bool = False) -> None:
        for path in glob.glob(str(self.log_dir / "*" / "attempt_*" / "*" / "std*.log")):
            if path not in self.tails:
                parts = Path(path).parts
                stream = "stderr" if path.endswith("stderr.log") else "stdout"
                self.tails[path] = (self.rank_base + int(parts[-2]), stream, Tail(path))
        for path, (rank, stream, tail) in sorted(self.tails.items()):
            for line in tail.read(final):
                self._line(rank, stream, line, path)
        if final:
            for rank, kept in self.kept.items():
                rr = self.ranks[rank]
                for name, lines in kept.items():
                    setattr(rr, name, getattr(rr, name) + "".join(lines))
                    lines.clear()

    def _line(self, rank: int, stream: str, line: bytes, path: str) -> None:
        rr = self.ranks.setdefault(rank, RankResult(rank=rank))
        self.live_count.setdefault(rank, 0)
        self.stored_lines.setdefault(rank, 0)
        self.live_count[rank] += 1
        store = self.stored_lines[rank] < self.max_stored
        live = self.live_count[rank] <= self.max_live
        if not store:
            rr.truncated = True
        if not (store or live):
            if self.live_count[rank] == self.max_live + 1:
                self.display.line(tr("output_truncated", rank=rank, n=self.max_live, path=path))
            return
        text = _text(line)
        if store:
            kept = self.kept.setdefault(rank, {"stdout": [], "stderr": [], "output": []})
            kept[stream].append(text + "\n")
            kept["output"].append(text + "\n")
            self.stored_lines[rank] += 1
        if live:
            self.display.line(f"[rank{rank}] {text}", err=stream == "stderr")
        elif self.live_count[rank] == self.max_live + 1:
            self.display.line(tr("output_truncated", rank=rank, n=self.max_live, path=path))

    def lines_so_far(self) -> dict[int, int]:
        """``{rank: lines kept}`` up to now (see :func:`grouped`'s ``upto``)."""
        return dict(self.stored_lines)

    def renumber(self, true_ranks: list[int], nproc: int) -> None:
        """Multi-node: c10d rendezvous ignores ``--node-rank`` (it orders the agents itself,
        dynamic_rendezvous.py sorts them), so this node's ranks are known only from what its workers
        were given (``true_ranks``): shift every rank number to match."""
        if not true_ranks or (min(true_ranks) // nproc) * nproc == self.rank_base:
            return
        shift = (min(true_ranks) // nproc) * nproc - self.rank_base
        self.rank_base += shift
        for d in (self.live_count, self.stored_lines, self.kept):
            moved = {r + shift: v for r, v in d.items()}
            d.clear()
            d.update(moved)
        moved_ranks = {}
        for r, rr in self.ranks.items():
            rr.rank = r + shift
            moved_ranks[r + shift] = rr
        self.ranks = moved_ranks
        self.tails = {path: (r + shift, stream, tail) for path, (r, stream, tail) in self.tails.items()}


def grouped(ranks: list[RankResult], max_lines: int = 200, upto: dict[int, int] | None = None) -> str:
    """Every rank's output, rank by rank (what a notebook keeps: it does not depend on how the
    ranks' lines interleaved in this run); with ``upto``, only each rank's first ``upto[rank]`` lines."""
    blocks = []
    for r in ranks:
        lines = r.output.splitlines()
        if upto is not None:
            lines = lines[:upto.get(r.rank, len(lines))]
        shown = [f"[rank{r.rank}] {ln}" for ln in lines[:max_lines]]
        if len(lines) > max_lines:
            shown.append(tr("output_more_lines", rank=r.rank, n=len(lines) - max_lines))
        blocks.extend(shown)
    return "\n".join(blocks)
