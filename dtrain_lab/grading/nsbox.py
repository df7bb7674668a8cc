"""The sandbox without bubblewrap: util-linux ``unshare`` for the job, and this program for each rank.

Standard library only (it runs as ``python -I -S nsbox.py``, before anything of the course is
importable). Two roles, the same as bubblewrap's two levels in :mod:`dtrain_lab.grading.sandbox`:

``outer PLAN``  inside ``unshare --net --ipc --uts --mount [--user --map-root-user --pid]``: brings
                loopback up, mounts the job's size-limited ``/shared`` tmpfs, then becomes the
                supervisor.
``inner SPEC``  one rank: a mount, PID, IPC and UTS namespace of its own; a new root on a tmpfs with
                the system, Python and the package bound read-only, the checks folder hidden, small
                tmpfs ``/tmp``, ``HOME`` and ``/dev/shm``, a few device nodes, a fresh ``/proc``, the
                rank's ``/grade`` files and ``/shared``; then ``chroot`` into it, drop to uid 65534
                (a nested user namespace when the grader is not root, the host uid 65534 when it
                is), no capabilities, ``no_new_privs``, and ``exec`` the rank's command.

What bubblewrap adds over this: it also forbids user namespaces inside the rank (here a rank could
create one, in which it would be root over nothing of the host).
"""
import ctypes
import json
import os
import signal
import socket
import struct
import sys

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID = 0x10000000, 0x20000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS, PR_CAPBSET_DROP = 1, 38, 24
SANDBOX_UID = 65534
DEVICES = ("null", "zero", "full", "random", "urandom")

_libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _b(text):
    return None if text is None else str(text).encode()


def mount(source, target, fstype, flags, data=None) -> None:
    _check(_libc.mount(_b(source), _b(target), _b(fstype), ctypes.c_ulong(flags), _b(data)), f"mount {target}")


def unshare(flags: int) -> None:
    _check(_libc.unshare(flags), "unshare")


def prctl(option: int, arg: int) -> None:
    _check(_libc.prctl(option, ctypes.c_ulong(arg), 0, 0, 0), "prctl")


def _locked_flags(path: str) -> int:
    """The flags a read-only remount must keep (a user namespace may not clear nosuid/nodev/noexec)."""
    f = os.statvfs(path).f_flag
    return (MS_NOSUID if f & os.ST_NOSUID else 0) | (MS_NODEV if f & os.ST_NODEV else 0) | \
        (MS_NOEXEC if f & os.ST_NOEXEC else 0)


def _target(root: str, dest: str, like: str) -> str:
    path = root + dest
    if os.path.isdir(like):
        os.makedirs(path, mode=0o755, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
        if not os.path.exists(path):
            open(path, "w").close()
    return path


def bind(root: str, source: str, dest: str, readonly: bool) -> None:
    path = _target(root, dest, source)
    mount(source, path, None, MS_BIND | MS_REC)
    if readonly:
        mount(None, path, None, MS_REMOUNT | MS_BIND | MS_RDONLY | _locked_flags(path))


def _lo_up() -> None:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        import fcntl

        flags = struct.unpack("16sH", fcntl.ioctl(s, 0x8913, struct.pack("16sH", b"lo", 0))[:18])[1]   # SIOCGIFFLAGS
        fcntl.ioctl(s, 0x8914, struct.pack("16sH", b"lo", flags | 1))                                    # SIOCSIFFLAGS, IFF_UP
    finally:
        s.close()


def outer(plan_path: str) -> None:
    with open(plan_path) as f:
        plan = json.load(f)
    _lo_up()
    shared = plan["shared"]
    os.makedirs(shared, exist_ok=True)
    mount("tmpfs", shared, "tmpfs", MS_NOSUID | MS_NODEV, f"size={plan['shared_bytes']},mode=1777")
    os.execv(sys.executable, [sys.executable, "-I", "-S", plan["supervisor"], plan_path])


def _build_root(spec: dict) -> str:
    root = spec["root"]
    mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "size=16m,mode=0755")
    owner = f",uid={SANDBOX_UID},gid={SANDBOX_UID}" if spec["host_uid"] else ""
    # the private tmpfs mounts first: a course installed under /tmp (a fresh clone, CI) is bound
    # on top of the rank's /tmp, not hidden by it
    for dest, size, mode in spec["tmpfs"]:
        os.makedirs(root + dest, mode=0o755, exist_ok=True)
        mount("tmpfs", root + dest, "tmpfs", MS_NOSUID | MS_NODEV, f"size={size},mode={mode}{owner}")
    for source in spec["ro"]:
        bind(root, source, source, True)
    for link, target in spec["symlinks"]:
        os.symlink(target, root + link)
    for dest, source in spec["ro_files"]:
        bind(root, source, dest, True)
    for dest, source in spec["rw_files"]:
        bind(root, source, dest, False)
    for dest in spec["hidden"]:
        mount("tmpfs", root + dest, "tmpfs", MS_NOSUID | MS_NODEV, "size=4k,mode=0755")
    os.makedirs(root + "/dev", mode=0o755, exist_ok=True)
    for name in DEVICES:
        bind(root, f"/dev/{name}", f"/dev/{name}", False)
    os.makedirs(root + "/proc", mode=0o555, exist_ok=True)
    mount("proc", root + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    mount(None, root, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
    return root


def _nested_user() -> None:
    """Root of the job's user namespace only: a nested one, where this process is uid 65534 (mapped to
    the job's root, the grader's own uid outside). Done before chroot: the kernel refuses a new user
    namespace to a chrooted process."""
    unshare(CLONE_NEWUSER)
    with open("/proc/self/uid_map", "w") as f:
        f.write(f"{SANDBOX_UID} 0 1\n")
    with open("/proc/self/setgroups", "w") as f:
        f.write("deny")
    with open("/proc/self/gid_map", "w") as f:
        f.write(f"{SANDBOX_UID} 0 1\n")


def _drop(spec: dict) -> None:
    if spec["host_uid"]:            # the grader is root: become uid 65534 on the host
        os.setgroups([])
        os.setresgid(SANDBOX_UID, SANDBOX_UID, SANDBOX_UID)
        os.setresuid(SANDBOX_UID, SANDBOX_UID, SANDBOX_UID)
    for cap in range(64):
        if _libc.prctl(PR_CAPBSET_DROP, ctypes.c_ulong(cap), 0, 0, 0) != 0:
            break
    prctl(PR_SET_NO_NEW_PRIVS, 1)


def inner(spec_text: str) -> None:
    spec = json.loads(spec_text)
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    unshare(CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS)
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    pid = os.fork()
    if pid:                         # outside the new PID namespace: wait for it, end the same way
        signal.signal(signal.SIGTERM, lambda *a: os.kill(pid, signal.SIGKILL))
        _, status = os.waitpid(pid, 0)
        os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status))
    try:
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        root = _build_root(spec)
        socket.sethostname("sandbox")
        if not spec["host_uid"]:
            _nested_user()
        os.chroot(root)
        os.chdir(spec["cwd"])
        _drop(spec)
        os.execve(spec["command"][0], spec["command"], spec["env"])
    except BaseException as exc:    # noqa: BLE001 - the grader reads this line from the rank's stderr
        sys.stderr.write(f"nsbox: {type(exc).__name__}: {exc}\n")
        sys.stderr.flush()
        os._exit(127)


if __name__ == "__main__":
    role = sys.argv[1]
    if role == "outer":
        outer(sys.argv[2])
    elif role == "inner":
        inner(sys.argv[2])
    else:
        raise SystemExit(f"nsbox: unknown role {role!r}")
