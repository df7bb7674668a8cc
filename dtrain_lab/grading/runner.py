"""Run one submission on N ranks, each rank in its own sandbox, and collect what came back.

The grader's side of a graded job (the judging is in :mod:`dtrain_lab.grading.grader`):

1. a private job folder: every rank's private inputs (only that rank's sandbox will contain its
   file), the files each rank may write (result, trace, events, error, stack), a copy of the
   submission, the supervisor's plan;
2. the job's supervisor (:mod:`dtrain_lab.sandbox.supervisor`), forked by this process's supervisor
   server into the job's outer sandbox (:mod:`dtrain_lab.sandbox.bwrap`); it starts every rank in
   its inner sandbox and records how each ended;
3. two clocks, as in :func:`dtrain_lab.launch`: start-up until the first rank joined the process
   group, then the exercise's time limit; on a hang every rank is asked for its stack (SIGUSR1);
4. the end: the outer sandbox is killed (its PID namespace dies with it: nothing of the job
   survives, whatever it forked), and only then are the ranks' files read, size-capped, decoded as
   data (:mod:`dtrain_lab.grading.channel`).

Without a sandbox (``sandboxed=False``: ``--no-sandbox``, or a learner's self-check where bubblewrap
cannot run) the same job runs as plain processes under the same supervisor, a child subreaper:
every process of it is still killed at the end (:mod:`dtrain_lab.sandbox.contain`), but nothing is
private.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import signal
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from dtrain_lab.grading import channel, trace
from dtrain_lab.i18n import both
from dtrain_lab.jobs import _procs
from dtrain_lab.jobs.diagnose import WaitSite, wait_site
from dtrain_lab.jobs.options import prune_old
from dtrain_lab.sandbox import bwrap as sandbox
from dtrain_lab.sandbox import cgroup, contain, enter, runas, supervisors

RANK_PREFIX = enter.RANK_NAME.split("{")[0]   # the rank processes' name (comm): harness-rank-N
RW_FILES = ("result", "trace", "events", "error", "stack", "marks")
MAX_TRACE = 4 << 20
MAX_EVENTS = 256 << 10
MAX_ERROR = 64 << 10


@dataclass
class JobSpec:
    exercise: str
    entry: str
    submission: Path
    world_size: int
    inputs: list                     # per rank, encoded by channel.encode
    timeout: float
    startup_timeout: float = 60.0
    env: dict = field(default_factory=dict)
    max_restarts: int = 0
    pg_timeout: float | None = None
    setup: str | None = None
    hide: tuple = ()
    limits: sandbox.Limits = field(default_factory=sandbox.Limits)
    sandboxed: bool = True
    lang: str = "en"
    shared: bool = False             # mount the job's /shared in every rank (Exercise.shared)
    faults: list = field(default_factory=list)   # [{"attempt", "rank", "mark"}]: the supervisor's kills
    later_inputs: list | None = None  # per rank, encoded: the inputs of attempts after the first


@dataclass
class RankOutcome:
    rank: int
    code: int | None = None          # exit code of the last attempt, observed by the supervisor
    signal: str | None = None        # "SIGKILL", "SIGXFSZ", ... when a signal ended it
    ended: float | None = None       # wall time it ended
    events: dict = field(default_factory=dict)   # name -> first time (self-reported)
    result: Any = None
    error: dict | None = None
    trace: list = field(default_factory=list)
    stack: str | None = None
    waiting: WaitSite | None = None
    stdout: str = ""
    stderr: str = ""

    @property
    def output(self) -> str:
        return self.stdout + self.stderr

    @property
    def done(self) -> bool:
        return "done" in self.events


@dataclass
class JobResult:
    world_size: int
    ok: bool = False
    hung: bool = False
    phase: str | None = None
    limit: float = 0.0
    elapsed: float = 0.0
    startup: float | None = None
    attempts: int = 0                     # counted by the supervisor, never by a rank
    faults: list = field(default_factory=list)   # [(attempt, rank, mark)] the supervisor's kills that fired
    ranks: list = field(default_factory=list)
    sandboxed: bool = True
    mode: str = "none"                     # "bwrap" or "none"
    to_first_start: float | None = None   # seconds from launch until the first rank's harness ran
    start_error: str = ""                 # the grader's machine could not start the job (not the submission's doing)
    job_dir: str = ""
    cgroup: bool = False                  # the job ran in a cgroup of its own (sandbox.cgroup)
    memory_peak: int | None = None        # the job's peak memory, bytes, read from its cgroup (from outside)
    wire_bytes: int | None = None         # bytes the ranks sent each other over loopback, counted by the kernel
                                          # in the job's own network namespace (from outside; bwrap only)


def _job_root() -> Path:
    """The grader's folder of job folders (private to this user: mode 0700), pruned like the launcher's."""
    root = Path(os.environ.get("DTRAIN_RUN_DIR") or tempfile.gettempdir()) / f"dtrain_grade-{os.getuid()}"
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    return prune_old(root)


def job_memory(spec: JobSpec) -> int:
    """The memory limit of a job's cgroup: every rank's address-space limit, and 1 GiB for its supervisor."""
    return int(spec.limits.memory_gb * (1 << 30)) * spec.world_size + (1 << 30)


def _owned(path: Path, mode: int, uid: int | None = None) -> None:
    """A file the rank may write: owned by it when the grader is root (the sandbox user, or the uid
    unsandboxed ranks run as)."""
    path.touch()
    path.chmod(mode)
    if sandbox_root():
        owner = sandbox.SANDBOX_UID if uid is None else uid
        os.chown(path, owner, owner)


def sandbox_root() -> bool:
    return os.geteuid() == 0


def _prepare(spec: JobSpec, job_dir: Path) -> dict:
    """Write the job folder and return the supervisor's plan."""
    job_dir.chmod(0o755)
    (job_dir / "spec.json").write_text(json.dumps({"entry": spec.entry, "pg_timeout": spec.pg_timeout,
                                                   "setup": spec.setup, "exercise": spec.exercise}))
    shutil.copyfile(spec.submission, job_dir / "submission.py")
    for name in ("spec.json", "submission.py"):
        (job_dir / name).chmod(0o644)
    etc = sandbox.etc_files(job_dir / "etc") if spec.sandboxed else {}
    shared = job_dir / "shared"
    shared.mkdir(mode=0o755)
    hidden = {}
    for module in spec.hide:
        target = module_file(module)
        if target is not None:
            hidden[str(target)] = stub_module(job_dir / "hide", module)
    job_id = job_dir.name
    # unsandboxed ranks of a root grader that runs them as others: one fresh uid for this job
    uid = runas.fresh_uid() if runas.enabled() and not spec.sandboxed and sandbox_root() else None
    if uid is not None:
        job_dir.parent.chmod(0o711)   # the rank may pass through the grader's folders, not list them
        job_dir.chmod(0o711)
        shared.chmod(0o1777)
    ranks = []
    for r in range(spec.world_size):
        rdir = job_dir / f"rank{r}"
        rdir.mkdir(mode=0o755)
        for a in range(spec.max_restarts + 1):
            adir = rdir / f"a{a}"
            adir.mkdir(mode=0o755)
            later = a > 0 and spec.later_inputs is not None
            (adir / "inputs").write_bytes(spec.later_inputs[r] if later else spec.inputs[r])
            (adir / "inputs").chmod(0o644 if spec.sandboxed else 0o600)
            for name in RW_FILES:
                _owned(adir / name, 0o600, uid)
            if sandbox_root() and spec.sandboxed:
                os.chown(adir, sandbox.SANDBOX_UID, sandbox.SANDBOX_UID)
            if uid is not None:
                os.chown(adir / "inputs", uid, uid)
                os.chown(adir, uid, uid)
        if uid is not None:
            os.chown(rdir, uid, uid)
            rdir.chmod(0o700)
        base_env = {"RANK": r, "WORLD_SIZE": spec.world_size, "LOCAL_RANK": r, "LOCAL_WORLD_SIZE": spec.world_size,
                    "GROUP_RANK": 0, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "{port}",
                    "TORCHELASTIC_RESTART_COUNT": "{attempt}", "DTRAIN_BACKEND": "gloo", "GLOO_SOCKET_IFNAME": "lo",
                    "DTRAIN_LANG": spec.lang, "PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": "1",
                    "OMP_NUM_THREADS": "1", _procs.JOB_ENV: job_id, **spec.env}
        adir_t = str(rdir / "a{attempt}")
        rank = {"module": "dtrain_lab.grading.harness", "args": ["--rank", str(r)],
                "stdout": f"{adir_t}/stdout.log", "stderr": f"{adir_t}/stderr.log", "marks": f"{adir_t}/marks"}
        if spec.sandboxed:
            env = {**base_env, "HOME": sandbox.HOME, "USER": "learner", "LOGNAME": "learner", "PATH": "/usr/bin:/bin",
                   "PYTHONPATH": str(sandbox.PACKAGE_DIR.parent), "TMPDIR": "/tmp",
                   "DTRAIN_GRADE_IO": f"{sandbox.IO}/out", "DTRAIN_GRADE_INPUTS": f"{sandbox.IO}/inputs",
                   "DTRAIN_GRADE_SPEC": f"{sandbox.IO}/spec.json", "DTRAIN_GRADE_SUBMISSION": f"{sandbox.IO}/submission.py",
                   **({"DTRAIN_GRADE_SHARED": sandbox.SHARED} if spec.shared else {})}
            ro = {f"{sandbox.IO}/inputs": f"{adir_t}/inputs", f"{sandbox.IO}/spec.json": job_dir / "spec.json",
                  f"{sandbox.IO}/submission.py": job_dir / "submission.py", **hidden}
            rw = {f"{sandbox.IO}/out/{name}": f"{adir_t}/{name}" for name in RW_FILES}
            # the rank's sandbox around a placeholder, which the supervisor enters (sandbox/enter.py)
            rank["placeholder"] = sandbox.inner_argv(env=env, ro=ro, rw=rw, limits=spec.limits, command=_PLACEHOLDER,
                                                     etc=etc, share=spec.shared)
            rank["home"] = sandbox.HOME
        else:
            env = {k: v for k, v in os.environ.items() if not k.startswith(("DTRAIN_GRADE", "DTRAIN_HIDDEN"))}
            env.update({k: str(v) for k, v in base_env.items()})
            env.update({"PYTHONPATH": os.pathsep.join([str(sandbox.PACKAGE_DIR.parent)] +
                                                      [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]),
                        "DTRAIN_GRADE_IO": adir_t, "DTRAIN_GRADE_INPUTS": f"{adir_t}/inputs",
                        "DTRAIN_GRADE_SPEC": str(job_dir / "spec.json"),
                        "DTRAIN_GRADE_SUBMISSION": str(job_dir / "submission.py"), "DTRAIN_GRADE_SHARED": str(shared)})
            rank["home"] = str(rdir)
            if uid is not None:
                rank["uid"] = uid
                env.update({"HOME": str(rdir), "TMPDIR": str(shared), "USER": "learner", "LOGNAME": "learner"})
        rank["env"] = {k: str(v) for k, v in env.items()}
        ranks.append(rank)
    mode = "bwrap" if spec.sandboxed else "none"
    return {"world": spec.world_size, "max_restarts": spec.max_restarts, "ranks": ranks, "mode": mode,
            "bwrap": sandbox.probe().bwrap if spec.sandboxed else None, "sys_path": list(supervisors.fresh_sys_path()),
            "limits": spec.limits.rlimits(), "status": str(job_dir / "status.jsonl"),
            "faults": [{"attempt": int(f["attempt"]), "rank": int(f["rank"]), "mark": str(f["mark"])} for f in spec.faults],
            "port_base": 29500 if spec.sandboxed else 0}


