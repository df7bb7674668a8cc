"""Forked ranks for the library's correctness tests.

:func:`fork_launch` runs the same rank program that ``dtrain_lab.launch`` runs under torchrun (a
module of ``dtrain_lab.demos`` or a ``tests/workers`` file, as ``__main__`` with its arguments), on
``nproc`` real processes joined by gloo, and returns the launcher's own :class:`LaunchResult`, built
by the launcher's own readers (``runtime.report`` files, recorded exceptions). The difference is how
the ranks start: ``fork()`` from the test process, which has already imported torch, instead of a
torchrun agent that imports torch and starts one fresh interpreter per rank.

Why: on this course's 2-core CI machine a rank's start-up is most of a small job. Process accounting
of a whole ``make test`` (2,056 s of CPU) counted 158 torchrun agents at about 1.7 s of CPU each and
347 ranks at 2.4 s on average, of which about 1.2 s is ``import torch`` and about 1 s the
``torch._dynamo`` import that the first ``torch.optim`` optimizer triggers. A forked rank pays
neither. The launcher itself (torchrun, time limits, stacks of a hung job, Ctrl-C, no survivors,
restarts, several nodes) is tested with real torchrun jobs in ``test_launch``, ``test_elastic``,
``test_multinode`` and ``test_monitor``, and every lesson notebook launches through it.

What a forked rank gets, as from torchrun: ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``,
``LOCAL_WORLD_SIZE``, ``GROUP_RANK``, ``TORCHELASTIC_RESTART_COUNT``, ``OMP_NUM_THREADS=1`` (and
one intra-op thread: the parent's OpenMP pool was sized before the variable existed), and a store
hosted by the parent as torchrun's agent hosts it (``TORCHELASTIC_USE_AGENT_STORE``), so
``init_process_group`` runs exactly as in a torchrun worker. The program then runs through the
launcher's own forked-rank runner (``dtrain_lab/jobs/_forked_rank.py``), as in a launch on a CPU
machine. Like torchrun, the first rank that
fails ends the job: the others are stopped. On the time-out every rank is asked for its Python
stack (``SIGUSR1``, the launcher's own ``diagnose.collect_stacks``) before it is killed: the result is
``hung``, with each rank's ``stack`` and ``waiting`` as the launcher reports them.
"""
from __future__ import annotations

import datetime as _dt
import importlib.util
import os
import signal
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch
import torch._dynamo  # noqa: F401 - imported once here, not in every rank (the first optimizer imports it)
import torch.distributed as dist

from dtrain_lab import i18n
from dtrain_lab.jobs import _forked_rank, diagnose, runtime
from dtrain_lab.jobs.outcome import attach_exceptions, first_failure, read_errors
from dtrain_lab.jobs.result import LaunchResult, RankResult, load_reports

MAX_OUTPUT_CHARS = 200_000


def _launch_sitecustomize():
    """The ``sitecustomize`` that every launched rank loads (``dtrain_lab/jobs/_inject``), loaded once
    here outside any job (it does nothing then). The forked-rank runner calls its ``setup_rank`` in each
    rank, as in a torchrun worker forked from its agent: the ``started``/``ready`` marks, the stack dump
    on ``SIGUSR1``, the record of an uncaught exception."""
    path = Path(_forked_rank.__file__).parent / "_inject" / "sitecustomize.py"
    spec = importlib.util.spec_from_file_location("dtrain_lab_launch_sitecustomize", path)
    module = importlib.util.module_from_spec(spec)
    saved = os.environ.pop("DTRAIN_JOB_DIR", None)
    try:
        spec.loader.exec_module(module)
    finally:
        if saved is not None:
            os.environ["DTRAIN_JOB_DIR"] = saved
    return module


_SITE = _launch_sitecustomize()


def fork_launch(target: str, nproc: int, args: Sequence[Any] = (), timeout: float = 120.0,
                env: Mapping[str, Any] | None = None, quiet: bool = True, startup_timeout: float = 60.0) -> LaunchResult:
    """Run ``target`` on ``nproc`` forked ranks; see the module docstring. The arguments are
    ``dtrain_lab.launch``'s; nothing is shown live, and the job is hung after ``startup_timeout +
    timeout`` seconds."""
    if dist.is_available() and dist.is_initialized():
        raise RuntimeError("fork_launch: this process has a process group of its own; destroy it first")
    job_dir = Path(tempfile.mkdtemp(prefix="dtrain_fork_"))
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    t0 = time.monotonic()
    pids, writers = [], []
    for rank in range(nproc):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the rank: never returns
            os.close(w)
            for other in writers:
                os.close(other)
            _rank_main(rank, nproc, r, job_dir, str(target), [str(a) for a in args], dict(env or {}),
                       startup_timeout + timeout)
        os.close(r)
        pids.append(pid)
        writers.append(w)
    # the agent's store, created after the fork (the ranks must not inherit its server thread)
    store = dist.TCPStore("127.0.0.1", 0, nproc + 1, is_master=True, wait_for_workers=False,
                          timeout=_dt.timedelta(seconds=startup_timeout + timeout))
    for w in writers:
        os.write(w, str(store.port).encode())
        os.close(w)
    stacks: dict[int, Any] = {r: RankResult(rank=r) for r in range(nproc)}   # filled on a hang
    codes, hung = _wait(pids, t0 + startup_timeout + timeout, lambda: diagnose.collect_stacks(job_dir, stacks))
    del store
    return _result(str(target), nproc, job_dir, codes, hung, time.monotonic() - t0, timeout, stacks)


