"""Forks the supervisors of graded jobs from one Python that has imported torch.

Run by the grader (:mod:`dtrain_lab.sandbox.supervisors`) as ``python -I -S … supervisor_server
SYS_PATH_JSON`` (:func:`dtrain_lab.sandbox.python_m`) with only ``PATH`` in its environment. It puts
``sys.path`` as a fresh ``python`` would have it, imports torch once, and then for every job forks a
child that becomes that job's supervisor (:func:`supervisor.main`): with bubblewrap, after entering
the job's outer sandbox, which bubblewrap built around a placeholder (:func:`enter.enter_outer`);
without a sandbox, directly. The supervisor's ranks are forks of it in turn
(:mod:`dtrain_lab.sandbox.enter`), so no process of a graded job imports torch again. The server
reads no plan itself: its memory holds torch and nothing of any job.

The loop and its protocol are :mod:`dtrain_lab.sandbox.forkserve`'s; a request is ``{"plan",
"outer", "log"}`` (``outer``: the pid of the outer sandbox's placeholder, or None). When its stdin
closes (the grader ended) every supervisor still running is killed, and its ranks with it; it also
ends after ``IDLE_S`` idle seconds.
"""
import json
import os
import signal
import sys

from dtrain_lab.sandbox import child, enter, forkserve, supervisor

IDLE_S = 600.0


def _supervise(request: dict, server: int) -> None:
    """The forked child: enter the outer sandbox (if any), become the supervisor. Never returns."""
    code = 125
    try:
        forkserve.detach(server, signal.SIGKILL, request["log"])
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        if request.get("outer") and enter.enter_outer(int(request["outer"])):
            pid = os.fork()   # a PID namespace of its own: the supervisor is this child's child
            if pid:
                forkserve.relay_exit(pid)
            child.prctl(1, signal.SIGKILL)   # PR_SET_PDEATHSIG: it dies with the entering child
        supervisor.main(request["plan"])
        code = 0
    except SystemExit as exc:
        code = child.exit_code(exc)
    except BaseException as exc:  # noqa: BLE001 - in the job's supervisor.log
        try:
            os.write(2, f"supervisor server: {type(exc).__name__}: {exc}\n".encode(errors="replace"))
        except OSError:
            pass
    os._exit(code & 0xFF)


def main() -> None:
    sys.path[1:] = json.loads(sys.argv[1])   # sys.path[0]: this package's parent (python_m)
    import torch  # noqa: F401
    import torch.distributed  # noqa: F401

    forkserve.serve(_supervise, IDLE_S)


if __name__ == "__main__":
    main()
