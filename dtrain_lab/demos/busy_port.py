"""Experiment for lesson 10: what a second job with a hard-coded ``MASTER_PORT`` meets.

:func:`reproduce_address_in_use` starts a real ``torchrun --master-port P`` while another socket
already listens on P, and returns torchrun's exit code and its last error line (``EADDRINUSE``,
which :func:`dtrain_lab.jobs.diagnose.diagnose` recognises). ``dtrain_lab.launch`` never meets it:
``--standalone`` lets c10d bind a free port.
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys

from dtrain_lab.jobs._procs import kill_job
from dtrain_lab.jobs.launch import PACKAGE_PARENT
from dtrain_lab.sandbox import python_m


def reproduce_address_in_use(timeout: float = 120.0) -> tuple[int, str]:
    """Start a real ``torchrun --master-port P`` while another socket already listens on P (what a
    second job with a hard-coded port meets). Returns torchrun's exit code and its last error line."""
    with socket.socket() as busy:            # "the first job": holds the port while torchrun starts
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "1",
               "--master-addr", "127.0.0.1", "--master-port", str(port), "-m", "dtrain_lab.demos.hello"]
        env = dict(os.environ, PYTHONPATH=str(PACKAGE_PARENT))
        # torchrun under a job init (a child subreaper), as every launch: nothing of it can outlive the cell
        proc = subprocess.Popen(python_m("dtrain_lab.sandbox.contain", "--", *cmd), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
        try:
            _, stderr = proc.communicate(timeout=timeout)
        finally:                              # never leave the agent or its worker behind
            kill_job(proc)
    errors = [ln for ln in stderr.splitlines() if "Error" in ln and ":" in ln]
    return proc.returncode, (errors[-1].strip() if errors else stderr.strip()[-300:])
