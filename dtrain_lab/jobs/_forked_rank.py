"""One rank of a launch whose workers torchrun forks: ``torchrun --run-path --start-method fork``.

Plain ``torchrun prog.py`` starts every worker as a fresh Python, which imports torch again: about
1.2 s of CPU per rank, and about 1 s more once the first ``torch.optim`` optimizer imports
``torch._dynamo`` (measured on this course's 2-core CI machine). With ``--run-path`` torchrun calls a
function in each worker instead (here: this file, through ``runpy.run_path``), and with
``--start-method fork`` it forks those workers from its agent process, which has imported torch
already. :func:`dtrain_lab.launch` does that on machines without a CUDA GPU
(:meth:`~dtrain_lab.jobs.options.LaunchOptions.command`).

Every worker forks once more, and the rank's program runs in that child, exactly as
``python -m target args`` (or ``python prog.py args``) would run it: as ``__main__``, with its own
``sys.argv`` and default signal handlers, started, stack-dumped and marked ready by
``_inject/sitecustomize.py`` like any rank. The worker waits for it and ends as it ended: the same
exit code, or the same signal. Why the second process: torchrun counts a function entrypoint as
finished only when the function *returns*. A program that leaves with ``os._exit(0)`` (what this
course recommends after ``destroy_process_group()`` with gloo) never returns, so its worker would look
alive to torchrun for ever. Forking costs milliseconds; the import it saves costs seconds.

Stdlib only (and torch, already imported by the agent); it never imports dtrain_lab, so programs
that do not use dtrain_lab run unchanged.
"""
import atexit
import builtins
import ctypes
import importlib.machinery
import os
import runpy
import signal
import sys
import traceback
import types

# what torchrun (and the launcher's Ctrl-C) send to stop a worker: passed on to the rank
_FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR2)


def _die_with_parent(parent: int) -> None:
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass
    if os.getppid() != parent:  # the worker was already gone
        os._exit(1)


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001
            pass


def _fresh_main() -> types.ModuleType:
    """A new ``__main__`` module, as the interpreter makes one: the program must not see our globals."""
    main = types.ModuleType("__main__")
    main.__builtins__ = builtins  # type: ignore[attr-defined]
    sys.modules["__main__"] = main
    return main


def _run_program(argv: list) -> None:
    """Run ``-m module args`` or ``script.py args`` as the interpreter's command line would: the same
    ``__main__``, ``sys.argv`` and ``sys.path[0]``, and the same frames below the program in a stack
    (``runpy._run_module_as_main`` is what ``python -m`` itself calls; a script runs directly)."""
    if argv[:1] == ["-m"]:
        sys.argv = argv[1:]  # argv[0] becomes the module's file, as with python -m
        _fresh_main()
        runpy._run_module_as_main(argv[1], alter_argv=True)  # type: ignore[attr-defined]
        return
    path = argv[0]
    sys.argv = list(argv)
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    main = _fresh_main()
    main.__file__ = path
    main.__cached__ = None  # type: ignore[attr-defined]
    main.__loader__ = importlib.machinery.SourceFileLoader("__main__", path)
    with open(path, "rb") as f:
        code = compile(f.read(), path, "exec", dont_inherit=True)
    exec(code, main.__dict__)


def _run_rank(argv: list, parent: int) -> None:
    """The rank: in the worker's child. Never returns."""
    _die_with_parent(parent)
    # A fresh Python has only stdin/stdout/stderr (here already the rank's log files). Everything else
    # the fork copied belongs to torchrun: its store's sockets, and the pipe whose closing tells the
    # agent that this worker ended. A daemon started by the program would hold that pipe open, and
    # torchrun would wait for the worker for ever.
    os.closerange(3, os.sysconf("SC_OPEN_MAX") if hasattr(os, "sysconf") else 65536)
    # a fresh Python's signal dispositions, not the agent's handlers that the fork copied
    for sig in _FORWARDED + (signal.SIGUSR1,):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    atexit._clear()  # the agent's exit handlers are not this program's
    threads = os.environ.get("OMP_NUM_THREADS", "")
    if threads.isdigit() and int(threads) > 0 and "torch" in sys.modules:
        # torchrun sets OMP_NUM_THREADS after the agent imported torch: apply it to this process
        sys.modules["torch"].set_num_threads(int(threads))
    site = sys.modules.get("sitecustomize")
    if hasattr(site, "setup_rank"):
        site.setup_rank()
    code = 0
    try:
        _run_program(argv)
    except SystemExit as exc:  # as the interpreter ends for sys.exit(x)
        if exc.code is None:
            code = 0
        elif isinstance(exc.code, int):
            code = exc.code
        else:
            print(exc.code, file=sys.stderr)
            code = 1
    except KeyboardInterrupt:
        traceback.print_exc()
        code = 128 + signal.SIGINT
    except BaseException:  # noqa: BLE001 - printed (and recorded) by sys.excepthook, as at top level
        sys.excepthook(*sys.exc_info())
        code = 1
    try:  # the interpreter's own exit, in its order: wait for non-daemon threads, then atexit
        threading = sys.modules.get("threading")
        if threading is not None and hasattr(threading, "_shutdown"):
            threading._shutdown()  # as multiprocessing's forked children do too
        atexit._run_exitfuncs()
    except BaseException:  # noqa: BLE001
        traceback.print_exc()
    finally:
        _flush()
        os._exit(code & 0xFF)


def main() -> None:
    """The worker: start the rank, pass signals on, end as the rank ended (returning means exit 0)."""
    argv = sys.argv[1:]
    parent = os.getpid()
    _flush()
    pid = os.fork()
    if pid == 0:
        _run_rank(argv, parent)

    def forward(sig, _frame):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass

    for sig in _FORWARDED:
        signal.signal(sig, forward)
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)  # stack requests go to the rank itself
    code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])  # -N: killed by signal N
    if code == 0:
        return
    _flush()
    if code < 0:
        sig = -code
        if sig not in (signal.SIGKILL, signal.SIGSTOP):  # these two cannot be handled anyway
            signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
        os._exit(128 + sig)
    os._exit(code)


if __name__ == "__main__":
    main()
