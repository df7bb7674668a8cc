"""Start a graded rank from a fork of its supervisor (which imported torch once), inside the rank's
bubblewrap sandbox or, without a sandbox, as a plain contained process. Standard library and ctypes.

A fresh ``python`` per rank spends about 1.4 s of CPU on ``import torch``. Instead, the supervisor
(trusted, forked by the supervisor server that imported torch: :mod:`dtrain_lab.sandbox.supervisors`)
starts each rank like this:

1. bubblewrap builds the rank's inner sandbox exactly as :func:`bwrap.inner_argv` describes it (the
   same namespaces, mounts, uid 65534, ``--disable-userns``), around a placeholder command that only
   waits; bubblewrap's own init is PID 1 of the sandbox's PID namespace and the placeholder PID 2;
2. a forked child of the supervisor enters that sandbox the way ``nsenter`` or ``runc exec`` enter a
   container (:func:`_enter`): it leaves host privileges first (root: uid and gid 65534, no groups),
   joins the user namespace that owns the sandbox's namespaces (its creator may), then the IPC, UTS,
   cgroup, mount and PID namespaces, then the rank's own nested user namespace, takes the sandbox's
   root as its root (``chroot``), becomes uid/gid 65534 inside, drops every capability (bounding,
   ambient, effective, permitted, inheritable) and sets ``no_new_privs``;
3. that child forks the rank, a process of the sandbox's PID namespace that is *not* its init (so
   signals act on it as on a plain machine: a rank that kills itself dies), which runs ``python -m
   dtrain_lab.grading.harness --rank R`` in-process through :mod:`dtrain_lab.sandbox.child`: a
   fresh ``__main__``, the rank's environment, ``sys.path``, working folder, resource limits, its own
   session, unbuffered output into its log files, no file descriptor of the supervisor;
4. the child waits for the rank and ends as it ended (``128 + signal`` if killed, as bubblewrap
   reports it), and the placeholder sandbox is killed with it: its PID namespace, and everything the
   rank forked, ends.

Without a sandbox (a self-check where bubblewrap cannot run, or ``--no-sandbox``) steps 1 and 2 are
left out: the rank is a plain fork of the supervisor, which is a child subreaper
(:mod:`dtrain_lab.sandbox.contain`), so everything the rank starts stays in the job's tree.

What the rank has that a fresh process would not: the supervisor's memory, which holds torch and the
job's plan (paths and environments of this job's ranks: nothing of other submissions, no reference or
check). ``/proc/self/environ`` shows the supervisor server's environment, which is only ``PATH``.
Where entering fails (a setuid bubblewrap, a kernel that refuses), :func:`start` raises
:class:`EnterError`; :func:`bwrap.probe` enters one sandbox this way, so such a machine has no sandbox.
"""
import ctypes
import fcntl
import json
import os
import select
import signal
import subprocess
import sys
import time

from dtrain_lab.sandbox import child, contain, forkserve

UID = 65534
RANK_NAME = "harness-rank-{rank}"     # the rank's process name (comm), how the grader finds it for its stack

_NEWNS, _NEWCGROUP, _NEWUTS, _NEWIPC, _NEWUSER, _NEWPID = 0x20000, 0x2000000, 0x4000000, 0x8000000, 0x10000000, 0x20000000
_NS = (("ipc", _NEWIPC), ("uts", _NEWUTS), ("cgroup", _NEWCGROUP), ("mnt", _NEWNS), ("pid", _NEWPID))
_NS_GET_USERNS = 0xB701
_PR_SET_PDEATHSIG, _PR_SET_DUMPABLE, _PR_SET_NAME = 1, 4, 15
_PR_CAPBSET_DROP, _PR_SET_NO_NEW_PRIVS, _PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL = 24, 38, 47, 4

_libc = ctypes.CDLL(None, use_errno=True)
_libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]


class EnterError(OSError):
    pass


def _setns(fd: int, flag: int, what: str) -> None:
    """``setns(2)``: Python's own (3.12+) where there is one, else through libc."""
    if hasattr(os, "setns"):
        try:
            os.setns(fd, flag)
        except OSError as exc:
            raise EnterError(exc.errno, f"{what}: {exc.strerror}") from None
    else:
        _ok(_libc.setns(fd, flag), what)


