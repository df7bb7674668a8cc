"""Lab 09 — survive a killed rank: the contract of its two exercises (what a submission may import).

1. ``atomic_save(obj, path)``: the submission's ``run()`` calls :func:`atomic_cases`, which saves,
   then *crashes a save half-way* (``torch.save`` is replaced, for that one call, by a version that
   writes half of the bytes and raises :class:`SimulatedCrash`), then saves again, and reports what
   ``path`` held after each call, the files left over and the durability calls made.
2. ``train()``: the lab's 2-rank DDP job (:class:`Job`) must checkpoint and resume so that a run
   killed and restarted by the grader ends with the same parameters as an uninterrupted run. Each
   rank's share of the data is **private to that rank** and drawn for every graded run from a seed no
   rank sees (:func:`make_inputs`), so the final parameters can only be right if the ranks really
   trained together. The faults come from the grader, from outside the rank: :meth:`Job.train_step`
   and the ``torch.save`` patched by :func:`arm_fault` (the exercise's ``setup``) only say where the
   fault belongs (:func:`fault_point`: a mark, then a wait), and the job's supervisor SIGKILLs the
   rank when it sees the mark (:mod:`dtrain_lab.sandbox.supervisor`). The supervisor counts the
   attempts. A rank that disarms the fault is never killed, and fails for that: the checks read which
   faults fired and how many attempts ran from the supervisor, never from the rank. After the
   restart, the batches before the last checkpoint are not the ones of the first attempt
   (:func:`restart_inputs`): a job that starts over instead of resuming ends with wrong parameters.

The checks, and the reference run they compare with, live outside the sandbox
(``dtrain_lab.grading.checks.lab09``).
"""
from __future__ import annotations

import io
import os
import signal
import stat

import torch
import torch.nn as nn
import torch.nn.functional as F

from dtrain_lab.grading import contract

LAB = "lab_09"
FAULT_ENV = "DTRAIN_LAB09_FAULT"          # "kill_rank1_step6" | "kill_rank0_in_save2" | unset


class SimulatedCrash(BaseException):
    """Raised in place of a process dying half-way through ``torch.save`` (a BaseException, so that
    an ``except Exception`` in the learner's code cannot swallow it, as nothing can catch SIGKILL)."""


# ------------------------------------------------------------------ 1. atomic save
def _target_path(f):
    if isinstance(f, (str, os.PathLike)):
        return os.fspath(f)
    name = getattr(f, "name", None)
    return name if isinstance(name, str) else None


