"""Become ``python -m MODULE ARGS`` (or ``python SCRIPT ARGS``) inside a process forked from a Python
that has imported torch already; standard library only.

A fresh interpreter spends most of a small job's CPU on ``import torch``. Four places therefore run a
program in a fork instead of a new interpreter, and all four use this module, so that the program
sees what a fresh ``python`` would have shown it:

* a torchrun worker forked from its agent (:mod:`dtrain_lab.jobs._forked_rank`);
* a torchrun agent forked from the launcher's agent server (:mod:`dtrain_lab.jobs._agent_server`);
* a graded rank forked from its supervisor (:mod:`dtrain_lab.sandbox.enter`);
* a rank of the tests' forked jobs (``tests/forkjob.py``).

:func:`reset` makes the process look fresh (standard streams, no inherited descriptor, default signal
handlers, no exit handlers, environment, working folder, resource limits, its own session);
:func:`run_main` runs the program as ``__main__`` exactly as the interpreter's command line would
(``runpy._run_module_as_main`` is what ``python -m`` itself calls) and ends the process as the
interpreter ends: non-daemon threads joined, exit handlers run, streams flushed, the exit status of
``sys.exit`` or of an uncaught exception. It never returns.
"""
from __future__ import annotations

import atexit
import builtins
import ctypes
import importlib.machinery
import io
import os
import resource
import runpy
import signal
import sys
import types

# the signals whose handlers a fork copies from its parent and a fresh Python has at their default;
# and those a fresh Python ignores (a write past RLIMIT_FSIZE or into a closed pipe is an OSError)
DEFAULT_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2, signal.SIGCHLD)
IGNORED_SIGNALS = (signal.SIGPIPE, signal.SIGXFSZ)
_PR_SET_PDEATHSIG, _PR_SET_NAME = 1, 15


def prctl(option: int, arg: int) -> int:
    """Linux ``prctl(option, arg)``; -1 where it failed (or elsewhere than Linux)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return -1
    return libc.prctl(ctypes.c_int(option), ctypes.c_ulong(arg), ctypes.c_ulong(0), ctypes.c_ulong(0),
                      ctypes.c_ulong(0))


def die_with(parent: int, sig: int = signal.SIGKILL) -> None:
    """Have the kernel send ``sig`` to this process when its parent ends; end now if it already has."""
    prctl(_PR_SET_PDEATHSIG, sig)
    if os.getppid() != parent:
        os._exit(1)


def set_name(name: str) -> None:
    """This process's name (``comm``, 15 bytes), as ``ps`` and ``/proc/PID/comm`` show it."""
    buf = ctypes.create_string_buffer(name.encode()[:15])
    prctl(_PR_SET_NAME, ctypes.cast(buf, ctypes.c_void_p).value or 0)


def _unbuffered(fd: int, errors: str):
    return io.TextIOWrapper(io.FileIO(fd, "w", closefd=False), encoding="utf-8", errors=errors,
                            line_buffering=True, write_through=True)


def reset(*, stdio: tuple[int, int, int] | None = None, env: dict | None = None, cwd: str | None = None,
          limits: dict | None = None, new_session: bool = False, keep_fds: tuple = ()) -> None:
    """Make this forked process look like a fresh interpreter's.

    ``stdio``: descriptors to put on 0, 1 and 2 (then unbuffered text streams over them, as
    ``PYTHONUNBUFFERED`` gives); every other descriptor the fork copied is closed, except
    ``keep_fds``. ``env`` replaces the environment (``os.environ``; what the kernel shows as
    ``/proc/PID/environ`` stays the parent's). ``limits``: ``{"AS": bytes, ...}`` resource limits.
    ``new_session``: a session and process group of its own."""
    if stdio is not None:
        for target, fd in enumerate(stdio):
            if fd != target:
                os.dup2(fd, target)
        sys.stdout, sys.stderr = _unbuffered(1, "strict"), _unbuffered(2, "backslashreplace")
        sys.stdin = open(0, closefd=False)
    keep = sorted(set(keep_fds))
    low = 3
    for fd in keep + [1 << 16]:
        if fd >= low:
            os.closerange(low, fd)
            low = fd + 1
    if new_session:
        try:
            os.setsid()
        except OSError:   # already a session leader
            pass
    for sig in DEFAULT_SIGNALS:
        signal.signal(sig, signal.SIG_DFL)
    for sig in IGNORED_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.set_wakeup_fd(-1)
    atexit._clear()   # the parent's exit handlers are not this program's
    for key, value in (limits or {}).items():
        resource.setrlimit(getattr(resource, "RLIMIT_" + key), (value, value))
    if cwd is not None:
        os.chdir(cwd)
    if env is not None:
        os.environ.clear()
        os.environ.update(env)
        if not any(env.get(k) for k in ("LC_ALL", "LC_CTYPE", "LANG")):
            os.environ["LC_CTYPE"] = "C.UTF-8"   # what a fresh Python adds when it coerces the C locale (PEP 538)
    threads = os.environ.get("OMP_NUM_THREADS", "")
    if threads.isdigit() and int(threads) > 0 and "torch" in sys.modules:
        # the variable may have been set after the parent imported torch: apply it to this process
        sys.modules["torch"].set_num_threads(int(threads))


