"""Run a torchrun job from a notebook cell or a terminal, and always get control back.

    >>> import dtrain_lab
    >>> r = dtrain_lab.launch("dtrain_lab.demos.hello", nproc=2, timeout=60)
    >>> r.ok, r.metrics[0]

What happens, in order:

1. ``python -m torch.distributed.run --standalone`` starts in a new process session. ``--standalone``
   lets torchrun's c10d rendezvous bind a free port itself, so two launches never collide and no
   ``MASTER_PORT`` is hard-coded. (Multi-node: ``nnodes``, ``node_rank`` and ``rdzv_endpoint``.)
2. Every rank's stdout/stderr goes to its own log file (``--redirects 3``); the launcher tails them
   and shows the lines live with a ``[rankN]`` prefix. In a notebook the live view is replaced at the
   end by the output grouped rank by rank, which does not depend on how the ranks interleaved.
3. Two clocks. *Start-up* (``import torch``, rendezvous, ``init_process_group``) is limited by
   ``startup_timeout``; ``timeout`` counts from the moment the first rank's ``init_process_group``
   returned. A slow laptop is never called hung for a slow ``import torch``.
4. On a time-out every rank is asked for its Python stack (``SIGUSR1`` -> ``faulthandler``, installed
   in each rank by ``dtrain_lab/jobs/_inject/sitecustomize.py``, so programs that never import
   dtrain_lab are diagnosed too); the report says where each rank waits. Then every process of the
   job is killed and ``LaunchResult.hung`` is True.
5. Ctrl-C / the notebook's stop button kills every process of the job and re-raises
   ``KeyboardInterrupt``. No process of the job survives any path (:mod:`dtrain_lab.jobs._procs`).
"""
from __future__ import annotations

import glob
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from dtrain_lab.jobs import _procs
from dtrain_lab.jobs.diagnose import WaitSite, format_stack, wait_site
from dtrain_lab.i18n import LabError, get_lang, tr

INJECT_DIR = str(Path(__file__).resolve().parent / "_inject")
PACKAGE_PARENT = str(Path(__file__).resolve().parents[2])
DEFAULT_TIMEOUT_S = 120.0
DEFAULT_STARTUP_TIMEOUT_S = 120.0
MAX_LINE_CHARS = 4000


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
    """The outcome of :func:`launch`. ``ok`` means every rank exited 0 within the limits."""

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

    def summary(self, lang: str | None = None, timing: bool = True) -> str:
        lines = []
        if self.interrupted:
            lines.append(tr("launch_interrupted", lang))
        elif self.hung:
            key = "launch_hung_startup" if self.phase == "startup" else "launch_hung"
            lines.append(tr(key, lang, limit=self.limit))
            for r in self.ranks:
                if r.waiting is None:
                    lines.append(tr("where_unknown", lang, rank=r.rank))
                else:
                    lines.append(tr("where_waiting", lang, rank=r.rank, call=r.waiting.call, where=r.waiting.where))
            if self.phase != "startup" and len({str(r.waiting.call) if r.waiting else None for r in self.ranks}) > 1:
                lines.append(tr("where_hint", lang))
        elif self.ok:
            lines.append(tr("launch_ok", lang, nproc=self.nproc))
        else:
            lines.append(tr("launch_failed", lang, code=self.returncode,
                            rank="?" if self.first_failure is None else self.first_failure))
            if self.exception:
                lines.append(tr("launch_exception", lang, rank=self.first_failure, exc=self.exception))
        if timing:
            start = "" if self.startup is None else f", start-up {self.startup:.1f} s"
            lines.append(f"  [{self.elapsed:.1f} s{start}]")
        return "\n".join(lines)

    def __repr__(self) -> str:
        state = "hung" if self.hung else ("ok" if self.ok else f"failed rc={self.returncode}")
        return f"LaunchResult({self.target!r}, nproc={self.nproc}, {state}, elapsed={self.elapsed:.1f}s)"


