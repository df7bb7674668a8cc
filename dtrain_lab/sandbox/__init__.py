"""How the course starts, contains and isolates processes: the security-relevant code, in one place.

Read ``README.md`` beside this file first (the threat model). The modules:

=================== ==========================================================================
``child``           become ``python -m MODULE`` (or ``python script.py``) inside a forked process:
                    the one helper every fork runner uses (torchrun's forked ranks, the agent
                    server's torchrun agents, a graded rank, the tests' forked ranks)
``contain``         keep every process of a job findable and killable: a child subreaper that
                    holds the job's whole process tree, and the kill of that tree
``forkserve``       the loop and client of a fork server (a Python that imported torch once)
``bwrap``           the sandbox builder: bubblewrap's command lines for a graded job, the probe
``enter``           start a rank inside a sandbox bubblewrap built, from a fork of the supervisor
``supervisor``      runs one graded job's ranks (restarts, exit codes, limits) inside the sandbox
``supervisor_server`` / ``supervisors``  the fork server of supervisors, and its client
=================== ==========================================================================

Everything here imports the standard library only (``supervisor_server`` imports torch, after it has
set up), so that it can run as ``python -I -S`` (:func:`python_m`) before anything of a learner's
environment or the rest of the course is importable. ``tests/test_architecture.py`` checks that.
"""
from __future__ import annotations

import os
import sys

PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# python -I -S -c BOOT MODULE ARGS...: isolated (no PYTHON* variables, no user site, no working folder on
# sys.path) and without site-packages; only the course's own package is put on sys.path
_BOOT = ("import runpy, sys; sys.path.insert(0, {parent!r}); module = sys.argv[1]; del sys.argv[1]; "
         "runpy.run_module(module, run_name='__main__', alter_sys=True)")


def python_m(module: str, *args: str) -> list[str]:
    """The command line that runs ``module`` of this package as ``__main__`` in a new, isolated
    interpreter (``-I -S``): the standard library and this package alone, whatever the environment
    says (the supervisor, the containment init)."""
    return [sys.executable, "-I", "-S", "-c", _BOOT.format(parent=PACKAGE_PARENT), module, *map(str, args)]
