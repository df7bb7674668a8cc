"""A launch's settings, validated once (:class:`LaunchOptions`), and what they turn into: the
torchrun command line, the ranks' environment and the job's folder."""
from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from dtrain_lab.i18n import LabError, get_lang
from dtrain_lab.jobs import _procs

INJECT_DIR = str(Path(__file__).resolve().parent / "_inject")
FORKED_RANK = str(Path(__file__).resolve().parent / "_forked_rank.py")
STARTS = ("fork", "exec")
PACKAGE_PARENT = str(Path(__file__).resolve().parents[2])
DEFAULT_TIMEOUT_S = 120.0
DEFAULT_STARTUP_TIMEOUT_S = 120.0


def _gpus() -> int:
    """CUDA GPUs visible to this process; 0 if they cannot be counted."""
    try:
        from dtrain_lab.jobs.runtime import gpu_count

        return gpu_count()
    except Exception:  # noqa: BLE001
        return 0


def default_nproc() -> int:
    """The number of GPUs when there are two or more, else 2 CPU processes."""
    gpus = _gpus()
    return gpus if gpus >= 2 else 2


def default_start() -> str:
    """How torchrun starts the ranks: ``"fork"`` (forked from its agent, which has imported torch
    already: see :mod:`dtrain_lab.jobs._forked_rank`) on Linux without a CUDA GPU, else ``"exec"``,
    torchrun's default of one fresh Python per rank (CUDA cannot be used in a process forked from
    one that initialised it, this course never tested that path on GPUs, and macOS does not make
    forking a process with threads safe). ``DTRAIN_START=fork|exec`` overrides."""
    chosen = os.environ.get("DTRAIN_START", "").strip().lower()
    if chosen:
        return chosen
    if not sys.platform.startswith("linux"):
        return "exec"
    return "exec" if _gpus() > 0 else "fork"


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


def prune_old(root: Path, max_age_s: float = 24 * 3600) -> Path:
    """Create ``root`` if needed (its mode is the caller's business) and remove the entries in it
    last modified more than ``max_age_s`` ago: job folders are kept for post-mortems, no longer.
    Returns ``root``. Shared by the launcher's :func:`job_root` and the grader's job folders."""
    root.mkdir(parents=True, exist_ok=True)
    cutoff = time.time() - max_age_s
    for old in root.iterdir():
        try:
            if old.stat().st_mtime < cutoff:
                shutil.rmtree(old, ignore_errors=True)
        except OSError:
            pass
    return root


def job_root() -> Path:
    """Where jobs keep their logs and reports (``$DTRAIN_RUN_DIR``, else a per-user temp folder);
    folders older than a day are removed (:func:`prune_old`)."""
    return prune_old(Path(os.environ.get("DTRAIN_RUN_DIR") or Path(tempfile.gettempdir()) / f"dtrain_lab-{os.getuid()}"))


@dataclass
class LaunchOptions:
    """Everything :func:`~dtrain_lab.jobs.launch.launch` was asked, checked on creation (a bad
    value is a bilingual :class:`~dtrain_lab.i18n.LabError`)."""

    target: str
    nproc: int | None = None
    args: Sequence[Any] = ()
    timeout: float = DEFAULT_TIMEOUT_S
    env: Mapping[str, Any] | None = None
    startup_timeout: float = DEFAULT_STARTUP_TIMEOUT_S
    backend: str | None = None
    debug: str | None = None
    quiet: bool = False
    nnodes: int = 1
    node_rank: int = 0
    rdzv_endpoint: str | None = None
    rdzv_id: str | None = None
    max_restarts: int = 0
    max_live_lines: int = 400
    max_output_lines: int = 20000
    torchrun_args: Sequence[str] = ()
    start: str | None = None
    target_args: list[str] = field(init=False, default_factory=list)

    def __post_init__(self):
        self.target = str(self.target)
        self.nproc = default_nproc() if self.nproc is None else self.nproc
        if not isinstance(self.nproc, int) or isinstance(self.nproc, bool) or self.nproc < 1:
            raise LabError("bad_nproc", value=self.nproc)
        self.timeout = _check_seconds("timeout", self.timeout)
        self.startup_timeout = _check_seconds("startup_timeout", self.startup_timeout)
        if self.nnodes > 1 and (not self.rdzv_endpoint or not (0 <= self.node_rank < self.nnodes)):
            raise LabError("nnodes_args")
        self.torchrun_args = [str(a) for a in self.torchrun_args]
        self.target_args = _target_args(self.target)
        self.start = default_start() if self.start is None else self.start
        if self.start not in STARTS:
            raise LabError("bad_start", value=self.start, choices=", ".join(STARTS))

    @property
    def world_size(self) -> int:
        return self.nproc * self.nnodes

    @property
    def rank_base(self) -> int:
        """The first global rank of this node, as requested (c10d may assign another: see
        :meth:`dtrain_lab.jobs.output.RankOutput.renumber`)."""
        return self.node_rank * self.nproc

    def command(self, log_dir: Path) -> list[str]:
        """The torchrun command line: standalone (a free port chosen by c10d, never a fixed
        ``MASTER_PORT``), or one node of a c10d rendezvous; every rank's output in its own file."""
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(self.nproc),
               "--log-dir", str(log_dir), "--redirects", "3", "--max-restarts", str(self.max_restarts)]
        if self.nnodes > 1:
            cmd += ["--nnodes", str(self.nnodes), "--node-rank", str(self.node_rank), "--rdzv-backend", "c10d",
                    "--rdzv-endpoint", str(self.rdzv_endpoint), "--rdzv-id", self.rdzv_id or "dtrain"]
        else:
            cmd += ["--standalone"]
        cmd += list(self.torchrun_args)
        if self.start == "fork":  # see dtrain_lab/jobs/_forked_rank.py
            cmd += ["--run-path", "--start-method", "fork", FORKED_RANK]
        return cmd + self.target_args + [str(a) for a in self.args]

    def child_env(self, job_dir: Path, job_id: str) -> dict[str, str]:
        """The ranks' environment: ours, plus ``env``, the stack-dump hook on ``PYTHONPATH``, the job's
        folder and id (how every process of the job is found again), and the learner's language."""
        child = dict(os.environ)
        for k, v in (self.env or {}).items():
            child[str(k)] = str(v)
        pythonpath = [INJECT_DIR, PACKAGE_PARENT] + [p for p in child.get("PYTHONPATH", "").split(os.pathsep) if p]
        child.update({
            "PYTHONPATH": os.pathsep.join(pythonpath),
            "PYTHONUNBUFFERED": "1",
            "DTRAIN_JOB_DIR": str(job_dir),
            _procs.JOB_ENV: job_id,
            "DTRAIN_LANG": str((self.env or {}).get("DTRAIN_LANG") or get_lang()),  # env= may choose the ranks' language
        })
        if self.backend:
            child["DTRAIN_BACKEND"] = self.backend
        if self.debug:
            child["TORCH_DISTRIBUTED_DEBUG"] = str(self.debug).upper()
        return child