# ------------------------------------------------------------------------------------------ tails
class _Tail:
    """Incremental reader of one log file, yielding whole lines."""

    def __init__(self, path: str):
        self.path = path
        self.pos = 0
        self.partial = b""

    def read(self, final: bool = False) -> list[str]:
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
        return [p.decode(errors="replace")[:MAX_LINE_CHARS] for p in parts]


class _Display:
    """Live output: plain prefixed lines in a terminal; an updating view in a notebook."""

    def __init__(self, quiet: bool, max_live_lines: int):
        self.quiet = quiet
        self.max_live = max_live_lines
        self.notebook = "ipykernel" in sys.modules and not quiet
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


# ------------------------------------------------------------------------------------------ helpers
def _job_root() -> Path:
    root = Path(os.environ.get("DTRAIN_RUN_DIR") or Path(tempfile.gettempdir()) / f"dtrain_lab-{os.getuid()}")
    root.mkdir(parents=True, exist_ok=True)
    cutoff = time.time() - 24 * 3600
    for old in root.iterdir():  # keep a day of logs for post-mortems, no more
        try:
            if old.stat().st_mtime < cutoff:
                shutil.rmtree(old, ignore_errors=True)
        except OSError:
            pass
    return root


def default_nproc() -> int:
    """The number of GPUs when there are two or more, else 2 CPU processes."""
    try:
        from dtrain_lab.jobs.runtime import gpu_count

        gpus = gpu_count()
    except Exception:  # noqa: BLE001
        gpus = 0
    return gpus if gpus >= 2 else 2


def _check_seconds(name: str, value: Any) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        v = -1.0
    if not v > 0:
        raise LabError("bad_timeout", name=name, value=value)
    return v


def _target_args(target: str) -> list[str]:
    if target.endswith(".py") or os.sep in target:
        if not os.path.isfile(target):
            raise LabError("bad_target", target=target)
        return [os.path.abspath(target)]
    try:
        found = importlib.util.find_spec(target) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise LabError("bad_target", target=target)
    return ["-m", target]


_ROOT_CAUSE_RE = re.compile(r"Root Cause.*?rank\s*:\s*(\d+)", re.S)


def _parse_root_cause(agent_output: str) -> int | None:
    m = _ROOT_CAUSE_RE.search(agent_output)
    return int(m.group(1)) if m else None


_EXC_LINE_RE = re.compile(r"^([A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit|Warning)|[A-Z]\w*Error)(:.*)?$")


def _last_exception_line(stderr: str) -> str | None:
    if "Traceback (most recent call last)" not in stderr:
        return None
    for line in reversed(stderr.splitlines()):
        if _EXC_LINE_RE.match(line.strip()):
            return line.strip()[:500]
    return None


