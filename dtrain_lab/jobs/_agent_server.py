"""Forks torchrun agents from one Python that has imported torch already; stdlib and torch only.

``python -m torch.distributed.run`` spends most of its CPU on ``import torch`` (about 1.4 s on this
course's 2-core machine), and a rank that builds its first ``torch.optim`` optimizer imports
``torch._dynamo`` (about 1.3 s more). :mod:`dtrain_lab.jobs.agents` starts this program once per
launching process (a notebook kernel, a test worker) and asks it for every launch that can use it.
It imports both once; each launch's agent is a fork of it that runs ``torch.distributed.run`` exactly
as ``python -m torch.distributed.run ARGS`` would (``runpy._run_module_as_main``: the same
``__main__``, ``sys.argv`` and ``sys.path[0]``), in its own session, with the launch's environment,
working folder and output file, and default signal handlers. torchrun then forks the ranks from that
agent (``--start-method fork``), so they have torch and ``torch._dynamo`` imported too.

The loop and its protocol are :mod:`dtrain_lab.jobs._forkserve`'s; a request is ``{"argv", "env",
"cwd", "log"}``. On its client's end (its stdin closes) every agent still running gets SIGTERM, what
the kernel sent a fresh agent when a launcher died (``_procs.set_parent_death_signal``); it also ends
after ``IDLE_S`` idle seconds. Every agent gets ``SIGTERM`` if this process dies.
"""
import os
import runpy
import signal
import sys
import traceback

import _forkserve   # this file's folder is sys.path[0]

IDLE_S = 600.0
_BASE_PATH = sys.path[1:]   # sys.path[0] is this file's folder; an agent gets its own working folder there
_block = None               # this process's environment block (_forkserve.environ_block)


def _agent(request: dict, server: int) -> None:
    """In the forked child: become ``python -m torch.distributed.run ARGV``. Never returns."""
    code = 1
    try:
        _forkserve.detach(server, signal.SIGTERM, request["log"])   # torchrun stops its workers on SIGTERM
        for sig in (signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        _forkserve.show_environment(_block, request["env"])   # the job sweep finds it by DTRAIN_JOB_ID
        sys.path[:] = [os.getcwd()] + _BASE_PATH
        sys.modules.pop("torch.distributed.run", None)   # runpy runs it afresh as __main__ (its imports stay)
        sys.argv = ["torchrun", *request["argv"]]   # argv[0] becomes run.py's path, as with python -m
        runpy._run_module_as_main("torch.distributed.run", alter_argv=True)  # type: ignore[attr-defined]
        code = 0
    except SystemExit as exc:
        code = _forkserve.exit_code(exc)
    except BaseException:  # noqa: BLE001 - printed as at top level, like torchrun's own traceback
        try:
            sys.excepthook(*sys.exc_info())
        except BaseException:  # noqa: BLE001
            traceback.print_exc()
        code = 1
    finally:
        _forkserve.flush_exit(code)


def main() -> None:
    import torch  # noqa: F401
    import torch._dynamo  # noqa: F401 - what a rank's first optimizer would import
    import torch.distributed.run  # noqa: F401

    global _block
    _block = _forkserve.environ_block()
    # on its client's end every agent gets SIGTERM: torchrun stops its workers on it
    _forkserve.serve(_agent, signal.SIGTERM, IDLE_S)


if __name__ == "__main__":
    main()
