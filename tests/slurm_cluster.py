"""A real SLURM cluster on this machine, for the tests: munge, ``slurmctld`` and two ``slurmd`` nodes
(``n1``, ``n2``), all in one temporary folder, on free ports, stopped by pid at the end.

    with LocalSlurm(tmp_path) as cluster:          # or the ``slurm`` fixture of a test module
        out = cluster.run("sbatch", "--parsable", "job.sh")

Debian's ``slurm-wlm`` is built with ``MULTIPLE_SLURMD``, so two ``slurmd`` on one host act as two nodes;
``proctrack/linuxproc`` and ``task/none`` need no cgroup set-up. Every client command run through
:meth:`LocalSlurm.run` (and every job, which inherits it) gets ``SLURM_CONF`` pointing at this cluster's
own ``slurm.conf``: nothing of the system's ``/etc/slurm`` or ``/etc/munge`` is read or changed.

Where this cannot work, :func:`unavailable` says why in one line (the tests skip with it): SLURM's or
munge's programs missing, or not root (``slurmd`` runs jobs as their owner and must be root).
"""
from __future__ import annotations

import os
import secrets
import shutil
import sys
import signal
import socket
import subprocess
import time
from pathlib import Path

import psutil

DAEMONS = ("munged", "slurmctld", "slurmd")
# Started beside the daemons, in a session of its own: once the process that started the cluster is gone
# without stopping it (killed, os._exit), it kills every process of the cluster and of its jobs, then
# removes the folder. A normal stop ends it first.
JANITOR = r"""
import os, shutil, sys, time
sys.path.insert(0, sys.argv[4])
from slurm_cluster import cluster_processes
parent, conf, root = int(sys.argv[1]), sys.argv[2], sys.argv[3]
while os.getppid() == parent:
    time.sleep(0.5)
for proc in cluster_processes(conf):
    try:
        proc.kill()
    except Exception:
        pass
shutil.rmtree(root, ignore_errors=True)
"""


def cluster_processes(conf: str | os.PathLike) -> list[psutil.Process]:
    """Every process of the cluster whose ``slurm.conf`` is ``conf`` (its daemons, its job steps and what
    they run), but this one: ``SLURM_CONF`` in its environment, or the cluster's folder in its command line,
    working folder or open files. ``slurmstepd`` writes its title (``slurmstepd: [1.0]``) over its command
    line and environment, so only its open files (the node's log) tell whose it is."""
    conf = str(conf)
    root = str(Path(conf).parent)
    found = []
    for proc in psutil.process_iter(["pid", "cmdline", "environ", "cwd"]):
        if proc.pid == os.getpid():
            continue
        info = proc.info
        paths = [info["cwd"] or ""]
        try:
            fd_dir = f"/proc/{proc.pid}/fd"
            paths += [os.readlink(os.path.join(fd_dir, fd)) for fd in os.listdir(fd_dir)]
        except OSError:
            pass
        if ((info["environ"] or {}).get("SLURM_CONF") == conf or root in " ".join(info["cmdline"] or [])
                or any(p == root or p.startswith(root + os.sep) for p in paths)):
            found.append(proc)
    return found