# ------------------------------------------------------------------------------------------ launch
def launch(target: str, nproc: int | None = None, args: Sequence[Any] = (), timeout: float = DEFAULT_TIMEOUT_S,
           env: Mapping[str, Any] | None = None, *, startup_timeout: float = DEFAULT_STARTUP_TIMEOUT_S,
           backend: str | None = None, debug: str | None = None, quiet: bool = False,
           nnodes: int = 1, node_rank: int = 0, rdzv_endpoint: str | None = None, rdzv_id: str | None = None,
           max_restarts: int = 0, max_live_lines: int = 400, max_output_lines: int = 20000,
           torchrun_args: Iterable[str] = ()) -> LaunchResult:
    """Run ``target`` (a module name or a ``.py`` path) on ``nproc`` processes with torchrun.

    ``timeout`` limits the run after start-up, ``startup_timeout`` the start-up (see the module
    docstring). ``env`` adds environment variables for the ranks; ``backend`` sets ``DTRAIN_BACKEND``;
    ``debug`` sets ``TORCH_DISTRIBUTED_DEBUG``. ``quiet`` shows nothing live. Never raises for what
    the job does (crash, hang): that is in the returned :class:`LaunchResult`. Raises
    :class:`~dtrain_lab.i18n.LabError` for bad arguments, and re-raises ``KeyboardInterrupt`` after
    killing the job.
    """
    nproc = default_nproc() if nproc is None else nproc
    if not isinstance(nproc, int) or isinstance(nproc, bool) or nproc < 1:
        raise LabError("bad_nproc", value=nproc)
    timeout = _check_seconds("timeout", timeout)
    startup_timeout = _check_seconds("startup_timeout", startup_timeout)
    if nnodes > 1 and (not rdzv_endpoint or not (0 <= node_rank < nnodes)):
        raise LabError("nnodes_args")
    target_args = _target_args(str(target))

    job_id = uuid.uuid4().hex[:12]
    job_dir = _job_root() / job_id
    job_dir.mkdir()
    log_dir = job_dir / "logs"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
           "--log-dir", str(log_dir), "--redirects", "3", "--max-restarts", str(max_restarts)]
    if nnodes > 1:
        cmd += ["--nnodes", str(nnodes), "--node-rank", str(node_rank), "--rdzv-backend", "c10d",
                "--rdzv-endpoint", str(rdzv_endpoint), "--rdzv-id", rdzv_id or "dtrain"]
    else:
        cmd += ["--standalone"]
    cmd += [str(a) for a in torchrun_args]
    cmd += target_args + [str(a) for a in args]

    child_env = dict(os.environ)
    for k, v in (env or {}).items():
        child_env[str(k)] = str(v)
    pythonpath = [INJECT_DIR, PACKAGE_PARENT] + [p for p in child_env.get("PYTHONPATH", "").split(os.pathsep) if p]
    child_env.update({
        "PYTHONPATH": os.pathsep.join(pythonpath),
        "PYTHONUNBUFFERED": "1",
        "DTRAIN_JOB_DIR": str(job_dir),
        _procs.JOB_ENV: job_id,
        "DTRAIN_LANG": str((env or {}).get("DTRAIN_LANG") or get_lang()),   # env= may choose the ranks' language
    })
    if backend:
        child_env["DTRAIN_BACKEND"] = backend
    if debug:
        child_env["TORCH_DISTRIBUTED_DEBUG"] = str(debug).upper()

    display = _Display(quiet, max_live_lines)
    if not quiet and not display.notebook:
        print(tr("launch_start", target=target, nproc=nproc * nnodes, backend=backend or "auto"), flush=True)

    rank_base = node_rank * nproc
    ranks = {rank_base + i: RankResult(rank=rank_base + i) for i in range(nproc)}
    live_count = {r: 0 for r in ranks}
    stored_lines = {r: 0 for r in ranks}
    tails: dict[str, tuple[int, str, _Tail]] = {}
    agent_lines: list[str] = []

    t0 = time.monotonic()
    wall0 = time.time()
    proc = subprocess.Popen(cmd, env=child_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True,
                            preexec_fn=_procs.set_parent_death_signal)

    def read_agent():
        assert proc.stdout is not None
        for raw in proc.stdout:
            if len(agent_lines) < 2000:
                agent_lines.append(raw.decode(errors="replace").rstrip("\n")[:MAX_LINE_CHARS])

    reader = threading.Thread(target=read_agent, daemon=True)
    reader.start()

    def pump(final: bool = False) -> None:
        for path in glob.glob(str(log_dir / "*" / "attempt_*" / "*" / "std*.log")):
            if path not in tails:
                parts = Path(path).parts
                tails[path] = (rank_base + int(parts[-2]), "stderr" if path.endswith("stderr.log") else "stdout", _Tail(path))
        for path, (rank, stream, tail) in sorted(tails.items()):
            for text in tail.read(final):
                rr = ranks.setdefault(rank, RankResult(rank=rank))
                live_count.setdefault(rank, 0)
                stored_lines.setdefault(rank, 0)
                if stored_lines[rank] < max_output_lines:
                    setattr(rr, stream, getattr(rr, stream) + text + "\n")
                    rr.output += text + "\n"
                    stored_lines[rank] += 1
                else:
                    rr.truncated = True
                live_count[rank] += 1
                if live_count[rank] <= max_live_lines:
                    display.line(f"[rank{rank}] {text}", err=stream == "stderr")
                elif live_count[rank] == max_live_lines + 1:
                    display.line(tr("output_truncated", rank=rank, n=max_live_lines, path=path))

    def first_ready() -> float | None:
        marks = glob.glob(str(job_dir / "ready.*"))
        if not marks:
            return None
        return min(os.path.getmtime(m) for m in marks)

    hung = interrupted = False
    phase = None
    ready_wall: float | None = None
    limit = startup_timeout
    try:
        while True:
            pump()
            display.tick()
            if proc.poll() is not None:
                break
            now = time.monotonic()
            if ready_wall is None:
                ready_wall = first_ready()
            if ready_wall is None:
                if now - t0 > startup_timeout:
                    hung, phase, limit = True, "startup", startup_timeout
                    break
            else:
                run_t0 = t0 + (ready_wall - wall0)
                if now - run_t0 > timeout:
                    hung, phase, limit = True, "run", timeout
                    break
            time.sleep(0.1)
    except KeyboardInterrupt:
        interrupted = True

    if nnodes > 1:
        # c10d rendezvous ignores --node-rank: it orders the agents itself (dynamic_rendezvous.py
        # sorts them), so this node's ranks are known only from what its workers were given
        true = sorted(int(p.name.split(".")[1]) for p in job_dir.glob("started.*") if p.name.split(".")[1].isdigit())
        if true and (min(true) // nproc) * nproc != rank_base:
            shift = (min(true) // nproc) * nproc - rank_base
            rank_base += shift
            for d in (live_count, stored_lines):
                moved = {r + shift: v for r, v in d.items()}
                d.clear()
                d.update(moved)
            moved_ranks = {}
            for r, rr in ranks.items():
                rr.rank = r + shift
                moved_ranks[r + shift] = rr
            ranks.clear()
            ranks.update(moved_ranks)
            for path, (r, stream, tail) in list(tails.items()):
                tails[path] = (r + shift, stream, tail)
    if hung:
        _collect_stacks(job_dir, ranks)
    killed = _procs.kill_job(job_id, proc, since=wall0)
    reader.join(timeout=2)
    if proc.stdout is not None:
        proc.stdout.close()
    pump(final=True)
    elapsed = time.monotonic() - t0
    if ready_wall is None:
        ready_wall = first_ready()

    for rr in ranks.values():
        load_reports(rr, job_dir)

    errors = []
    for path in glob.glob(str(job_dir / "error.*.json")):
        try:
            with open(path) as f:
                info = json.load(f)
            r = int(Path(path).name.split(".")[1])
            errors.append((info.get("time", 0.0), r, info))
        except (OSError, ValueError, json.JSONDecodeError):
            continue
    for _, r, info in errors:
        if r in ranks:
            ranks[r].exception = f"{info.get('type')}: {info.get('message')}"
            ranks[r].traceback = info.get("traceback")
    recorded = {r for _, r, _ in errors}
    aborted = []      # ranks that died in C++ (std::terminate): no Python exception was recorded
    for rr in ranks.values():
        if rr.exception is None:
            native = _native_abort(rr.stderr)
            if native:
                rr.exception = native
                if rr.rank not in recorded:
                    aborted.append(rr.rank)
            else:
                rr.exception = _last_exception_line(rr.stderr)

    returncode = proc.returncode
    ok = (not hung and not interrupted and returncode == 0)
    agent_output = "\n".join(agent_lines)
    first_failure = exception = None
    if not ok and not hung and not interrupted:
        if errors:
            # a peer's "connection closed" is a consequence of another rank's failure: prefer causes
            causes = [e for e in errors if not _is_secondary(str(e[2].get("message", "")))]
            if not causes and aborted:   # the others only saw the aborted rank's sockets close
                first_failure = min(aborted)
                exception = ranks[first_failure].exception
            else:
                _, first_failure, info = min(causes or errors, key=lambda e: e[0])
                exception = f"{info.get('type')}: {info.get('message')}"
        else:
            first_failure = _parse_root_cause(agent_output)
            if first_failure is None:
                first_failure = next((r for r in sorted(ranks) if ranks[r].exception), None)
            if first_failure is not None and first_failure in ranks:
                exception = ranks[first_failure].exception
        if exception is None and first_failure is not None:
            exception = _signal_or_code(agent_output, first_failure)

    result = LaunchResult(
        target=str(target), nproc=nproc * nnodes, ok=ok, returncode=returncode, hung=hung,
        elapsed=elapsed, startup=None if ready_wall is None else max(0.0, ready_wall - wall0),
        phase=phase, interrupted=interrupted, first_failure=first_failure, exception=exception,
        ranks=[ranks[r] for r in sorted(ranks)], agent_output=agent_output, log_dir=str(job_dir),
        command=cmd, killed=killed, limit=limit,
    )
    display.finish(_grouped(result) if display.notebook else "", result.summary())
    if interrupted:
        raise KeyboardInterrupt
    return result


SECONDARY_ERRORS = ("Connection closed by peer", "Connection reset by peer", "Broken pipe",
                    "remote worker crashing", "Socket Timeout", "communicator was aborted")


def _is_secondary(message: str) -> bool:
    """True for the errors a rank gets because *another* rank died (its peer closed the socket)."""
    return any(s in message for s in SECONDARY_ERRORS)


def _native_abort(stderr: str) -> str | None:
    """The message of a C++ exception that ended a rank through std::terminate (no Python traceback)."""
    m = re.search(r"terminate called after throwing an instance of '([^']+)'\s*\n\s*what\(\):\s*(.+)", stderr or "")
    if not m:
        return None
    return f"{m.group(1)} (C++ abort): {m.group(2).strip()}"


def _signal_or_code(agent_output: str, rank: int | None = None) -> str | None:
    """How torchrun says rank ``rank`` ended (its failure block: ``rank : R``, ``exitcode : -11``,
    ``Signal 11 (SIGSEGV)``): "killed by SIGSEGV" or "exit code N"."""
    text = agent_output
    if rank is not None:
        m = re.search(rf"^\s*rank\s*:\s*{rank}\b.*$", agent_output, re.M)
        if m:  # this rank's block: up to the next "[i]:" header or separator
            rest = agent_output[m.end():]
            end = re.search(r"^\s*(\[\d+\]:|[-=]{10,})", rest, re.M)
            text = rest[: end.start()] if end else rest
    m = re.search(r"exitcode\s*:\s*(-?\d+)", text)
    if not m:
        return None
    sig = re.search(r"Signal (\d+) \((\w+)\)", text)
    if sig:
        return f"killed by {sig.group(2)}"
    return f"exit code {m.group(1)}"


def _grouped(result: LaunchResult, max_lines: int = 200) -> str:
    blocks = []
    for r in result.ranks:
        lines = r.output.splitlines()
        shown = [f"[rank{r.rank}] {ln}" for ln in lines[:max_lines]]
        if len(lines) > max_lines:
            shown.append(f"[rank{r.rank}] … (+{len(lines) - max_lines} lines: result.output[{r.rank}])")
        blocks.extend(shown)
    return "\n".join(blocks)


def _collect_stacks(job_dir: Path, ranks: dict[int, RankResult]) -> None:
    """Ask every rank for its stack (SIGUSR1 -> faulthandler) and parse where each waits."""
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
    for r, path in asked:
        text = _procs.wait_stable(str(path), timeout=3.0)
        if r in ranks and text:
            ranks[r].stack = text
            ranks[r].waiting = wait_site(text)


def show_stack(result: LaunchResult, rank: int) -> str:
    """The main-thread stack of ``rank`` taken at the time-out, outermost call first."""
    text = result.stacks.get(rank)
    return format_stack(text) if text else ""