_PLACEHOLDER = [shutil.which("sleep") or "/usr/bin/sleep", "infinity"]


def stub_module(folder: Path, module: str) -> Path:
    """A stand-in for a library module the exercise asks the learner to write: importing it
    raises ImportError, in both languages, naming the module."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / (module.replace(".", "_") + ".py")
    path.write_text(f"raise ImportError({both('grade_module_hidden', module=module)!r})\n")
    path.chmod(0o644)
    return path


def module_file(module: str) -> Path | None:
    rel = Path(*module.split(".")[1:])
    for p in (sandbox.PACKAGE_DIR / rel.with_suffix(".py"), sandbox.PACKAGE_DIR / rel / "__init__.py"):
        if p.is_file():
            return p
    return None


def number(value) -> float | None:
    """``value`` if it is a finite number (not a bool), else None: a rank's files are hostile input."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def _events(path: Path) -> dict:
    """``{name: time}`` of the first event of each name a rank marked; an entry whose name is not a
    short string or whose time is not a number is ignored (the rank wrote it, it is hostile input)."""
    out: dict = {}
    text = channel.read_text(str(path), MAX_EVENTS)
    for line in text.splitlines():
        try:
            item = json.loads(line)
        except ValueError:
            continue
        if not isinstance(item, dict) or not isinstance(item.get("ev"), str) or len(item["ev"]) > 64:
            continue
        t = number(item.get("t"))
        if t is not None and item["ev"] not in out and len(out) < 64:
            out[item["ev"]] = t
    return out