PROGRAMS = DAEMONS + ("sbatch", "squeue", "sinfo", "scontrol", "srun", "scancel")
NODES = ("n1", "n2")
CPUS_PER_NODE = 2


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL when the process that started it dies (Linux PR_SET_PDEATHSIG)."""
    import ctypes

    ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)


def _free_ports(n: int) -> list[int]:
    socks, ports = [], []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
        ports.append(s.getsockname()[1])
    for s in socks:
        s.close()
    return ports


def _which(name: str) -> str | None:
    return shutil.which(name, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin")


def unavailable() -> str | None:
    """Why a local SLURM cluster cannot run on this machine (one line), or None when it can."""
    missing = [p for p in PROGRAMS if _which(p) is None]
    if missing:
        return f"no SLURM here ({', '.join(missing)} not found: apt-get install slurm-wlm munge)"
    if os.geteuid() != 0:
        return "SLURM's daemons need root here (slurmd runs each job as its owner); this is a normal user"
    return None


class LocalSlurm:
    """Start with :meth:`start` (or ``with``), stop with :meth:`stop`: every daemon started is stopped by
    its pid, SIGTERM then SIGKILL, and the folder is removed."""

    def __init__(self, root: str | os.PathLike, nodes: tuple[str, ...] = NODES):
        self.root = Path(root)
        self.nodes = nodes
        self.procs: list[subprocess.Popen] = []
        self.conf = self.root / "slurm.conf"
        self.munge_socket = self.root / "munge" / "munge.socket"
        self.env = dict(os.environ, SLURM_CONF=str(self.conf))
        self.env["PATH"] = self.env.get("PATH", "") + ":/usr/sbin:/sbin"
        self.start_s = self.stop_s = None
        self.janitor: subprocess.Popen | None = None

    # ------------------------------------------------------------------ set-up
    def _write_config(self) -> None:
        ctl_port, *node_ports = _free_ports(1 + len(self.nodes))
        for d in ("munge", "state", "spool", "log", *(f"spool/{n}" for n in self.nodes)):
            (self.root / d).mkdir(parents=True, exist_ok=True)
        os.chmod(self.root / "munge", 0o700)
        key = self.root / "munge" / "munge.key"
        key.write_bytes(secrets.token_bytes(1024))
        os.chmod(key, 0o400)
        host = socket.gethostname()
        lines = [
            "ClusterName=dtrainlab",
            f"SlurmctldHost={host}(127.0.0.1)",
            f"SlurmctldPort={ctl_port}",
            "SlurmUser=root",
            "SlurmdUser=root",
            f"AuthInfo=socket={self.munge_socket}",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"StateSaveLocation={self.root / 'state'}",
            f"SlurmdSpoolDir={self.root / 'spool'}/%n",
            f"SlurmctldPidFile={self.root / 'slurmctld.pid'}",
            f"SlurmdPidFile={self.root / 'slurmd'}.%n.pid",
            f"SlurmctldLogFile={self.root / 'log' / 'slurmctld.log'}",
            f"SlurmdLogFile={self.root / 'log'}/slurmd.%n.log",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU",
            "SchedulerType=sched/builtin",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "MpiDefault=none",
            "ReturnToService=2",
            "SlurmctldTimeout=30",
            "SlurmdTimeout=30",
            "InactiveLimit=0",
            "KillWait=5",
            "MinJobAge=600",
            "MessageTimeout=20",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
        ]
        for name, port in zip(self.nodes, node_ports):
            lines.append(f"NodeName={name} NodeHostname={host} NodeAddr=127.0.0.1 Port={port} "
                         f"CPUs={CPUS_PER_NODE} RealMemory=2048 State=UNKNOWN")
        lines.append(f"PartitionName=debug Nodes={','.join(self.nodes)} Default=YES MaxTime=INFINITE State=UP")
        lines.append(f"PartitionName=grading Nodes={','.join(self.nodes)} Default=NO MaxTime=INFINITE State=UP")
        self.conf.write_text("\n".join(lines) + "\n")

    def _daemon(self, *cmd: str, log: str) -> subprocess.Popen:
        out = open(self.root / "log" / log, "ab")
        p = subprocess.Popen(list(cmd), env=self.env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                             start_new_session=True, preexec_fn=_die_with_parent)
        out.close()
        self.procs.append(p)
        return p

    def start(self, timeout: float = 60.0) -> "LocalSlurm":
        t0 = time.monotonic()
        self._write_config()
        self.janitor = subprocess.Popen([sys.executable, "-c", JANITOR, str(os.getpid()), str(self.conf), str(self.root),
                                         str(Path(__file__).resolve().parent)],
                                        stdin=subprocess.DEVNULL, start_new_session=True)
        m = self.root / "munge"
        self._daemon(_which("munged"), "--foreground", "--force", f"--socket={self.munge_socket}",
                     f"--key-file={m / 'munge.key'}", f"--pid-file={m / 'munged.pid'}",
                     f"--log-file={m / 'munged.log'}", f"--seed-file={m / 'munged.seed'}", log="munged.out")
        self._wait(lambda: self.munge_socket.exists(), timeout, "munged")
        self._daemon(_which("slurmctld"), "-D", "-f", str(self.conf), log="slurmctld.out")
        for name in self.nodes:
            self._daemon(_which("slurmd"), "-D", "-N", name, "-f", str(self.conf), log=f"slurmd.{name}.out")
        self._wait(self._nodes_idle, timeout, "slurmd nodes idle")
        self.start_s = time.monotonic() - t0
        return self

    def _wait(self, ready, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            dead = [p for p in self.procs if p.poll() is not None]
            if dead:
                raise RuntimeError(f"a SLURM daemon exited while waiting for {what}: {dead[0].args[0]}\n{self.logs()}")
            if ready():
                return
            time.sleep(0.2)
        raise RuntimeError(f"SLURM: {what} not ready within {timeout:.0f} s\n{self.logs()}")

    def _nodes_idle(self) -> bool:
        r = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %t"], env=self.env, capture_output=True, text=True,
                           timeout=20)
        states = dict(line.split() for line in r.stdout.splitlines() if len(line.split()) == 2)
        return r.returncode == 0 and all(states.get(n) == "idle" for n in self.nodes)

    # ------------------------------------------------------------------ use
    def run(self, *cmd: str, timeout: float = 120.0, check: bool = True, cwd=None,
            env: dict | None = None) -> subprocess.CompletedProcess:
        r = subprocess.run(list(cmd), env={**self.env, **(env or {})}, capture_output=True, text=True,
                           timeout=timeout, cwd=cwd)
        if check and r.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} -> {r.returncode}\n{r.stdout}\n{r.stderr}")
        return r

    def job_state(self, job_id: str) -> dict:
        """``scontrol show job -o JOB`` as a dict (the first record: an array's first task)."""
        r = self.run("scontrol", "show", "job", "-o", str(job_id), check=False)
        fields = {}
        for tok in r.stdout.splitlines()[0].split() if r.stdout.strip() else []:
            k, _, v = tok.partition("=")
            fields[k] = v
        return fields

    def wait_job(self, job_id: str, timeout: float = 120.0) -> dict:
        """Until the job (every task of an array) has left the queue; its last ``scontrol`` record."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            r = self.run("squeue", "-h", "-j", str(job_id), "-o", "%i %T", check=False)
            if r.returncode == 0 and not r.stdout.strip():
                return self.job_state(job_id)
            time.sleep(0.3)
        raise TimeoutError(f"SLURM job {job_id} still queued after {timeout:.0f} s\n{self.logs()}")

    def logs(self, limit: int = 3000) -> str:
        parts = []
        for f in sorted((self.root / "log").glob("*")) + [self.root / "munge" / "munged.log"]:
            try:
                parts.append(f"--- {f.name}\n" + f.read_text(errors="replace")[-limit:])
            except OSError:
                pass
        return "\n".join(parts)

    # ------------------------------------------------------------------ tear-down
    def pids(self) -> list[int]:
        """The daemons this cluster started that are still running."""
        return [p.pid for p in self.procs if p.poll() is None]

    def stop(self) -> None:
        t0 = time.monotonic()
        for p in reversed(self.procs):     # nodes first, then the controller, munge last
            if p.poll() is None:
                try:
                    os.kill(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + 10
        for p in self.procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        # what the nodes ran (a job's step left behind by a killed slurmd) goes too
        for _ in range(3):   # a step may still be starting
            left = cluster_processes(self.conf)
            for proc in left:
                try:
                    proc.kill()
                except psutil.Error:
                    pass
            if not left:
                break
            time.sleep(0.2)
        if self.janitor is not None:
            self.janitor.kill()
            self.janitor.wait()
        self.stop_s = time.monotonic() - t0
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> "LocalSlurm":
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc) -> None:
        self.stop()


def leftovers(conf: str | os.PathLike) -> list[psutil.Process]:
    """SLURM or munge processes, or processes of its jobs, still running for the cluster of ``conf``
    (:func:`cluster_processes`, without the zombies: ended, waiting for their parent)."""
    found = []
    for proc in cluster_processes(conf):
        try:
            if proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except psutil.Error:
            continue
    return found
