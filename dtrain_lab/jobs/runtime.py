"""One init/cleanup pair for every program of the course, in torchrun or in a notebook.

A program started by ``torchrun`` (or by :func:`dtrain_lab.launch`) reads its place in the job
from the environment torchrun sets: ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``,
``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``. Outside torchrun (a notebook kernel, a plain
``python`` run) there is no such environment and :func:`init` gives a world of one, so the same
library code runs unchanged::

    from dtrain_lab.jobs import runtime

    def main():
        rt = runtime.current()
        x = torch.ones(1) * (rt.rank + 1)
        if rt.world_size > 1:
            dist.all_reduce(x)
        runtime.report(total=x.item())

    if __name__ == "__main__":
        runtime.entrypoint(main)      # torchrun --nproc-per-node 2 this_file.py

Choices made here, and why:

* Backend: ``nccl`` only when every local rank has a CUDA GPU of its own, else ``gloo`` on the CPU;
  ``DTRAIN_BACKEND`` overrides (validated, with a bilingual error).
* Process-group timeout: 30 s by default (``DTRAIN_PG_TIMEOUT``), not PyTorch's 10/30 minutes, so
  that in a lesson a hang turns into an error in seconds.
* ``TORCH_DISTRIBUTED_DEBUG``: ``init(debug="DETAIL")`` switches it on for this process.
* Seeding: the same ``seed`` on every rank (identical model initialisation without a broadcast)
  and :func:`data_generator` with a rank offset (different data on each rank).
* Elastic restarts (``torchrun --max-restarts``): attempt ``n`` > 0 initialises its process group
  on torchrun's store under its own prefix (``_restart_store``): torchrun keeps one store for
  the whole job, and without the prefix a restarted rank reads its peers' addresses from the
  failed attempt.
* Exit: with torch 2.13 on CPU, gloo's process-group destructor can deadlock on the GIL while the
  interpreter shuts down (pytorch issue 56297). :func:`entrypoint` therefore ends a torchrun worker
  with ``os._exit`` after ``destroy_process_group()`` and after flushing its output; in a notebook
  kernel nothing is killed.
"""
from __future__ import annotations

import atexit
import contextlib
import datetime as _dt
import json
import os
import random
import sys
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable

from dtrain_lab import caps
from dtrain_lab.i18n import LabError

TORCHRUN_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
DEFAULT_PG_TIMEOUT_S = 30.0
BACKENDS = ("gloo", "nccl")