def _fresh_main() -> types.ModuleType:
    main = types.ModuleType("__main__")
    main.__builtins__ = builtins  # type: ignore[attr-defined]
    sys.modules["__main__"] = main
    return main


def _run(argv: list, path_tail: list) -> None:
    if argv[:1] == ["-m"]:
        sys.path[:] = [os.getcwd(), *path_tail]
        sys.argv = list(argv[1:])   # argv[0] becomes the module's file, as with python -m
        _fresh_main()
        runpy._run_module_as_main(argv[1], alter_argv=True)  # type: ignore[attr-defined]
        return
    path = argv[0]
    sys.path[:] = [os.path.dirname(os.path.abspath(path)), *path_tail]
    sys.argv = list(argv)
    main = _fresh_main()
    main.__file__ = path
    main.__cached__ = None  # type: ignore[attr-defined]
    main.__loader__ = importlib.machinery.SourceFileLoader("__main__", path)
    with open(path, "rb") as f:
        code = compile(f.read(), path, "exec", dont_inherit=True)
    exec(code, main.__dict__)


def exit_code(exc: SystemExit) -> int:
    """The status a Python ends with for ``sys.exit(exc.code)``."""
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    print(exc.code, file=sys.stderr)
    return 1


def flush_exit(code: int) -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001
            pass
    os._exit(code & 0xFF)


def pass_signals(pid: int, signals) -> None:
    """Handle ``signals`` here by sending each on to process ``pid`` (a parent that waits for it)."""
    def forward(sig, _frame):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass

    for sig in signals:
        signal.signal(sig, forward)


def end_like(status: int) -> None:
    """End this process as a child with wait status ``status`` ended: the same exit code, or killed
    by the same signal. Never returns."""
    code = os.waitstatus_to_exitcode(status)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001
            pass
    if code < 0:
        if -code not in (signal.SIGKILL, signal.SIGSTOP):   # these two cannot be handled anyway
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        os._exit(128 - code)
    os._exit(code & 0xFF)


def run_main(argv: list, path_tail: list | None = None) -> None:
    """Run ``["-m", module, *args]`` or ``[script, *args]`` as ``__main__``, then end this process as
    the interpreter would. ``path_tail``: ``sys.path`` after its first entry (which is the working
    folder for a module, the script's folder for a script); default: this process's. Never returns."""
    tail = list(sys.path[1:] if path_tail is None else path_tail)
    code, interrupted = 0, False
    try:
        _run(list(argv), tail)
    except SystemExit as exc:
        code = exit_code(exc)
    except KeyboardInterrupt:
        sys.excepthook(*sys.exc_info())
        code, interrupted = 128 + signal.SIGINT, True
    except BaseException:  # noqa: BLE001 - printed (and recorded) by sys.excepthook, as at top level
        try:
            sys.excepthook(*sys.exc_info())
        except BaseException:  # noqa: BLE001
            pass
        code = 1
    try:   # the interpreter's own exit, in its order: wait for non-daemon threads, then atexit
        threading = sys.modules.get("threading")
        if threading is not None and hasattr(threading, "_shutdown"):
            threading._shutdown()
        atexit._run_exitfuncs()
    except BaseException:  # noqa: BLE001
        pass
    if interrupted:   # a fresh Python ends by SIGINT on an uncaught KeyboardInterrupt
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001
                pass
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    flush_exit(code)