def _ok(result: int, what: str) -> None:
    if result == -1:
        err = ctypes.get_errno()
        raise EnterError(err, f"{what}: {os.strerror(err)}")


def _prctl(option: int, arg: int = 0) -> None:
    _ok(_libc.prctl(option, arg, 0, 0, 0), f"prctl({option})")


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def last_cap() -> int:
    """The highest capability number of this kernel (read on the host, before entering)."""
    with open("/proc/sys/kernel/cap_last_cap") as f:
        return int(f.read())


# ------------------------------------------------------------------ the placeholder sandbox
def start_placeholder(argv: list, bwrap: str, timeout: float = 30.0):
    """Start ``argv`` (bubblewrap, maybe behind setpriv) with ``--info-fd``; return the Popen, the pid
    of the sandbox's first process once the sandbox is complete (its command was started), and what
    bubblewrap said of it (its namespaces' numbers)."""
    info_r, info_w = os.pipe()
    i = argv.index(bwrap)
    argv = argv[:i + 1] + ["--info-fd", str(info_w)] + argv[i + 1:]
    proc = subprocess.Popen(argv, pass_fds=(info_w,), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, start_new_session=True)
    os.close(info_w)
    data, deadline = b"", time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([info_r], [], [], 0.5)
            if ready:
                chunk = os.read(info_r, 4096)
                data += chunk
                try:
                    info = json.loads(data)
                    init = int(info["child-pid"])
                    break
                except (ValueError, KeyError):
                    if not chunk:
                        raise EnterError(0, "bubblewrap: " + proc.stderr.read(2000).decode(errors="replace")) from None
            elif proc.poll() is not None:
                raise EnterError(0, "bubblewrap: " + proc.stderr.read(2000).decode(errors="replace"))
        else:
            raise EnterError(0, "bubblewrap gave no child pid")
    finally:
        os.close(info_r)
    command = "\0".join(argv[-2:]).encode()   # the placeholder: [sleep, infinity]
    while time.monotonic() < deadline:   # complete once the placeholder command was exec'd in it
        try:
            with open(f"/proc/{init}/task/{init}/children") as f:
                children = f.read().split()
            for child in [init, *children]:   # without a PID namespace the command is bwrap's child itself
                with open(f"/proc/{child}/cmdline", "rb") as f:
                    if f.read().startswith(command):
                        return proc, init, info
        except OSError:
            pass
        if proc.poll() is not None:
            break
        time.sleep(0.005)
    detail = proc.stderr.read(2000).decode(errors="replace") if proc.poll() is not None else "time-out"
    stop_placeholder(proc)
    raise EnterError(0, f"the placeholder sandbox did not start: {detail}")


def stop_placeholder(proc) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass
    try:
        proc.kill()
        proc.wait(timeout=5)
    except Exception:  # noqa: BLE001
        pass
    if proc.stderr is not None:
        proc.stderr.close()