_STATUS_FIELDS = {
    "event": lambda v: isinstance(v, str) and len(v) <= 32,
    "attempt": lambda v: type(v) is int and 0 <= v <= 1000,
    "rank": lambda v: type(v) is int and 0 <= v < (1 << 20),
    "code": lambda v: type(v) is int,
    "t": lambda v: number(v) is not None,
    "ok": lambda v: type(v) is bool,
    "error": lambda v: isinstance(v, str),
    "mark": lambda v: isinstance(v, str) and len(v) <= 64,
    "port": lambda v: type(v) is int,
    "bytes": lambda v: type(v) is int and v >= 0,
    "packets": lambda v: type(v) is int and v >= 0,
}


def _status(job_dir: Path) -> list[dict]:
    """The supervisor's records (it alone writes them), each an object with an ``event``; a field of
    the wrong type is dropped, as everywhere the grader reads a file back."""
    items = []
    for line in channel.read_text(str(job_dir / "status.jsonl"), 1 << 20).splitlines():
        try:
            item = json.loads(line)
        except ValueError:
            continue
        if isinstance(item, dict) and _STATUS_FIELDS["event"](item.get("event")):
            items.append({k: v for k, v in item.items() if k in _STATUS_FIELDS and _STATUS_FIELDS[k](v)})
    return items