def _write_half(obj, f) -> None:
    """Serialise ``obj`` as ``torch.save`` would, write the first half of the bytes to ``f``, make
    them durable: what a process killed in the middle of ``torch.save`` leaves behind."""
    buf = io.BytesIO()
    _REAL_SAVE(obj, buf)
    data = buf.getvalue()[: max(1, len(buf.getvalue()) // 2)]
    if isinstance(f, (str, os.PathLike)):
        with open(f, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
    else:
        f.write(data)
        f.flush()
        if hasattr(f, "fileno"):
            try:
                os.fsync(f.fileno())
            except (OSError, io.UnsupportedOperation):
                pass


_REAL_SAVE = torch.save


class _Recorder:
    """Within ``with``: record ``torch.save`` targets, ``os.fsync`` (file or directory),
    ``os.replace``/``os.rename``; optionally crash the next ``torch.save`` half-way."""

    def __init__(self, crash: bool = False):
        self.crash = crash
        self.events: list[tuple] = []

    def __enter__(self):
        self._saved = (torch.save, os.fsync, os.replace, os.rename)
        real_save, real_fsync, real_replace, real_rename = self._saved

        def save(obj, f, *a, **kw):
            if isinstance(f, io.BytesIO):      # pickling a tensor calls torch.save into memory: not a file write
                return real_save(obj, f, *a, **kw)
            self.events.append(("save", _target_path(f)))
            if self.crash:
                _write_half(obj, f)
                raise SimulatedCrash("the grader stopped this torch.save half-way (a simulated crash)")
            return real_save(obj, f, *a, **kw)

        def fsync(fd):
            try:
                kind = "dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file"
            except (OSError, TypeError):
                kind = "?"
            self.events.append(("fsync", kind))
            return real_fsync(fd)

        def replace(src, dst, *a, **kw):
            self.events.append(("replace", os.fspath(src), os.fspath(dst)))
            return real_replace(src, dst, *a, **kw)

        def rename(src, dst, *a, **kw):
            self.events.append(("replace", os.fspath(src), os.fspath(dst)))
            return real_rename(src, dst, *a, **kw)

        torch.save, os.fsync, os.replace, os.rename = save, fsync, replace, rename
        return self

    def __exit__(self, *exc):
        torch.save, os.fsync, os.replace, os.rename = self._saved
        return False


def _summary(path: str) -> dict:
    """What ``path`` holds: ``{"step": n}``, ``{"missing": True}`` or ``{"error": message}``."""
    if not os.path.exists(path):
        return {"missing": True}
    try:
        obj = torch.load(path, weights_only=True)
        w = obj["w"]
        ok = torch.equal(w, torch.arange(w.numel(), dtype=torch.float32) * obj["step"])
        return {"step": int(obj["step"]), "whole": bool(ok)}
    except BaseException as exc:  # noqa: BLE001 - a torn file raises anything from EOFError to RuntimeError
        return {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}


def _state(step: int) -> dict:
    # 200 000 floats (800 kB): large enough that half a file is visibly not a checkpoint
    return {"step": step, "w": torch.arange(200_000, dtype=torch.float32) * step}


def atomic_cases(atomic_save) -> dict:
    """Driver of exercise 1: save step 1, crash while saving step 2, save step 3.

    Returns what the file held after each call, the files left in the folder, the recorded calls
    and any exception the learner's function raised (other than the simulated crash).
    """
    import tempfile

    folder = tempfile.mkdtemp(prefix="lab09_atomic_", dir=contract.shared_dir())
    path = os.path.join(folder, "state.pt")
    out = {"folder": folder, "path": path}
    for name, step, crash in (("first", 1, False), ("crash", 2, True), ("third", 3, False)):
        rec = _Recorder(crash=crash)
        raised = None
        try:
            with rec:
                atomic_save(_state(step), path)
        except SimulatedCrash:
            raised = "crash"
        except Exception as exc:  # noqa: BLE001 - reported as a problem
            raised = f"{type(exc).__name__}: {exc}"
        out[name] = {"events": rec.events, "raised": raised, "holds": _summary(path),
                     "files": sorted(os.listdir(folder))}
    return out


# ------------------------------------------------------------------ 2. the job that must survive a kill
STEPS, CKPT_EVERY, GLOBAL_BATCH, D_IN, D_OUT = 12, 4, 8, 6, 2
LR, MOMENTUM, WEIGHT_DECAY, LR_STEP, LR_GAMMA = 0.05, 0.9, 1e-3, 5, 0.5
KILL_STEP, KILL_RANK = 6, 1
MARK_STEP, MARK_SAVE = "step", "save"     # the marks the supervisor's faults wait for
FAULT_WAIT_S = 60.0


def fault_point(mark: str) -> None:
    """Where the grader's fault belongs: in a graded run, write ``mark`` to this rank's marks file and
    wait for the job's supervisor, which SIGKILLs this process from outside when it sees the mark (a
    rank killed by another process, as a failed node is; its namespace changes nothing). Outside the
    grader (a learner's practice run under ``dtrain_lab.launch``, with no supervisor) the process
    SIGKILLs itself, as before."""
    io_dir = os.environ.get("DTRAIN_GRADE_IO")
    marks = os.path.join(io_dir, "marks") if io_dir else None
    if marks is None or not os.path.exists(marks):
        os.kill(os.getpid(), signal.SIGKILL)
        return
    with open(marks, "a") as f:
        f.write(mark + "\n")
    import time

    deadline = time.monotonic() + FAULT_WAIT_S
    while time.monotonic() < deadline:     # the kill lands here; if it never does, the verdict says so
        time.sleep(0.01)


def restart_inputs(seed: int, world: int, inputs: list) -> list:
    """The inputs of the attempts after a restart: the same batches from the last checkpoint before
    either fault on (step ``CKPT_EVERY``), other batches before it. A job that resumes never reads
    them; one that starts over trains on them and ends with other parameters."""
    fresh = make_inputs(contract.rng(seed, "restart").getrandbits(63), world)
    return [{"steps": f["steps"][:CKPT_EVERY] + i["steps"][CKPT_EVERY:]} for i, f in zip(inputs, fresh)]


def make_inputs(seed: int, world: int) -> list[dict]:
    """Every rank's private inputs: its shard of every global batch (``x``, ``y`` per step)."""
    per = GLOBAL_BATCH // max(world, 1)
    job = contract.rng(seed, "teacher")
    w = [[job.gauss(0.0, 1.0) / D_IN ** 0.5 for _ in range(D_OUT)] for _ in range(D_IN)]
    out = []
    for r in range(world):
        g = contract.rng(seed, "data", r)
        steps = []
        for _ in range(STEPS):
            xs = [[round(g.gauss(0.0, 1.0), 5) for _ in range(D_IN)] for _ in range(per)]
            ys = [[round(sum(x[i] * w[i][j] for i in range(D_IN)) + 0.1 * g.gauss(0.0, 1.0), 5) for j in range(D_OUT)]
                  for x in xs]
            steps.append({"x": xs, "y": ys})
        out.append({"steps": steps})
    return out


def batch_of(inputs: dict, step: int):
    """``(x, y)`` of ``step`` from one rank's inputs (float32 tensors)."""
    s = inputs["steps"][step]
    return torch.tensor(s["x"], dtype=torch.float32), torch.tensor(s["y"], dtype=torch.float32)


def batch(step: int, rank: int | None = None):
    """This rank's share of global batch ``step`` (a pure function of the step; private to the rank)."""
    return batch_of(contract.mine(make_inputs, rank), step)


def lab_model() -> nn.Module:
    """``Linear(6, 16) → ReLU → Dropout(0.3) → Linear(16, 2)``, initialised from its own generator."""
    g = torch.Generator().manual_seed(0)
    model = nn.Sequential(nn.Linear(D_IN, 16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, D_OUT))
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.4)
    return model


def make_optim(model):
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM, weight_decay=WEIGHT_DECAY)
    return opt, torch.optim.lr_scheduler.StepLR(opt, step_size=LR_STEP, gamma=LR_GAMMA)


def rank_seed(rank: int) -> int:
    return 1000 + rank


class Job:
    """The lab's training job, the same on every attempt. It owns nothing of the learner's logic:

    ``model`` (PyTorch's DDP around :func:`lab_model`; ``module`` is the unwrapped model),
    ``optimizer`` (SGD, momentum 0.9, weight decay 1e-3), ``scheduler`` (StepLR, halving every 5 steps),
    ``steps`` (12), ``ckpt_every`` (4), ``ckpt_dir`` (one folder shared by every attempt),
    ``rank``, ``world_size`` and :meth:`train_step`. Each rank's global torch generator is seeded
    with ``1000 + rank`` here, so that dropout differs between ranks, as it does in real training.
    """

    def __init__(self):
        from torch.nn.parallel import DistributedDataParallel

        from dtrain_lab.jobs import runtime

        rt = runtime.current()
        self.rank, self.world_size = rt.rank, rt.world_size
        self.attempt = contract.attempt()
        self.module = lab_model()
        self.model = DistributedDataParallel(self.module) if rt.distributed else self.module
        self.optimizer, self.scheduler = make_optim(self.module)
        torch.manual_seed(rank_seed(self.rank))     # last: building DDP draws from the generator
        self.steps, self.ckpt_every = STEPS, CKPT_EVERY
        self.ckpt_dir = os.path.join(contract.shared_dir(), "checkpoints")
        os.makedirs(self.ckpt_dir, exist_ok=True)
        self.steps_run: list[int] = []
        _JOBS.append(self)

    def train_step(self, step: int) -> float:
        """One training step on global batch ``step``: forward, backward (DDP averages the gradients),
        ``optimizer.step()``, ``scheduler.step()``. Returns the rank's loss."""
        if (os.environ.get(FAULT_ENV) == "kill_rank1_step6" and self.attempt == 0 and step == KILL_STEP
                and self.rank == KILL_RANK):
            fault_point(MARK_STEP)          # the grader's fault: this rank is killed here
        x, y = batch(step)
        self.optimizer.zero_grad(set_to_none=True)
        loss = F.mse_loss(self.model(x), y)
        loss.backward()
        self.optimizer.step()
        self.scheduler.step()
        self.steps_run.append(step)
        return float(loss.detach())


_JOBS: list[Job] = []


def report(model) -> dict:
    """What the submission's ``run()`` hands back: the final parameters of ``model`` (the job's model,
    DDP or not), the steps this attempt's :class:`Job` ran, and the attempt."""
    m = model.module if isinstance(getattr(model, "module", None), nn.Module) else model
    params = [p.detach().cpu().clone() for p in m.parameters()] if isinstance(m, nn.Module) else None
    return {"params": params, "steps_run": list(_JOBS[-1].steps_run) if _JOBS else None}


def arm_fault(rt) -> None:
    """The exercise's ``setup`` (in every rank, before the submission is imported): on the first
    attempt of the scenario ``kill_rank0_in_save2``, rank 0's second ``torch.save`` into a file (not
    into memory) writes half of its bytes and the process SIGKILLs itself, as a node failure during a
    checkpoint write would."""
    if os.environ.get(FAULT_ENV) != "kill_rank0_in_save2" or contract.attempt() != 0 or rt.rank != 0:
        return
    calls = [0]

    def save(obj, f, *a, **kw):
        if isinstance(f, io.BytesIO):   # pickling a tensor (all_gather_object, say) calls torch.save in memory
            return _REAL_SAVE(obj, f, *a, **kw)
        calls[0] += 1
        if calls[0] == 2:
            _write_half(obj, f)
            fault_point(MARK_SAVE)          # killed half-way through the write
        return _REAL_SAVE(obj, f, *a, **kw)

    torch.save = save
