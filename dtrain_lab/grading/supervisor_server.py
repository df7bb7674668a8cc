"""Forks the supervisors of graded jobs from one Python that has imported torch; stdlib and torch only.

Run by the grader (:mod:`dtrain_lab.grading.supervisors`) as ``python -I -S supervisor_server.py
SYS_PATH_JSON``, with one environment variable (:func:`_forkserve.slot_env`). It imports torch once, and then
for every job the grader starts (the job's outer sandbox built by bubblewrap around a placeholder)
it forks a child that enters that sandbox (:func:`zygote.enter_outer`) and runs
:func:`supervisor.main` on the job's plan there: the supervisor a fresh ``python supervisor.py PLAN``
would have been, with torch imported for its ranks (:mod:`dtrain_lab.grading.zygote`). It reads no
plan itself: its memory holds torch and nothing of any job.

The loop and its protocol are :mod:`dtrain_lab.jobs._forkserve`'s; a request is ``{"plan", "outer",
"log"}``. When its stdin closes (the grader ended) every supervisor still running is killed, and its
ranks with it; it also ends after ``IDLE_S`` idle seconds.
"""
import importlib.util
import json
import os
import signal
import sys

IDLE_S = 600.0
HERE = os.path.dirname(os.path.abspath(__file__))


def _child(request: dict, server: int, zygote, supervisor) -> None:
    """The forked child: enter the outer sandbox, become the supervisor. Never returns."""
    code = 125
    forkserve = zygote._forkserve
    try:
        forkserve.detach(server, signal.SIGKILL, request["log"])
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        if zygote.enter_outer(int(request["outer"])):   # a PID namespace of its own: the supervisor is a fork
            pid = os.fork()
            if pid:
                forkserve.relay_exit(pid)
        supervisor._zygote = zygote
        supervisor.main(request["plan"])
        code = 0
    except SystemExit as exc:
        code = forkserve.exit_code(exc)
    except BaseException as exc:  # noqa: BLE001 - in the job's supervisor.log
        try:
            os.write(2, f"supervisor server: {type(exc).__name__}: {exc}\n".encode(errors="replace"))
        except OSError:
            pass
    os._exit(code & 0xFF)


def main() -> None:
    where = importlib.util.spec_from_file_location("supervisor", os.path.join(HERE, "supervisor.py"))
    supervisor = importlib.util.module_from_spec(where)
    where.loader.exec_module(supervisor)
    zygote = supervisor.zygote_module()
    zygote.prepare()
    sys.path[:] = json.loads(sys.argv[1])
    import torch  # noqa: F401
    import torch.distributed  # noqa: F401

    zygote._forkserve.serve(lambda request, server: _child(request, server, zygote, supervisor), signal.SIGKILL,
                            IDLE_S, ready={"usable": zygote.usable()})


if __name__ == "__main__":
    main()