def _current_attempt(job_dir: Path) -> int:
    return max([s["attempt"] for s in _status(job_dir) if s["event"] == "attempt" and "attempt" in s], default=0)


def _rank_processes(root: psutil.Process) -> dict[int, psutil.Process]:
    """The harness process of every rank: the topmost process of that name (a child the learner
    forked inherits the name; start times cannot tell them apart, they are clock ticks)."""
    named: dict[int, psutil.Process] = {}
    rank_of: dict[int, int] = {}
    try:
        procs = root.children(recursive=True)
    except psutil.Error:
        return {}
    for p in procs:
        try:
            name = p.name()
            if name.startswith(RANK_PREFIX):    # a rank the supervisor started (sandbox/enter.py), or its child
                rank_of[p.pid] = int(name[len(RANK_PREFIX):])
                named[p.pid] = p
        except (psutil.Error, ValueError, IndexError):
            continue
    found: dict[int, psutil.Process] = {}
    for pid, r in rank_of.items():
        try:
            if rank_of.get(named[pid].ppid()) != r:
                found.setdefault(r, named[pid])
        except psutil.Error:
            continue
    return found


def run(spec: JobSpec) -> JobResult:
    """Run the job; never raises for what the submission does."""
    job_dir = _job_root() / f"{spec.exercise.replace('.', '_')}_{uuid.uuid4().hex[:10]}"
    job_dir.mkdir(mode=0o700)
    plan = _prepare(spec, job_dir)
    # one cgroup per job where the machine gives us one: CPU shared per job, not per process; the
    # job's memory and process count limited as a whole; its memory peak measured from outside
    from dtrain_lab import caps

    group = None
    if caps.have("cgroup"):
        cgroup.sweep()   # the empty groups a grader that was killed left behind
        group = cgroup.create(job_dir.name, memory_bytes=job_memory(spec), pids_max=spec.limits.nproc)
    if group is not None:
        plan["hold"] = str(job_dir / "in_cgroup")
    (job_dir / "plan.json").write_text(json.dumps(plan))
    res = JobResult(world_size=spec.world_size, sandboxed=spec.sandboxed, job_dir=str(job_dir), mode=plan["mode"],
                    cgroup=group is not None)
    t0, wall0 = time.monotonic(), time.time()
    outer = sandbox.outer_argv(job_dir, spec.limits, _PLACEHOLDER) if spec.sandboxed else None
    try:
        proc = supervisors.start(str(job_dir / "plan.json"), str(job_dir / "supervisor.log"), outer, plan["bwrap"])
    except supervisors.StartError as exc:
        if group is not None:
            group.remove()
        res.start_error = str(exc)[:2000]
        res.elapsed = time.monotonic() - t0
        _collect(spec, job_dir, res, wall0)
        return res
    if group is not None:   # the supervisor waits for this before it starts any rank
        for pid in [proc.pid, *contain.descendants(proc.pid)]:
            group.add(pid)
        (job_dir / "in_cgroup").touch()
    ready_at, attempt, t_attempt = None, 0, t0
    try:
        if not supervisors.started(proc, job_dir / "status.jsonl"):   # it ended before starting anything
            why = channel.read_text(str(job_dir / "supervisor.log"), 2000).strip().splitlines()
            res.start_error = "the job's supervisor did not start: " + (why[-1] if why else f"exit code {proc.poll()}")
        while proc.poll() is None:
            now = time.monotonic()
            a = _current_attempt(job_dir)
            if a != attempt:                      # a restart: both clocks start again
                attempt, ready_at, t_attempt = a, None, now
            if ready_at is None:
                if any("ready" in _events(job_dir / f"rank{r}" / f"a{attempt}" / "events") for r in range(spec.world_size)):
                    ready_at = now
                elif now - t_attempt > spec.startup_timeout:
                    res.hung, res.phase, res.limit = True, "startup", spec.startup_timeout
                    break
            elif now - ready_at > spec.timeout:
                res.hung, res.phase, res.limit = True, "run", spec.timeout
                break
            time.sleep(0.05)
        if res.hung:
            _collect_stacks(proc, job_dir, attempt, res)
    finally:
        contain.kill_tree(proc.pid)   # the supervisor is a subreaper: its tree is the whole job
        proc.kill()
        if group is not None:
            res.memory_peak = group.memory_peak()
            group.remove()            # and whatever of the job is still in its group
    res.elapsed = time.monotonic() - t0
    _collect(spec, job_dir, res, wall0)
    return res


