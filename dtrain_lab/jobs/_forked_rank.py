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

What makes the child look like a fresh interpreter is :mod:`dtrain_lab.sandbox.child`, the one
helper every fork runner of the course uses (it imports only the standard library, and
``import dtrain_lab`` itself imports nothing, so programs that do not use dtrain_lab run unchanged).
"""

import os
import signal
import sys

from dtrain_lab.sandbox import child

# what torchrun (and the launcher's Ctrl-C) send to stop a worker: passed on to the rank
_FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR2)


def _run_rank(argv: list, parent: int) -> None:
    """The rank: in the worker's child. Never returns."""
    child.die_with(parent)
    # A fresh Python has only stdin/stdout/stderr (here already the rank's log files). Everything else
    # the fork copied belongs to torchrun: its store's sockets, and the pipe whose closing tells the
    # agent that this worker ended. A daemon started by the program would hold that pipe open, and
    # torchrun would wait for the worker for ever.
    child.reset()
    site = sys.modules.get("sitecustomize")
    if hasattr(site, "setup_rank"):
        site.setup_rank()
    child.run_main(argv)


def main() -> None:
    """The worker: start the rank, pass signals on, end as the rank ended (returning means exit 0)."""
    argv = sys.argv[1:]
    parent = os.getpid()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    pid = os.fork()
    if pid == 0:
        _run_rank(argv, parent)
    child.pass_signals(pid, _FORWARDED)
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)  # stack requests go to the rank itself
    status = os.waitpid(pid, 0)[1]
    # The rank is gone (and its pid free for reuse): a signal is for this worker again. After a
    # successful return torchrun's wrapper keeps the worker alive until every rank has finished, and
    # when another rank fails it stops that waiting worker with SIGTERM; forwarded to nobody, it would
    # be ignored, and torchrun would wait its 30 s grace period before SIGKILL and only then report
    # the failure (a launch with a shorter limit reported the job as hung).
    for sig in _FORWARDED:
        signal.signal(sig, signal.SIG_DFL)
    if os.waitstatus_to_exitcode(status) != 0:   # (returning is how a function entrypoint succeeds)
        child.end_like(status)


if __name__ == "__main__":
    main()
