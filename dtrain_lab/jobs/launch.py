"""Run a torchrun job from a notebook cell or a terminal, and always get control back.

    >>> import dtrain_lab
    >>> r = dtrain_lab.launch("dtrain_lab.demos.hello", nproc=2, timeout=60)
    >>> r.ok, r.metrics[0]

What happens, in order:

1. ``python -m torch.distributed.run --standalone`` starts in a new process session. ``--standalone``
   lets torchrun's c10d rendezvous bind a free port itself, so two launches never collide and no
   ``MASTER_PORT`` is hard-coded. (Multi-node: ``nnodes``, ``node_rank`` and ``rdzv_endpoint``.)
   Without a CUDA GPU, ``--run-path --start-method fork``: torchrun forks the ranks from its agent,
   which has imported torch already, and :mod:`dtrain_lab.jobs._forked_rank` runs the program in
   each as ``python -m`` would (``start=``, :func:`~dtrain_lab.jobs.options.default_start`).
   On that path the agent itself is forked from an *agent server* that this process started once
   and that has imported torch (and ``torch._dynamo``, which every rank's first optimizer imports):
   :mod:`dtrain_lab.jobs.agents` says when a launch may use it (never when it could change what
   the job does) and how the server ends with this process.
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
   ``KeyboardInterrupt``. No process of the job survives any path: torchrun runs under the job's init,
   a child subreaper that holds every process the job starts (:mod:`dtrain_lab.sandbox.contain`),
   and the launcher kills that tree at the end (:mod:`dtrain_lab.jobs._procs`).

The pieces: :mod:`~dtrain_lab.jobs.options` (the validated settings, the command, the ranks'
environment), :mod:`~dtrain_lab.jobs.output` (tailing and showing the ranks' output),
:mod:`~dtrain_lab.jobs.diagnose` (stacks of a hung job), :mod:`~dtrain_lab.jobs.outcome` (who failed
first, with what) and :mod:`~dtrain_lab.jobs.result` (what is returned).
"""
from __future__ import annotations

import glob
import os
import subprocess
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from dtrain_lab.i18n import tr
from dtrain_lab.jobs import _procs, agents
from dtrain_lab.jobs.diagnose import collect_stacks, format_stack
from dtrain_lab.jobs.options import (DEFAULT_STARTUP_TIMEOUT_S, DEFAULT_TIMEOUT_S, PACKAGE_PARENT, LaunchOptions,
                                     default_nproc, job_root)
from dtrain_lab.jobs.outcome import attach_exceptions, first_failure, mark_stopped, read_errors
from dtrain_lab.jobs.output import MAX_LINE_CHARS, Display, RankOutput, grouped
from dtrain_lab.jobs.result import LaunchResult, RankResult, gathered, load_reports, read_jsonl
from dtrain_lab.sandbox import python_m

__all__ = ["launch", "LaunchResult", "RankResult", "LaunchOptions", "show_stack", "default_nproc",
           "gathered", "load_reports", "read_jsonl", "PACKAGE_PARENT"]


def launch(target: str, nproc: int | None = None, args: Sequence[Any] = (), timeout: float = DEFAULT_TIMEOUT_S,
           env: Mapping[str, Any] | None = None, *, startup_timeout: float = DEFAULT_STARTUP_TIMEOUT_S,
           backend: str | None = None, debug: str | None = None, quiet: bool = False,
           nnodes: int = 1, node_rank: int = 0, rdzv_endpoint: str | None = None, rdzv_id: str | None = None,
           max_restarts: int = 0, max_live_lines: int = 400, max_output_lines: int = 20000,
           torchrun_args: Iterable[str] = (), start: str | None = None) -> LaunchResult:
    """Run ``target`` (a module name or a ``.py`` path) on ``nproc`` processes with torchrun.

    ``timeout`` limits the run after start-up, ``startup_timeout`` the start-up (see the module
    docstring). ``env`` adds environment variables for the ranks; ``backend`` sets ``DTRAIN_BACKEND``;
    ``debug`` sets ``TORCH_DISTRIBUTED_DEBUG``. ``quiet`` shows nothing live. ``start`` is how torchrun
    starts the ranks: ``"fork"`` (from its agent, without a second ``import torch``) or ``"exec"`` (a
    fresh Python each); the default is ``"fork"`` without a CUDA GPU
    (:func:`~dtrain_lab.jobs.options.default_start`). Never raises for what
    the job does (crash, hang): that is in the returned :class:`LaunchResult`. Raises
    :class:`~dtrain_lab.i18n.LabError` for bad arguments, and re-raises ``KeyboardInterrupt`` after
    killing the job.
    """
    opts = LaunchOptions(target, nproc, args, timeout, env, startup_timeout=startup_timeout, backend=backend,
                         debug=debug, quiet=quiet, nnodes=nnodes, node_rank=node_rank, rdzv_endpoint=rdzv_endpoint,
                         rdzv_id=rdzv_id, max_restarts=max_restarts, max_live_lines=max_live_lines,
                         max_output_lines=max_output_lines, torchrun_args=list(torchrun_args), start=start)
    job_id = uuid.uuid4().hex[:12]
    job_dir = job_root() / job_id
    job_dir.mkdir()
    cmd = opts.command(job_dir / "logs")
    display = Display(opts.quiet)
    if not opts.quiet and not display.notebook:
        print(tr("launch_start", target=opts.target, nproc=opts.world_size, backend=opts.backend or "auto"), flush=True)
    out = RankOutput(job_dir / "logs", opts.rank_base, opts.nproc, display, opts.max_live_lines, opts.max_output_lines)

    job = _Job(cmd, opts.child_env(job_dir, job_id), job_dir, served=agents.served(opts))
    hung, phase, limit, interrupted = job.wait(out, display, opts)
    if opts.nnodes > 1:
        out.renumber(_started_ranks(job_dir), opts.nproc)
    upto = None
    if hung:
        # what a hung job printed before it was found hung; what its ranks print while they are asked
        # for their stacks and killed (a peer's collective failing as the other dies, cut off
        # mid-traceback by the kill) depends on the order of the kills, and a notebook does not show it
        out.pump()
        upto = out.lines_so_far()
        collect_stacks(job_dir, out.ranks)
    killed = _procs.kill_job(job.proc, str(job.report))
    agent_output = job.close()
    out.pump(final=True)

    result = _result(opts, job, out, cmd, agent_output, hung=hung, phase=phase, limit=limit,
                     interrupted=interrupted, killed=killed)
    display.finish(grouped(result.ranks, upto=upto) if display.notebook else "", result.summary())
    if interrupted:
        raise KeyboardInterrupt
    return result


