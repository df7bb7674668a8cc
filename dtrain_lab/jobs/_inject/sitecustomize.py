"""Loaded by every Python process that dtrain_lab.launch starts (its folder is put first on
PYTHONPATH). Stdlib only, and it does three small things inside a rank of a launched job, so that the
launcher can diagnose programs that never import dtrain_lab:

1. record the rank's PID (``started.<rank>.<attempt>``), so the launcher knows whom to ask for a stack;
2. ``faulthandler.register(SIGUSR1, all_threads=True)`` into ``stack.<rank>.<attempt>.<pid>``: on
   a hang the launcher sends SIGUSR1 and reads where every thread of every rank is waiting, even
   when the rank is blocked inside a C++ collective;
3. mark the rank ``ready`` when ``init_process_group`` returns: the launcher's time limit counts
   from there, so a slow ``import torch`` or rendezvous is never mistaken for a hang.

Then it chains to any other ``sitecustomize`` that this one shadows.
"""
import os
import sys


def setup_rank():
    """Do 1-3 of the module docstring in this process if it is a rank of a launch (once per rank and
    attempt). Runs at interpreter start; a worker that torchrun forks from its agent (which started
    as no rank) calls it again (dtrain_lab.jobs._forked_rank)."""
    job_dir = os.environ.get("DTRAIN_JOB_DIR")
    rank = os.environ.get("RANK")
    if not job_dir or rank is None or not os.path.isdir(job_dir):
        return  # the torchrun agent itself, or a process outside a launch
    import faulthandler
    import signal

    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    pid = os.getpid()
    try:  # first process of this rank wins: DataLoader workers and other children inherit RANK
        fd = os.open(os.path.join(job_dir, "started.%s.%s" % (rank, attempt)),
                     os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return
    os.write(fd, str(pid).encode())
    os.close(fd)
    stack_file = open(os.path.join(job_dir, "stack.%s.%s.%d" % (rank, attempt, pid)), "w")
    faulthandler.register(signal.SIGUSR1, file=stack_file, all_threads=True, chain=False)
    sys._dtrain_stack_file = stack_file  # keep the file object alive for the process's lifetime
    ready_path = os.path.join(job_dir, "ready.%s.%s" % (rank, attempt))

    def mark_ready():
        if not os.path.exists(ready_path):
            with open(ready_path, "w") as f:
                f.write(str(pid))

    target = "torch.distributed.distributed_c10d"

    def wrap(module):
        original = module.init_process_group

        def init_process_group(*args, **kwargs):
            result = original(*args, **kwargs)
            mark_ready()
            return result

        init_process_group.__wrapped__ = original
        init_process_group.__doc__ = original.__doc__
        module.init_process_group = init_process_group
        return original, init_process_group

    c10d = sys.modules.get(target)
    if c10d is not None:
        # a worker forked from torchrun's agent (dtrain_lab.jobs._forked_rank): torch.distributed is
        # already imported, and re-exports init_process_group under its own name too
        original, wrapped = wrap(c10d)
        package = sys.modules.get("torch.distributed")
        if package is not None and getattr(package, "init_process_group", None) is original:
            package.init_process_group = wrapped
    else:
        import importlib.abc
        import importlib.machinery

        class _ReadyHook(importlib.abc.MetaPathFinder):
            """Wrap init_process_group once torch.distributed defines it (before torch.distributed
            re-exports it), to write the ready marker when it returns."""

            def find_spec(self, name, path, target_=None):
                if name != target:
                    return None
                sys.meta_path.remove(self)
                spec = importlib.machinery.PathFinder.find_spec(name, path)
                if spec is None or spec.loader is None:
                    return spec
                exec_module = spec.loader.exec_module

                def exec_and_wrap(module):
                    exec_module(module)
                    wrap(module)

                spec.loader.exec_module = exec_and_wrap
                return spec

        sys.meta_path.insert(0, _ReadyHook())

    previous_hook = sys.excepthook
    error_path = os.path.join(job_dir, "error.%s.%s.json" % (rank, attempt))

    def record_exception(exc_type, exc, tb):
        """Record which exception ended this rank, and when, for the launcher's 'first failure'."""
        try:
            import json
            import time
            import traceback

            if not os.path.exists(error_path):
                text = "".join(traceback.format_exception(exc_type, exc, tb))
                with open(error_path + ".tmp", "w") as f:
                    json.dump({"type": exc_type.__name__, "message": str(exc)[:2000],
                               "time": time.time(), "traceback": text[-8000:]}, f)
                os.replace(error_path + ".tmp", error_path)
        except Exception:
            pass
        previous_hook(exc_type, exc, tb)

    sys.excepthook = record_exception

    import atexit

    def mark_exit():
        """This rank ended by itself (dtrain_lab.jobs.runtime writes the same mark before its os._exit)."""
        try:
            with open(os.path.join(job_dir, "exit.%s.%s" % (rank, attempt)), "w") as f:
                f.write("")
        except Exception:
            pass

    atexit.register(mark_exit)


def _chain():
    here = os.path.dirname(os.path.abspath(__file__))
    import importlib.machinery
    import importlib.util

    paths = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", paths)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


try:
    setup_rank()
except Exception as exc:  # never break the learner's program because of a diagnosis aid
    sys.stderr.write("dtrain_lab: stack dumps disabled (%s)\n" % exc)
try:
    _chain()
except Exception:
    pass