# ------------------------------------------------------------------ entering
def _open_target(pid: int) -> dict:
    fds = {name: os.open(f"/proc/{pid}/ns/{name}", os.O_RDONLY | os.O_CLOEXEC) for name, _ in _NS}
    fds["user"] = os.open(f"/proc/{pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
    fds["root"] = os.open(f"/proc/{pid}/root", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    # bubblewrap nests the command's user namespace (--uid, --disable-userns) inside the one that owns
    # the mount, PID, IPC and UTS namespaces: that owner is entered first
    fds["owner"] = fcntl.ioctl(fds["mnt"], _NS_GET_USERNS)
    return fds


def _enter(fds: dict, home: str, last_cap: int) -> None:
    """The syscalls of step 2 of the module docstring (in a single-threaded forked child)."""
    if os.geteuid() == 0:   # never hold host root's capabilities while entering
        os.setgroups([])
        os.setresgid(UID, UID, UID)
        os.setresuid(UID, UID, UID)
    _setns(fds["owner"], _NEWUSER, "setns(user, owner)")
    for name, flag in _NS:
        _setns(fds[name], flag, f"setns({name})")
    if os.fstat(fds["owner"]).st_ino != os.fstat(fds["user"]).st_ino:
        _setns(fds["user"], _NEWUSER, "setns(user)")
    os.fchdir(fds["root"])
    os.chroot(".")
    os.chdir(home)
    os.setresgid(UID, UID, UID)
    os.setresuid(UID, UID, UID)
    for cap in range(last_cap + 1):
        _prctl(_PR_CAPBSET_DROP, cap)
    _ok(_libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0), "clear ambient capabilities")
    header, data = _CapHeader(0x20080522, 0), (_CapData * 2)()
    _ok(_libc.capset(ctypes.byref(header), data), "capset")
    _prctl(_PR_SET_NO_NEW_PRIVS, 1)
    for fd in fds.values():
        os.close(fd)


def enter_outer(pid: int) -> bool:
    """Join the job's outer sandbox (the namespaces and root of process ``pid``, a placeholder that
    bubblewrap started with :func:`bwrap.outer_argv`) as its supervisor: the supervisor server's
    forked child does this instead of bubblewrap exec'ing a fresh supervisor there. Keeps this
    process's user (the grader's). Unprivileged, bubblewrap made user namespaces (the one that owns
    the others, and the command's inside it): the owner is entered first, as in :func:`_enter`. True
    if the PID namespace differs: the caller must fork once more to be inside it."""
    names = ("ipc", "uts", "net", "mnt", "pid")
    own = {name: os.stat(f"/proc/self/ns/{name}").st_ino for name in (*names, "user")}
    fds = {name: os.open(f"/proc/{pid}/ns/{name}", os.O_RDONLY | os.O_CLOEXEC) for name in (*names, "user")}
    fds["owner"] = fcntl.ioctl(fds["mnt"], _NS_GET_USERNS)
    root = os.open(f"/proc/{pid}/root", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    flags = {"ipc": _NEWIPC, "uts": _NEWUTS, "net": 0x40000000, "mnt": _NEWNS, "pid": _NEWPID}
    try:
        owner = os.fstat(fds["owner"]).st_ino
        if owner != own["user"]:   # unprivileged: bubblewrap's user namespace, ours to join (we made it)
            _setns(fds["owner"], _NEWUSER, "setns(user, owner)")
        for name in names:
            if os.fstat(fds[name]).st_ino != own[name]:
                _setns(fds[name], flags[name], f"setns({name})")
        if os.fstat(fds["user"]).st_ino not in (owner, own["user"]):
            _setns(fds["user"], _NEWUSER, "setns(user)")
        os.fchdir(root)
        os.chroot(".")
        os.chdir("/")
    finally:
        for fd in (*fds.values(), root):
            os.close(fd)
    return _pid_changed(own["pid"])


def _pid_changed(before: int) -> bool:
    """Whether this process's children will be born in another PID namespace than its own."""
    try:
        return os.stat("/proc/self/ns/pid_for_children").st_ino != before
    except OSError:
        return True


def _run_rank(rank: dict, env: dict, limits: dict, out: int, err: int) -> None:
    """In the rank (step 3). Never returns."""
    null = os.open("/dev/null", os.O_RDONLY)
    child.reset(stdio=(null, out, err), env=env, limits=limits, new_session=True)
    if rank.get("uid") is not None:   # unsandboxed, for a root grader: never as root (sandbox.runas)
        uid = int(rank["uid"])
        try:
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
        except OSError:
            os._exit(126)
        child.prctl(_PR_SET_NO_NEW_PRIVS, 1)
    child.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)   # the rank dies with whoever started it (after setuid, which clears it)
    child.prctl(_PR_SET_DUMPABLE, 1)   # as a fresh process: credential changes cleared it
    child.set_name(RANK_NAME.format(rank=rank["rank"]))
    sys.dont_write_bytecode = True
    import site   # the builtins a fresh python gets from site (the supervisor runs with -S): exit(), quit(), help()
    site.setquit()
    site.sethelper()
    site.setcopyright()
    tail = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p] + list(rank["sys_path"])
    child.run_main(["-m", rank["module"], *rank["args"]], tail)