class _Job:
    """The torchrun agent of one launch, in its own session: forked by this process's agent server
    (:mod:`dtrain_lab.jobs.agents`, its output in ``agent.log``) or a fresh Python (its output read in
    a thread)."""

    def __init__(self, cmd: list[str], env: dict[str, str], job_dir: Path, served: bool = False):
        self.job_dir = job_dir
        self.agent_lines: list[str] = []
        self.t0 = time.monotonic()
        self.wall0 = time.time()
        self.agent_log = job_dir / "agent.log"
        self.report = job_dir / "contained.txt"   # how many leftovers the init killed (sandbox.contain)
        self.reader = None
        self.proc = agents.start(cmd, env, self.agent_log, self.report) if served else None
        if self.proc is None:   # torchrun under a fresh init (a child subreaper that holds the job's tree)
            init = python_m("dtrain_lab.sandbox.contain", "--report", str(self.report), "--", *cmd)
            self.proc = subprocess.Popen(init, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True,
                                         preexec_fn=_procs.set_parent_death_signal)
            self.reader = threading.Thread(target=self._read_agent, daemon=True)
            self.reader.start()

    def _read_agent(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            self._keep(raw.decode(errors="replace"))

    def _keep(self, line: str) -> None:
        if len(self.agent_lines) < 2000:
            self.agent_lines.append(line.rstrip("\n")[:MAX_LINE_CHARS])

    def first_ready(self) -> float | None:
        """Wall time at which the first rank's ``init_process_group`` returned (its ``ready.*`` mark)."""
        marks = glob.glob(str(self.job_dir / "ready.*"))
        return min(os.path.getmtime(m) for m in marks) if marks else None

    def wait(self, out: RankOutput, display: Display, opts: LaunchOptions):
        """Show output until the job ends or a clock runs out: ``(hung, phase, limit, interrupted)``."""
        ready_wall = None
        try:
            while True:
                out.pump()
                display.tick()
                if self.proc.poll() is not None:
                    return False, None, opts.startup_timeout, False
                now = time.monotonic()
                ready_wall = ready_wall or self.first_ready()
                if ready_wall is None and now - self.t0 > opts.startup_timeout:
                    return True, "startup", opts.startup_timeout, False
                if ready_wall is not None and now - (self.t0 + ready_wall - self.wall0) > opts.timeout:
                    return True, "run", opts.timeout, False
                time.sleep(0.1)
        except KeyboardInterrupt:
            return False, None, opts.startup_timeout, True

    def close(self) -> str:
        """Wait for the agent's output to end; torchrun's own messages."""
        if self.reader is not None:
            self.reader.join(timeout=2)
            if self.proc.stdout is not None:
                self.proc.stdout.close()
        else:
            try:
                with open(self.agent_log, "rb") as f:
                    for raw in f:
                        self._keep(raw.decode(errors="replace"))
            except OSError:
                pass
        return "\n".join(self.agent_lines)


def _started_ranks(job_dir: Path) -> list[int]:
    """The global ranks this node's workers were given (``started.<RANK>.<attempt>`` markers)."""
    return sorted(int(p.name.split(".")[1]) for p in job_dir.glob("started.*") if p.name.split(".")[1].isdigit())


def _result(opts: LaunchOptions, job: _Job, out: RankOutput, cmd: list[str], agent_output: str, *, hung: bool,
            phase: str | None, limit: float, interrupted: bool, killed: int) -> LaunchResult:
    """Put together what the job left: reports, exceptions, the first failure, the clocks."""
    elapsed = time.monotonic() - job.t0
    ready_wall = job.first_ready()
    for rr in out.ranks.values():
        load_reports(rr, job.job_dir)
    errors = read_errors(job.job_dir)
    aborted = attach_exceptions(out.ranks, errors)
    ok = not hung and not interrupted and job.proc.returncode == 0
    failed_rank = exception = None
    if not ok and not hung and not interrupted:
        failed_rank, exception = first_failure(out.ranks, errors, aborted, agent_output)
        mark_stopped(out.ranks, job.job_dir, failed_rank)
    return LaunchResult(
        target=opts.target, nproc=opts.world_size, ok=ok, returncode=job.proc.returncode, hung=hung,
        elapsed=elapsed, startup=None if ready_wall is None else max(0.0, ready_wall - job.wall0),
        phase=phase, interrupted=interrupted, first_failure=failed_rank, exception=exception,
        ranks=[out.ranks[r] for r in sorted(out.ranks)], agent_output=agent_output, log_dir=str(job.job_dir),
        command=cmd, killed=killed, limit=limit)


def show_stack(result: LaunchResult, rank: int) -> str:
    """The main-thread stack of ``rank`` taken at the time-out, outermost call first."""
    text = result.stacks.get(rank)
    return format_stack(text) if text else ""
