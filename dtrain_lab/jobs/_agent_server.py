"""Forks torchrun agents from one Python that has imported torch already.

``python -m torch.distributed.run`` spends most of its CPU on ``import torch`` (about 1.4 s on this
course's 2-core machine), and a rank that builds its first ``torch.optim`` optimizer imports
``torch._dynamo`` (about 1.3 s more). :mod:`dtrain_lab.jobs.agents` starts this program
(``python -m dtrain_lab.jobs._agent_server``) once per launching process (a notebook kernel, a test
worker) and asks it for every launch that can use it. It imports both once. For each launch it forks
a child that is the launch's init (:func:`dtrain_lab.sandbox.contain.init`: every process of the
job stays in its tree, and it kills what is left when torchrun ends), and that child forks torchrun's
agent, which runs ``torch.distributed.run`` exactly as ``python -m torch.distributed.run ARGS`` would
(:mod:`dtrain_lab.sandbox.child`), with the launch's environment, working folder and output file.
torchrun then forks the ranks from that agent (``--start-method fork``), so they have torch and
``torch._dynamo`` imported too.

The loop and its protocol are :mod:`dtrain_lab.sandbox.forkserve`'s; a request is ``{"argv", "env",
"cwd", "log", "report"}``. On its client's end (its stdin closes) every process of every launch still
running is killed (a fresh launch's init gets SIGTERM from the kernel then, and does the same); it
also ends after ``IDLE_S`` idle seconds.
"""
import os
import signal
import sys

from dtrain_lab.sandbox import child, contain, forkserve

IDLE_S = 600.0
_BASE_PATH = sys.path[1:]   # sys.path[0] is the server's working folder; an agent gets its own there


def _torchrun(request: dict) -> int:
    pid = os.fork()
    if pid == 0:
        child.reset(env=request["env"], cwd=request["cwd"])
        sys.modules.pop("torch.distributed.run", None)   # runpy runs it afresh as __main__ (its imports stay)
        child.run_main(["-m", "torch.distributed.run", *request["argv"]], _BASE_PATH)
    return pid


def _launch(request: dict, server: int) -> None:
    """In the forked child: the launch's init, around torchrun's agent. Never returns."""
    try:
        forkserve.detach(server, signal.SIGTERM, request["log"])   # torchrun stops its workers on SIGTERM
        contain.init(lambda: _torchrun(request), report=request.get("report"))
    finally:
        os._exit(125)


def main() -> None:
    import torch  # noqa: F401
    import torch._dynamo  # noqa: F401 - what a rank's first optimizer would import
    import torch.distributed.run  # noqa: F401

    forkserve.serve(_launch, IDLE_S)


if __name__ == "__main__":
    main()