def _collect_stacks(proc, job_dir: Path, attempt: int, res: JobResult) -> None:
    try:
        root = psutil.Process(proc.pid)
    except psutil.Error:
        return
    asked = []
    for r, p in _rank_processes(root).items():
        try:
            p.send_signal(signal.SIGUSR1)
            asked.append(r)
        except psutil.Error:
            pass
    _procs.wait_stable_all([str(job_dir / f"rank{r}" / f"a{attempt}" / "stack") for r in asked], timeout=3.0)


def _signal_name(code: int | None, sandboxed: bool) -> str | None:
    if code is None:
        return None
    num = -code if code < 0 else (code - 128 if sandboxed and 128 < code < 160 else None)
    if num is None:
        return None
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


def _collect(spec: JobSpec, job_dir: Path, res: JobResult, wall0: float) -> None:
    """Read what the job left (size-capped, each file parsed as hostile input), then remove its folder,
    whatever happens while reading."""
    try:
        _read_back(spec, job_dir, res, wall0)
    finally:
        if not os.environ.get("DTRAIN_KEEP_GRADE_DIRS"):
            shutil.rmtree(job_dir, ignore_errors=True)


def _read_back(spec: JobSpec, job_dir: Path, res: JobResult, wall0: float) -> None:
    status = _status(job_dir)
    res.attempts = 1 + max([s["attempt"] for s in status if s["event"] == "attempt" and "attempt" in s], default=0)
    last = res.attempts - 1
    res.faults = [(s.get("attempt"), s.get("rank"), s.get("mark")) for s in status
                  if s["event"] == "fault" and {"attempt", "rank", "mark"} <= set(s)]
    res.wire_bytes = next((s["bytes"] for s in status if s["event"] == "wire" and "bytes" in s), None)
    exits = {s["rank"]: s for s in status if s["event"] == "exit" and s.get("attempt") == last and "rank" in s}
    killed = {s["rank"]: s for s in status if s["event"] == "killed" and s.get("attempt") == last and "rank" in s}
    res.start_error = res.start_error or next((s.get("error", "") for s in status if s.get("event") == "start_failed"), "")
    res.ok = not res.hung and any(s.get("event") == "end" and s.get("ok") for s in status)
    lim = spec.limits.log_bytes
    starts = []
    for r in range(spec.world_size):
        adir = job_dir / f"rank{r}" / f"a{last}"
        ro = RankOutcome(rank=r)
        if r in exits:
            ro.code, ro.ended = exits[r].get("code"), exits[r].get("t")
            ro.signal = _signal_name(ro.code, spec.sandboxed)
        elif r in killed:   # the supervisor ended it when a peer failed (SIGKILL), as torchrun does
            ro.signal, ro.ended = "SIGKILL", killed[r].get("t")
        ev = _events(adir / "events")
        ro.events = ev
        if "done" in ev:
            ro.result = channel.read(str(adir / "result"))
        err = channel.read_text(str(adir / "error"), MAX_ERROR)
        if err:
            try:
                info = json.loads(err)
            except ValueError:
                info = None
            if isinstance(info, dict):
                ro.error = {k: str(info.get(k, ""))[:8000] for k in ("type", "message", "traceback")}
                ro.error["time"] = number(info.get("time"))
        ro.trace = trace.parse(channel.read_text(str(adir / "trace"), MAX_TRACE))
        stack = channel.read_text(str(adir / "stack"), 256 << 10)
        if stack.strip():
            ro.stack = stack
            if spec.sandboxed:   # the copy of the submission outside, so that the waiting line can be quoted
                stack = stack.replace(f"{sandbox.IO}/submission.py", str(job_dir / "submission.py"))
            ro.waiting = wait_site(stack)
        ro.stdout = channel.read_text(str(adir / "stdout.log"), lim)
        ro.stderr = channel.read_text(str(adir / "stderr.log"), lim)
        if "start" in ro.events:
            starts.append(ro.events["start"])
        if "ready" in ro.events and (res.startup is None or ro.events["ready"] - wall0 < res.startup):
            res.startup = max(0.0, ro.events["ready"] - wall0)
        res.ranks.append(ro)
    if starts:
        res.to_first_start = max(0.0, min(starts) - wall0)