class RankProcess:
    """One rank started by :func:`start`: the process whose exit status is the rank's (the entering
    child, or the rank itself without a sandbox) and the placeholder sandbox, if any; the part of
    :class:`subprocess.Popen` the supervisor uses."""

    def __init__(self, pid: int, placeholder=None):
        self.pid = pid
        self.placeholder = placeholder
        self.returncode = None

    def poll(self):
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                pid, status = self.pid, 0
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
                self._stop()
        return self.returncode

    def _stop(self):
        if self.placeholder is not None:
            stop_placeholder(self.placeholder)
        else:   # no PID namespace ends what the rank started: its tree is killed instead
            contain.kill_tree(self.pid, include_root=False)

    def kill(self):
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except OSError:
            pass
        if self.placeholder is None:
            contain.kill_tree(self.pid)
        self._stop()

    def wait(self, timeout=None):
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired("rank", timeout)
            time.sleep(0.01)
        return self.returncode


def _open_files(out_path: str, err_path: str) -> tuple[int, int]:
    return (os.open(out_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600),
            os.open(err_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600))


def start_plain(rank: dict, env: dict, limits: dict, out_path: str, err_path: str) -> RankProcess:
    """A rank without a sandbox: a fork of this process (a subreaper: what the rank starts stays in
    the job's tree), with the rank's environment, working folder (``rank["home"]``) and limits."""
    out, err = _open_files(out_path, err_path)
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:
        try:
            child.die_with(parent)
            os.chdir(rank["home"])
        except BaseException:  # noqa: BLE001
            os._exit(125)
        _run_rank(rank, env, limits, out, err)
    os.close(out)
    os.close(err)
    return RankProcess(pid)


def start(rank: dict, env: dict, limits: dict, out_path: str, err_path: str, cap: int) -> RankProcess:
    """Build the rank's sandbox around a placeholder, enter it, start the rank. Raises
    :class:`EnterError` (nothing of the rank ran) where this machine does not allow it. ``cap``: the
    kernel's highest capability (:func:`last_cap`, read before any sandbox was entered)."""
    placeholder, init, info = start_placeholder(rank["placeholder"], rank["bwrap"])
    try:
        fds = _open_target(init)
        for name in ("mnt", "pid", "ipc", "uts"):   # the pid was not reused: these are the sandbox bwrap built
            if f"{name}-namespace" in info and os.fstat(fds[name]).st_ino != int(info[f"{name}-namespace"]):
                raise EnterError(0, f"{name} namespace of pid {init} is not the sandbox's")
    except OSError as exc:
        stop_placeholder(placeholder)
        raise EnterError(exc.errno or 0, f"open the sandbox's namespaces: {exc}") from None
    out, err = _open_files(out_path, err_path)
    ctl_r, ctl_w = os.pipe()
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:   # the entering child
        try:
            os.close(ctl_r)
            os.setsid()   # the supervisor kills the rank with killpg(pid), as it killed bubblewrap
            _enter(fds, rank["home"], cap)
            child.die_with(parent)   # after the credential changes, which clear it
            rank_pid = os.fork()
            if rank_pid == 0:
                os.close(ctl_w)
                _run_rank(rank, env, limits, out, err)
            os.write(ctl_w, b"ok")
            os.close(ctl_w)
            os.close(out)
            os.close(err)
            forkserve.relay_exit(rank_pid)
        except BaseException as exc:  # noqa: BLE001 - told to the supervisor
            try:
                os.write(ctl_w, f"{type(exc).__name__}: {exc}"[:2000].encode(errors="replace"))
            finally:
                os._exit(125)
    os.close(ctl_w)
    os.close(out)
    os.close(err)
    for fd in fds.values():
        os.close(fd)
    answer = b""
    while True:
        chunk = os.read(ctl_r, 4096)
        if not chunk:
            break
        answer += chunk
    os.close(ctl_r)
    proc = RankProcess(pid, placeholder)
    if answer != b"ok":
        proc.kill()
        proc.wait()
        raise EnterError(0, answer.decode(errors="replace") or "the entering child ended")
    return proc