@dataclass
class Runtime:
    """Where this process stands in the job."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1
    backend: str = "gloo"
    device: Any = "cpu"
    under_torchrun: bool = False
    timeout_s: float = DEFAULT_PG_TIMEOUT_S
    seed: int = 0
    extra: dict = field(default_factory=dict)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    def __enter__(self) -> "Runtime":
        return self

    def __exit__(self, *exc) -> None:
        cleanup()

    def describe(self) -> str:
        return (f"rank {self.rank}/{self.world_size} local_rank {self.local_rank} "
                f"backend={self.backend} device={self.device}")


_current: Runtime | None = None
_local_reports: list[dict] = []


# ----------------------------------------------------------------------------------- environment
def _env_int(name: str, hint: str, default: int | None = None) -> int | None:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise LabError("bad_env_int", name=name, value=raw, hint=hint) from None


def _env_seconds(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise LabError("bad_env_float", name=name, value=raw)
    return value


def under_torchrun() -> bool:
    """True in a process that torchrun (or another launcher setting RANK/WORLD_SIZE) started."""
    present = [v for v in ("RANK", "WORLD_SIZE") if os.environ.get(v)]
    if len(present) == 1:
        missing = "WORLD_SIZE" if present == ["RANK"] else "RANK"
        raise LabError("partial_torchrun_env", present=present[0], missing=missing)
    return bool(present)


def in_notebook() -> bool:
    """True inside a running IPython kernel (JupyterLab), where os._exit would kill the learner's kernel.
    A process that only imported ipykernel (a test runner with nbval loaded, or a process forked from
    one) is not a kernel: there ``get_ipython()`` is None."""
    if "ipykernel" not in sys.modules:
        return False
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    return shell is not None and getattr(shell, "kernel", None) is not None


def torch_release() -> str:
    """torch's version without its build's local tag: ``2.13.0`` whether the wheel is ``2.13.0+cpu``
    (PyTorch's CPU index) or ``2.13.0+cu130`` (PyPI's default on Linux), so that what a lesson prints
    does not depend on which build a learner installed."""
    import torch

    return torch.__version__.split("+", 1)[0]


def gpu_count() -> int:
    """CUDA GPUs visible here (:func:`dtrain_lab.caps.gpu_count`: 0 with ``DTRAIN_CAPS=cuda=0``)."""
    return caps.gpu_count()


def choose_backend(local_world_size: int = 1) -> str:
    """``DTRAIN_BACKEND`` if set, else nccl when every local rank has its own GPU, else gloo."""
    import torch.distributed as dist

    override = os.environ.get("DTRAIN_BACKEND", "").strip().lower()
    gpus = gpu_count()
    if override:
        if override not in BACKENDS:
            raise LabError("bad_backend", value=override, choices=", ".join(BACKENDS))
        if override == "nccl" and (gpus < local_world_size or not dist.is_nccl_available()):
            raise LabError("nccl_without_gpu", local_world=local_world_size, gpus=gpus)
        return override
    if gpus >= local_world_size and gpus > 0 and dist.is_nccl_available():
        return "nccl"
    return "gloo"


def _set_debug(debug: str | None) -> None:
    if debug is None:
        return
    level = str(debug).upper()
    if level not in ("OFF", "INFO", "DETAIL"):
        raise LabError("bad_debug_level", value=debug)
    import torch.distributed as dist

    os.environ["TORCH_DISTRIBUTED_DEBUG"] = level
    dist.set_debug_level_from_env()


# ------------------------------------------------------------------------------------ init/cleanup
def init(*, backend: str | None = None, timeout: float | None = None, seed: int = 0,
         debug: str | None = None) -> Runtime:
    """Join the job torchrun started (or make a world of one) and return the :class:`Runtime`.

    Usable as a context manager: ``with runtime.init() as rt: ...`` calls :func:`cleanup` at the end.
    """
    global _current
    import torch
    import torch.distributed as dist

    _set_debug(debug)
    timeout_s = float(timeout) if timeout is not None else _env_seconds("DTRAIN_PG_TIMEOUT", DEFAULT_PG_TIMEOUT_S)
    if not timeout_s > 0:
        raise LabError("bad_timeout", name="timeout", value=timeout)
    if under_torchrun():
        rank = _env_int("RANK", "0 … WORLD_SIZE-1")
        world = _env_int("WORLD_SIZE", "≥ 1")
        local_rank = _env_int("LOCAL_RANK", "0 … LOCAL_WORLD_SIZE-1", 0)
        local_world = _env_int("LOCAL_WORLD_SIZE", "≥ 1", world)
        if not (world >= 1 and 0 <= rank < world):
            raise LabError("bad_env_int", name="RANK", value=str(rank), hint=f"0 … {world - 1}")
        backend = backend or choose_backend(local_world)
        if backend not in BACKENDS:
            raise LabError("bad_backend", value=backend, choices=", ".join(BACKENDS))
        device: Any = torch.device("cpu")
        kwargs: dict[str, Any] = {}
        if backend == "nccl":  # GPU path: one GPU per local rank; never reached on a CPU machine
            device = torch.device("cuda", local_rank)
            torch.cuda.set_device(device)
            kwargs["device_id"] = device
        if not dist.is_initialized():
            pg_timeout = _dt.timedelta(seconds=timeout_s)
            store = _restart_store(rank, world, pg_timeout)
            if store is not None:   # an elastic restart: keys of its own (see _restart_store)
                kwargs.update(store=store, rank=rank, world_size=world)
            dist.init_process_group(backend=backend, timeout=pg_timeout, **kwargs)
        rt = Runtime(rank=rank, local_rank=local_rank, world_size=world, local_world_size=local_world,
                     backend=backend, device=device, under_torchrun=True, timeout_s=timeout_s, seed=seed)
    else:
        device = torch.device("cuda", 0) if gpu_count() > 0 else torch.device("cpu")
        rt = Runtime(backend=backend or "none", device=device, timeout_s=timeout_s, seed=seed)
    seed_all(seed)
    _current = rt
    return rt


def _restart_store(rank: int, world: int, timeout: _dt.timedelta):
    """The store for attempt ``TORCHELASTIC_RESTART_COUNT`` > 0 of a torchrun job: torchrun's own
    store under the prefix ``dtrain_attempt_<n>/default_pg``; ``None`` for a first attempt.

    Why: torchrun (c10d rendezvous, ``--standalone``) keeps ONE TCPStore server for the whole job
    and gives every attempt the same ``MASTER_ADDR:MASTER_PORT`` (``TORCHELASTIC_USE_AGENT_STORE``).
    ``init_process_group`` always writes under the same prefix ``default_pg/0//cpu//0/``, so a
    restarted rank finds its peers' *previous* gloo addresses already in the store and connects to
    a dead socket ("connectFullMesh failed ... Connection refused") or waits there, unless the
    new peer overwrote its key first: a race that a restart won about a third of the time. A
    prefix per attempt gives each attempt an empty key space.
    """
    attempt = _env_int("TORCHELASTIC_RESTART_COUNT", "≥ 0", 0)
    if not attempt or not os.environ.get("MASTER_ADDR") or not os.environ.get("MASTER_PORT"):
        return None
    import torch.distributed as dist

    store, _, _ = next(dist.rendezvous("env://", rank, world, timeout=timeout))
    store.set_timeout(timeout)
    return dist.PrefixStore(f"dtrain_attempt_{attempt}/default_pg", store)


def current() -> Runtime:
    """The runtime of this process; :func:`init` is called on first use."""
    return _current if _current is not None else init()


def cleanup() -> None:
    """Leave the process group. Safe to call twice, and safe in a notebook kernel.

    In a torchrun worker (never in a notebook) it also arms an ``atexit`` fast exit: after
    ``destroy_process_group()`` the interpreter's shutdown can still destroy a gloo process group
    still referenced by some object and deadlock on the GIL (pytorch issue 56297). ``os._exit``
    skips that shutdown once our own output is flushed.
    """
    global _current
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    if _current is not None and _current.under_torchrun and not in_notebook():
        _arm_fast_exit()
    _current = None


_exit_code = 0


def _arm_fast_exit() -> None:
    if getattr(_arm_fast_exit, "armed", False):
        return
    _arm_fast_exit.armed = True  # type: ignore[attr-defined]
    previous_hook = sys.excepthook

    def hook(*exc_info):
        global _exit_code
        _exit_code = 1
        previous_hook(*exc_info)

    sys.excepthook = hook
    atexit.register(lambda: _fast_exit(_exit_code))


def _flush_all() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    with contextlib.suppress(Exception):
        import logging

        logging.shutdown()


def _mark_exit(code: int) -> None:
    """Leave ``exit.<rank>.<attempt>`` for the launcher: this rank ended by itself (a rank that has
    neither this mark nor a recorded exception was stopped from outside, e.g. by torchrun)."""
    path = _job_file("exit")
    if path is None:
        return
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.write(fd, str(code).encode())
        os.close(fd)


def _fast_exit(code: int) -> None:
    _flush_all()
    _mark_exit(code)
    os._exit(code)


def entrypoint(main: Callable[[], Any], **init_kwargs) -> None:
    """Run ``main`` between :func:`init` and :func:`cleanup`, the robust way for a torchrun worker.

    An exception is printed, recorded for the launcher (which rank, which exception) and the worker
    exits 1 at once: a rank that failed must not wait in ``destroy_process_group``. A worker always
    leaves through ``os._exit`` after flushing (see the module docstring); in a notebook kernel the
    exception is simply re-raised.
    """
    code = 0
    try:
        init(**init_kwargs)
        main()
        cleanup()
    except SystemExit as exc:  # sys.exit(n) inside main
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException as exc:  # noqa: BLE001 - every failure must reach the launcher
        if in_notebook() or not under_torchrun():
            raise
        _record_error(exc)  # first: its time stamp decides which rank failed first
        traceback.print_exc()
        code = 1
    if under_torchrun() and not in_notebook():
        _fast_exit(code)
    if code:
        sys.exit(code)


# ------------------------------------------------------------------------------------ seeding
def parse_value(text: str):
    """``"3"`` -> 3, ``"0.1"`` -> 0.1, anything else unchanged: for ``key=value`` program arguments."""
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def seed_all(seed: int) -> None:
    """Seed Python, NumPy and torch identically: same on every rank -> same model initialisation."""
    import torch

    random.seed(seed)
    torch.manual_seed(seed)
    with contextlib.suppress(ImportError):
        import numpy as np

        np.random.seed(seed % 2**32)


def data_generator(seed: int = 0, rank: int | None = None):
    """A ``torch.Generator`` seeded ``seed + rank``: each rank draws different (reproducible) data."""
    import torch

    rank = current().rank if rank is None else rank
    return torch.Generator().manual_seed(seed + 1_000_003 * rank)


# ------------------------------------------------------------------------------------ printing
def rank() -> int:
    return current().rank


def world_size() -> int:
    return current().world_size


def print0(*args, **kwargs) -> None:
    """Print on rank 0 only."""
    if current().rank == 0:
        print(*args, flush=True, **kwargs)


def rprint(*args, **kwargs) -> None:
    """Print with a ``[rankN]`` prefix (launch output already carries it; this is for plain torchrun)."""
    print(f"[rank{current().rank}]", *args, flush=True, **kwargs)


# ------------------------------------------------------------------------------------ reporting
def _job_file(kind: str, suffix: str = "") -> str | None:
    job_dir = os.environ.get("DTRAIN_JOB_DIR")
    if not job_dir or not os.path.isdir(job_dir):
        return None
    rank_ = os.environ.get("RANK", "0")
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return os.path.join(job_dir, f"{kind}.{rank_}.{attempt}{suffix}")


def _jsonable(value: Any) -> Any:
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if hasattr(value, "tolist"):  # torch tensors and numpy arrays / scalars
        return _jsonable(value.tolist())
    raise TypeError(f"report(): {type(value).__name__} is not JSON-serialisable / 不能序列化为 JSON")


def report(**metrics: Any) -> dict:
    """Send metrics from this rank to the launcher (``LaunchResult.metrics[rank]``).

    They travel in a file of the launcher's private job directory, one JSON object per line, not
    through stdout: nothing the program prints can forge or garble them. Outside a launch the
    metrics are kept in this process (:func:`local_reports`) so the same code runs in a notebook.
    """
    payload = {k: _jsonable(v) for k, v in metrics.items()}
    path = _job_file("report", ".jsonl")
    if path is None:
        _local_reports.append(payload)
        return payload
    line = json.dumps(payload, allow_nan=True) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        os.write(fd, line.encode())  # one write of one line: never interleaved with another
    finally:
        os.close(fd)
    return payload


def local_reports() -> list[dict]:
    return list(_local_reports)


def _record_error(exc: BaseException) -> None:
    path = _job_file("error", ".json")
    if path is None or os.path.exists(path):
        return
    info = {"type": type(exc).__name__, "message": str(exc)[:2000], "time": time.time(),
            "traceback": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))[-8000:]}
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(info, f)
    os.replace(tmp, path)
