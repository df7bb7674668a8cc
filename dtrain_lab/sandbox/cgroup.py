"""One control group per graded job, where the machine lets the grader make one; standard library only.

A job's processes (its supervisor, every rank, whatever a rank starts) share one cgroup with

* an equal CPU weight (``cpu.shares`` 1024 in v1, ``cpu.weight`` 100 in v2): however many busy
  processes a submission starts, two jobs side by side split the CPU half and half, where without a
  group the scheduler splits it per process (1,000 busy loops took 99.9 % from a classmate's job);
* a memory limit for the whole job (``memory.limit_in_bytes`` / ``memory.max``), beyond the per-process
  address-space limit, and its peak, read back after the job (``memory.max_usage_in_bytes`` /
  ``memory.peak``): a measurement made from outside the ranks;
* a process limit for the whole job (``pids.max``), whoever the processes run as.

Where: cgroup v1 controllers ``cpu``, ``memory`` and ``pids`` (each mounted under ``/sys/fs/cgroup/<c>``),
or cgroup v2 (``/sys/fs/cgroup/cgroup.controllers``), in a child of the grader's own cgroup of each
hierarchy (so that a grader confined by its own container stays inside it). That needs write access
there: root on most machines, or a delegated subtree (a systemd user scope for a normal user on v2).
Elsewhere :func:`create` returns None and the job runs without a group: the ranks' own limits (their
namespaces, rlimits and, without a sandbox, their uid) still apply, but a CPU burner slows its
neighbours; :func:`why_not` says why, and the instructor guide lists what each mode proves.
"""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")
V1_CONTROLLERS = ("cpu", "memory", "pids")
PREFIX = "dtrain-job-"


def _own_path(controller: str) -> str | None:
    """This process's cgroup path in ``controller``'s v1 hierarchy ('' for v2's), from /proc/self/cgroup."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) == 3 and controller in parts[1].split(","):
            return parts[2]
        if len(parts) == 3 and controller == "" and parts[0] == "0" and parts[1] == "":
            return parts[2]
    return None


def _bases() -> tuple[str, dict[str, Path]] | tuple[None, str]:
    """``("v1", {controller: folder})`` or ``("v2", {"": folder})``: where this process may create job
    groups; or ``(None, why)``."""
    if all((ROOT / c / "cgroup.procs").exists() for c in V1_CONTROLLERS):
        bases = {}
        for c in V1_CONTROLLERS:
            own = _own_path(c)
            if own is None:
                return None, f"no {c} cgroup in /proc/self/cgroup"
            bases[c] = ROOT / c / own.lstrip("/")
        if all(os.access(b, os.W_OK) for b in bases.values()):
            return "v1", bases
        return None, "the cgroup v1 folders of this process are not writable (not root)"
    if (ROOT / "cgroup.controllers").exists():
        own = _own_path("")
        base = ROOT / (own or "").lstrip("/")
        try:
            enabled = (base / "cgroup.subtree_control").read_text().split()
        except OSError:
            return None, "cgroup v2: this process's cgroup cannot be read"
        missing = [c for c in ("cpu", "memory", "pids") if c not in enabled]
        if missing or not os.access(base, os.W_OK):
            return None, f"cgroup v2: no delegated subtree with {', '.join(missing) or 'write access'} here"
        return "v2", {"": base}
    return None, "no cgroup v1 cpu/memory/pids and no cgroup v2 mounted"


def why_not() -> str:
    """'' where jobs get a group of their own, else why not (for the modes table and the bench)."""
    version, detail = _bases()
    return "" if version else str(detail)


def _write(path: Path, value) -> bool:
    try:
        with open(path, "w") as f:
            f.write(str(value))
        return True
    except OSError:
        return False


class JobGroup:
    """The cgroup folders of one job (one per v1 controller, or one v2 folder)."""

    def __init__(self, version: str, folders: dict[str, Path]):
        self.version = version
        self.folders = folders

    def add(self, pid: int) -> bool:
        """Move ``pid`` in (its children from then on are born inside)."""
        return all(_write(f / "cgroup.procs", pid) for f in self.folders.values())

    def pids(self) -> set[int]:
        found = set()
        for f in self.folders.values():
            try:
                found |= {int(x) for x in (f / "cgroup.procs").read_text().split()}
            except (OSError, ValueError):
                continue
        return found

    def memory_peak(self) -> int | None:
        """The most memory the job's processes held at once, in bytes (read by the kernel's accounting)."""
        name = "memory.max_usage_in_bytes" if self.version == "v1" else "memory.peak"
        folder = self.folders.get("memory" if self.version == "v1" else "")
        try:
            return int((folder / name).read_text().strip()) if folder else None
        except (OSError, ValueError):
            return None

    def remove(self, timeout: float = 5.0) -> None:
        """SIGKILL whatever is still inside, then delete the folders."""
        deadline = time.monotonic() + timeout
        while True:
            left = self.pids()
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            if not left or time.monotonic() > deadline:
                break
            time.sleep(0.02)
        for f in self.folders.values():
            for _ in range(50):
                try:
                    f.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:   # EBUSY while the last processes are reaped
                    time.sleep(0.02)


def create(name: str, memory_bytes: int, pids_max: int) -> JobGroup | None:
    """A group for the job ``name`` (its folder's name), or None where this machine has none for us."""
    version, bases = _bases()
    if version is None:
        return None
    folders = {}
    try:
        for key, base in bases.items():
            folder = base / f"{PREFIX}{name}"
            folder.mkdir(mode=0o755)
            folders[key] = folder
    except OSError:
        JobGroup(version, folders).remove()
        return None
    group = JobGroup(version, folders)
    if version == "v1":
        ok = (_write(folders["cpu"] / "cpu.shares", 1024)
              and _write(folders["memory"] / "memory.limit_in_bytes", memory_bytes)
              and _write(folders["pids"] / "pids.max", pids_max))
    else:
        f = folders[""]
        ok = _write(f / "cpu.weight", 100) and _write(f / "memory.max", memory_bytes) and _write(f / "pids.max", pids_max)
    if not ok:
        group.remove()
        return None
    return group


_swept_at = [float("-inf")]


def sweep(every: float = 60.0) -> int:
    """Remove job groups left by a grader that died (empty ones only: a running job's group holds
    processes), at most once per ``every`` seconds in this process (a class run creates hundreds of
    groups; the leftovers it looks for are a minute old anyway). Returns how many were removed."""
    if time.monotonic() - _swept_at[0] < every:
        return 0
    _swept_at[0] = time.monotonic()
    version, bases = _bases()
    if version is None:
        return 0
    n = 0
    for base in bases.values():
        for folder in base.glob(PREFIX + "*"):
            try:
                # an empty group younger than a minute may be a starting job's, not yet joined
                if time.time() - folder.stat().st_mtime > 60 and not (folder / "cgroup.procs").read_text().strip():
                    folder.rmdir()
                    n += 1
            except OSError:
                continue
    return n
