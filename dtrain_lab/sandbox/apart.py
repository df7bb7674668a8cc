"""Call a function in a forked child of this process, under a clock and a memory limit, and get back
its JSON-able result; standard library only.

Two uses: the grader's checks, which compute from values a submission returned (hostile input that
must not stall or exhaust the grader), and the planner's fake forward and backward, whose autograd
state must not stay in the calling process (see :func:`call`).

The child shares nothing it can change with the caller: it runs ``fn``, writes ``json.dumps`` of the
result to a pipe and ends with ``os._exit`` (no exit handler, no flush of the caller's files). If torch
is imported it runs on one thread: a fork of a process whose OpenMP pool has run hangs on its first
parallel operation.
"""
from __future__ import annotations

import json
import os
import resource
import select
import signal
import sys
import time


class ApartError(RuntimeError):
    """The child overran its clock (``overran``: the seconds it had), ran out of memory, or raised:
    the message says which."""

    def __init__(self, message: str, overran: float | None = None):
        super().__init__(message)
        self.overran = overran


def _vm_bytes() -> int:
    try:
        with open("/proc/self/status") as f:
            return next((int(line.split()[1]) << 10 for line in f if line.startswith("VmSize:")), 0)
    except OSError:
        return 0


def call(fn, *args, seconds: float = 60.0, memory: int | None = None, **kwargs):
    """``fn(*args, **kwargs)`` in a forked child; its result (JSON-able). ``seconds``: wall clock;
    ``memory``: bytes the child may add to this process's address space. Raises :class:`ApartError`.

    Also what keeps autograd fork-safe here: in a CUDA build of torch, a backward on fake tensors
    (``FakeTensorMode``) starts autograd's device threads, and from then on a *forked* child of that
    process cannot run any backward ("Unable to handle autograd's threading in combination with
    fork-based multiprocessing"); done in a child, it leaves the caller as it was."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            os.close(read_fd)
            torch = sys.modules.get("torch")
            if torch is not None:
                torch.set_num_threads(1)
            vm = _vm_bytes()
            if memory and vm:
                resource.setrlimit(resource.RLIMIT_AS, (vm + memory, vm + memory))
            doc = {"value": fn(*args, **kwargs)}
        except BaseException as exc:  # noqa: BLE001 - told to the caller
            doc, code = {"failed": f"{type(exc).__name__}: {exc}"[:500]}, 1
        try:
            data = json.dumps(doc, default=str).encode()
            view = memoryview(data)
            while view:
                view = view[os.write(write_fd, view):]
        finally:
            os._exit(code)
    os.close(write_fd)
    chunks, deadline, overran = [], time.monotonic() + seconds, False
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                overran = True
                break
            ready, _, _ = select.select([read_fd], [], [], min(left, 1.0))
            if ready:
                chunk = os.read(read_fd, 1 << 16)
                if not chunk:
                    break
                chunks.append(chunk)
    finally:
        os.close(read_fd)
        if overran:
            os.kill(pid, signal.SIGKILL)
        status = os.waitpid(pid, 0)[1]
    if overran:
        raise ApartError(f"more than {seconds:g} s", overran=seconds)
    try:
        doc = json.loads(b"".join(chunks))
    except ValueError:
        raise ApartError(f"ended with status {os.waitstatus_to_exitcode(status)}") from None
    if "failed" in doc:
        raise ApartError(str(doc["failed"]))
    return doc["value"]