def _rank_main(rank: int, nproc: int, port_pipe: int, job_dir: Path, target: str, args: list[str],
               env: dict, timeout: float) -> None:
    """The rank, in the forked child: torchrun's environment, then the launcher's own forked-rank
    runner (``dtrain_lab.jobs._forked_rank``: a fresh ``__main__``, default signal handlers, no
    inherited file descriptors, the exit code or signal of the program). Never returns."""
    try:
        os.setsid()  # its own session: the parent stops it, and anything it started, with killpg
        log = os.open(job_dir / f"output.{rank}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        sys.stdout = open(1, "w", buffering=1, closefd=False)
        sys.stderr = open(2, "w", buffering=1, closefd=False)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
        sys.stdin = open(0, closefd=False)
        port = b""
        while chunk := os.read(port_pipe, 16):
            port += chunk
        os.close(port_pipe)
        os.environ.update({str(k): str(v) for k, v in env.items()})
        os.environ.update({
            "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(nproc), "LOCAL_WORLD_SIZE": str(nproc),
            "GROUP_RANK": "0", "GROUP_WORLD_SIZE": "1", "ROLE_RANK": str(rank), "ROLE_WORLD_SIZE": str(nproc),
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port.decode(), "TORCHELASTIC_USE_AGENT_STORE": "True",
            "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_MAX_RESTARTS": "0", "OMP_NUM_THREADS": "1",
            "DTRAIN_JOB_DIR": str(job_dir), "PYTHONUNBUFFERED": "1",
        })
        i18n.set_lang(os.environ.get("DTRAIN_LANG") or i18n.get_lang())  # chosen at import, in the parent
        runtime._current = None  # the parent's world of one, if a test made one
        sys.modules["sitecustomize"] = _SITE
        argv = [target] + args if target.endswith(".py") else ["-m", target] + args
    except BaseException:  # noqa: BLE001 - the harness itself failed: say so in the rank's output
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)
    _forked_rank._run_rank(argv, os.getppid())


def _stop(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.killpg(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _wait(pids: list[int], deadline: float, on_hang) -> tuple[dict[int, int], bool]:
    """Exit codes by rank. The first failure stops the others (SIGTERM, then SIGKILL after 5 s), as
    torchrun does; past ``deadline`` every rank is killed and the job is hung."""
    codes: dict[int, int] = {}
    stop_at = None
    hung = False
    while len(codes) < len(pids):
        for rank, pid in enumerate(pids):
            if rank in codes:
                continue
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                codes[rank] = os.waitstatus_to_exitcode(status)
                if codes[rank] != 0 and stop_at is None:
                    _stop([p for r, p in enumerate(pids) if r not in codes], signal.SIGTERM)
                    stop_at = time.monotonic() + 5.0
        now = time.monotonic()
        if len(codes) < len(pids) and (now > deadline or (stop_at is not None and now > stop_at)):
            hung = hung or stop_at is None
            if hung:
                on_hang()                 # every rank's stack, before the kill
            _stop([p for r, p in enumerate(pids) if r not in codes], signal.SIGKILL)
            for rank, pid in enumerate(pids):
                if rank not in codes:
                    codes[rank] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        time.sleep(0.02)
    _stop(pids, signal.SIGKILL)  # anything a rank left behind in its session
    return codes, hung


def _result(target: str, nproc: int, job_dir: Path, codes: dict[int, int], hung: bool, elapsed: float,
            timeout: float, stacks: dict[int, Any]) -> LaunchResult:
    ranks = {}
    for rank in range(nproc):
        try:
            text = (job_dir / f"output.{rank}").read_text(errors="replace")
        except OSError:
            text = ""
        rr = RankResult(rank=rank, stdout=text[-MAX_OUTPUT_CHARS:], stderr=text[-MAX_OUTPUT_CHARS:],
                        output=text[-MAX_OUTPUT_CHARS:], truncated=len(text) > MAX_OUTPUT_CHARS)
        load_reports(rr, job_dir)
        rr.stack, rr.waiting = stacks[rank].stack, stacks[rank].waiting
        ranks[rank] = rr
    errors = read_errors(job_dir)
    aborted = attach_exceptions(ranks, errors)
    ok = not hung and all(c == 0 for c in codes.values())
    failed = exception = None
    returncode = 0 if ok else next((c for r, c in sorted(codes.items()) if c != 0), None)
    if not ok and not hung:
        failed, exception = first_failure(ranks, errors, aborted, "")
        if exception is None and failed is not None and codes.get(failed, 0) < 0:
            exception = f"killed by {signal.Signals(-codes[failed]).name}"
    return LaunchResult(target=target, nproc=nproc, ok=ok, returncode=returncode, hung=hung, elapsed=elapsed,
                        phase="run" if hung else None, first_failure=failed, exception=exception,
                        ranks=[ranks[r] for r in range(nproc)], log_dir=str(job_dir),
                        command=["fork", target], limit=timeout)
