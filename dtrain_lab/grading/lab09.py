"""Lab 09 — survive a killed rank: atomic checkpoints and an exact resume.

Two exercises, written by the learner in ``solutions/_source/lab_09_recovery.md``:

1. ``atomic_save(obj, path)``: write a checkpoint so that a crash at any instant leaves either the
   old file or the new one at ``path``, whole. Graded on one rank by :func:`atomic_cases`, which
   saves, then *crashes a save half-way* (``torch.save`` is replaced, for that one call, by a version
   that writes half of the bytes and raises :class:`SimulatedCrash`), then saves again. The checks
   judge the behaviour (what ``path`` holds after each call, which files are left over) and the
   durability calls the learner's code made (``os.fsync`` of the data before ``os.replace``, then
   of the directory): the POSIX recipe, as ``dtrain_lab.resilience.recovery.save`` does it.
2. ``train()``: the lab's 2-rank DDP job (:class:`Job`: a model with dropout, SGD with momentum, a
   StepLR schedule, each rank's own dropout stream) must checkpoint and resume so that a run that is
   killed and restarted by torchrun (``--max-restarts 1``) ends with **the same parameters** as an
   uninterrupted run. The grader runs it twice, each time killing a rank with ``SIGKILL`` during
   the first attempt: rank 1 at step 6 of 12, then rank 0 half-way through writing its second
   checkpoint. The faults come from the grader (:meth:`Job.train_step` and a ``torch.save`` patched
   in :func:`_setup`), never from the learner's code. The checks compare the final parameters with
   a single-process simulation of the uninterrupted run (each rank's gradient computed with that
   rank's own generator, averaged as DDP does), check that the final attempt *resumed* (starting
   over from step 0 also ends right, and is not what is asked), and, when the result is wrong,
   replay the run with one part of the state missing at the resume (optimizer, scheduler, the RNG,
   rank 0's RNG on every rank) to say which part it was.
"""
from __future__ import annotations

import io
import os
import signal
import stat

import torch
import torch.nn as nn
import torch.nn.functional as F

from dtrain_lab.grading.registry import Exercise, problem, register

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

    folder = tempfile.mkdtemp(prefix="lab09_atomic_", dir=os.environ.get("DTRAIN_JOB_DIR") or None)
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


def _check_atomic(rt, result, module):
    p = []
    first, crash, third = result["first"], result["crash"], result["third"]
    folder = result["folder"]
    for name, case, step in (("first", first, 1), ("third", third, 3)):
        if case["raised"] not in (None, "crash"):
            return [problem(f"atomic_save 抛出了异常：{case['raised']}", f"atomic_save raised: {case['raised']}")]
        if case["holds"].get("step") != step or not case["holds"].get("whole"):
            return [problem(f"保存第 {step} 步之后，文件里不是刚保存的内容：{case['holds']}",
                            f"after saving step {step} the file does not hold what was saved: {case['holds']}")]
    saves = [e for e in first["events"] if e[0] == "save"]
    if not saves:
        return [problem("atomic_save 没有调用 torch.save：请用 torch.save 写出对象。",
                        "atomic_save did not call torch.save: write the object with torch.save.")]
    if crash["raised"] != "crash":
        p.append(problem("模拟崩溃没有发生：第二次保存没有调用 torch.save。", "the simulated crash did not happen: the "
                         "second save did not call torch.save."))
    held = crash["holds"]
    if held.get("step") != 1 or not held.get("whole"):
        what_zh = "留下的是写了一半的文件" if "error" in held else ("什么文件都没有" if held.get("missing") else f"留下的是 {held}")
        what_en = "a half-written file" if "error" in held else ("no file at all" if held.get("missing") else str(held))
        p.append(problem(
            f"保存写到一半时进程“崩溃”了，之后 path 上{what_zh}，而不是完好的旧检查点。要先写到同一目录下的临时文件，"
            "写完并 fsync 之后再用 os.replace 把它原子地替换到 path 上：这样无论崩溃发生在哪一刻，path 上都只会是完整的旧文件或完整的新文件。",
            f"the process 'crashed' half-way through a save and path was left holding {what_en} instead of the whole "
            "old checkpoint. Write a temporary file in the same folder, fsync it, then os.replace it onto path: "
            "whenever a crash happens, path then holds the whole old file or the whole new one."))
    targets = [e[1] for e in saves if e[1]]
    if targets and any(os.path.abspath(t) == os.path.abspath(result["path"]) for t in targets):
        if not p:
            p.append(problem("torch.save 直接写到了 path 上：一旦崩溃，path 上就会留下写了一半的文件。",
                             "torch.save wrote straight onto path: a crash leaves a half-written file there."))
    elif any(e[0] == "replace" and os.path.dirname(os.path.abspath(e[1])) != os.path.abspath(folder)
             for e in first["events"] + third["events"]):
        p.append(problem("临时文件不在 path 所在的目录里：os.replace 只有在同一个文件系统内才是原子的"
                         "（跨文件系统时它直接报错 EXDEV；shutil.move 则会退化成复制，不再原子），所以临时文件要和 path 放在同一目录。",
                         "the temporary file is not in path's folder: os.replace is atomic only within one file "
                         "system (across file systems it fails with EXDEV, and shutil.move falls back to a copy, which is not atomic), so put the temporary file next to path."))
    left = [f for f in third["files"] if f != "state.pt"]
    leftovers_after_ok = [f for f in first["files"] if f != "state.pt"]
    if leftovers_after_ok:
        p.append(problem(f"成功保存之后目录里还留着别的文件：{leftovers_after_ok}。临时文件应当被改名成 path，而不是留下来。",
                         f"after a successful save the folder also holds {leftovers_after_ok}: the temporary file "
                         "should have become path, not stay behind."))
    elif len(left) > 1:
        p.append(problem(f"每次崩溃都留下一个新的临时文件（{left}）：用固定的临时文件名（如 path + '.tmp'），"
                         "下一次保存会覆盖它。", f"every crash leaves another temporary file ({left}): use one "
                         "temporary name (such as path + '.tmp') that the next save overwrites."))
    ev = third["events"]
    kinds = [e[0] for e in ev]
    if "replace" not in kinds:
        p.append(problem("没有看到 os.replace（或 os.rename）：新文件是怎么到 path 上的？原子性正来自这一步改名。",
                         "no os.replace (or os.rename) was seen: how did the new file get onto path? The rename is "
                         "what makes the save atomic."))
    else:
        i = kinds.index("replace")
        if ("fsync", "file") not in ev[:i]:
            p.append(problem(
                "改名之前没有对临时文件做 os.fsync：文件系统可能先把改名落盘、数据却还没落盘，断电后 path 上会是一个空的或残缺的文件"
                "（ext4 的 delayed allocation 就出过这种事）。写完后先 f.flush()，再 os.fsync(f.fileno())，然后再改名。",
                "the temporary file was not os.fsync'ed before the rename: the file system may persist the rename "
                "before the data, and after a power loss path holds an empty or partial file (ext4's delayed "
                "allocation did exactly this). After writing: f.flush(), os.fsync(f.fileno()), then rename."))
        if ("fsync", "dir") not in ev[i + 1:]:
            p.append(problem(
                "改名之后没有 fsync 目录：改名本身记录在目录里，不 fsync 目录，断电后改名可能丢失。"
                "做法：folder = os.path.dirname(os.path.abspath(path))；"
                "fd = os.open(folder, os.O_RDONLY); os.fsync(fd); os.close(fd)。",
                "the folder was not fsync'ed after the rename: the rename is recorded in the folder, and without "
                "an fsync of the folder it can be lost in a power cut. With "
                "folder = os.path.dirname(os.path.abspath(path)): fd = os.open(folder, os.O_RDONLY); os.fsync(fd); "
                "os.close(fd)."))
    return p


register(Exercise(
    id="lab09.atomic_save", lab=LAB, entry="run", filename="lab09_atomic_save.py", timeout=30,
    title={"en": "1 · An atomic checkpoint write", "zh": "1 · 原子地写检查点"},
    checks=[_check_atomic], world_sizes=(1,)))


# ------------------------------------------------------------------ 2. the job that must survive a kill
STEPS, CKPT_EVERY, GLOBAL_BATCH = 12, 4, 8
LR, MOMENTUM, WEIGHT_DECAY, LR_STEP, LR_GAMMA = 0.05, 0.9, 1e-3, 5, 0.5
KILL_STEP, KILL_RANK = 6, 1
RTOL, ATOL = 1e-6, 1e-7


def lab_model() -> nn.Module:
    """``Linear(6, 16) → ReLU → Dropout(0.3) → Linear(16, 2)``, initialised from its own generator."""
    g = torch.Generator().manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 2))
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.4)
    return model


def _dataset():
    from dtrain_lab.data import regression_dataset

    return regression_dataset(n=64, d_in=6, d_out=2, seed=9)


def batch(step: int, rank: int, world: int):
    """Rank ``rank``'s share of global batch ``step`` (a pure function of the step)."""
    from dtrain_lab.data import global_batch, shard

    return shard(global_batch(_dataset(), step, GLOBAL_BATCH), rank, world)


def _make_optim(model):
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM, weight_decay=WEIGHT_DECAY)
    return opt, torch.optim.lr_scheduler.StepLR(opt, step_size=LR_STEP, gamma=LR_GAMMA)


def _seed(rank: int) -> int:
    return 1000 + rank


def _attempt() -> int:
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)


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
        self.attempt = _attempt()
        self.module = lab_model()
        self.model = DistributedDataParallel(self.module) if rt.distributed else self.module
        self.optimizer, self.scheduler = _make_optim(self.module)
        torch.manual_seed(_seed(self.rank))     # last: building DDP draws from the generator
        self.steps, self.ckpt_every = STEPS, CKPT_EVERY
        self.ckpt_dir = os.path.join(os.environ.get("DTRAIN_JOB_DIR", "."), "checkpoints")
        os.makedirs(self.ckpt_dir, exist_ok=True)
        self.steps_run: list[int] = []
        _JOBS.append(self)

    def train_step(self, step: int) -> float:
        """One training step on global batch ``step``: forward, backward (DDP averages the gradients),
        ``optimizer.step()``, ``scheduler.step()``. Returns the rank's loss."""
        if (os.environ.get(FAULT_ENV) == "kill_rank1_step6" and self.attempt == 0 and step == KILL_STEP
                and self.rank == KILL_RANK):
            os.kill(os.getpid(), signal.SIGKILL)          # the grader's fault: this rank dies here
        x, y = batch(step, self.rank, self.world_size)
        self.optimizer.zero_grad(set_to_none=True)
        loss = F.mse_loss(self.model(x), y)
        loss.backward()
        self.optimizer.step()
        self.scheduler.step()
        self.steps_run.append(step)
        return float(loss.detach())


_JOBS: list[Job] = []


def _setup(rt) -> None:
    """In the harness, before the submission is imported: on the first attempt of the scenario
    ``kill_rank0_in_save2``, rank 0's second ``torch.save`` into a file (not into memory) writes half of its bytes and the
    process SIGKILLs itself, as a node failure during a checkpoint write would."""
    if os.environ.get(FAULT_ENV) != "kill_rank0_in_save2" or _attempt() != 0 or rt.rank != 0:
        return
    calls = [0]

    def save(obj, f, *a, **kw):
        if isinstance(f, io.BytesIO):   # pickling a tensor (all_gather_object, say) calls torch.save in memory
            return _REAL_SAVE(obj, f, *a, **kw)
        calls[0] += 1
        if calls[0] == 2:
            _write_half(obj, f)
            os.kill(os.getpid(), signal.SIGKILL)
        return _REAL_SAVE(obj, f, *a, **kw)

    torch.save = save


def simulate(world: int, steps: int = STEPS, resume_at: int | None = None, drop: str | None = None) -> list:
    """Every rank's final parameters of the run, in one process with no communication.

    Rank ``r``'s gradient is computed from its own batch with its own generator state; the average
    is taken as DDP takes it. With ``resume_at``, the run is stopped after that many steps and the
    state is rebuilt as a new attempt would build it (fresh model, optimizer, scheduler, reseeded
    generators), then loaded from the state at that step except ``drop``: ``"optimizer"``,
    ``"scheduler"``, ``"rng"`` or ``"rng_rank0"`` (rank 0's generator state loaded on every rank).
    """
    saved_rng = torch.get_rng_state()
    try:
        def fresh():
            model = lab_model()
            opt, sched = _make_optim(model)
            rngs = []
            for r in range(world):
                torch.manual_seed(_seed(r))
                rngs.append(torch.get_rng_state())
            return model, opt, sched, rngs

        model, opt, sched, rngs = fresh()
        for step in range(steps):
            if step == resume_at:
                state = {"model": {k: v.clone() for k, v in model.state_dict().items()},
                         "opt": opt.state_dict(), "sched": sched.state_dict(), "rngs": [s.clone() for s in rngs]}
                import copy

                state["opt"] = copy.deepcopy(state["opt"])
                model, opt, sched, fresh_rngs = fresh()
                model.load_state_dict(state["model"])
                if drop != "optimizer":
                    opt.load_state_dict(state["opt"])
                if drop != "scheduler":
                    sched.load_state_dict(state["sched"])
                rngs = {"rng": fresh_rngs, "rng_rank0": [state["rngs"][0]] * world}.get(drop, state["rngs"])
            opt.zero_grad(set_to_none=True)
            grads = None
            for r in range(world):
                torch.set_rng_state(rngs[r])
                x, y = batch(step, r, world)
                loss = F.mse_loss(model(x), y)
                g = torch.autograd.grad(loss, list(model.parameters()))
                rngs[r] = torch.get_rng_state()
                g = [t / world for t in g]
                grads = g if grads is None else [a + b for a, b in zip(grads, g)]
            for p, g in zip(model.parameters(), grads):
                p.grad = g
            opt.step()
            sched.step()
        return [p.detach().clone() for p in model.parameters()]
    finally:
        torch.set_rng_state(saved_rng)


def _params(result) -> list | None:
    if isinstance(result, nn.Module):
        m = result.module if hasattr(result, "module") and isinstance(result.module, nn.Module) else result
        return [p.detach().cpu() for p in m.parameters()]
    return None


def _close(a: list, b: list) -> bool:
    return len(a) == len(b) and all(x.shape == y.shape and torch.allclose(x, y, rtol=RTOL, atol=ATOL)
                                    for x, y in zip(a, b))


_DROP_HINTS = {
    "optimizer": problem(
        "结果与“恢复时没有加载优化器状态”的训练一致：SGD 的动量缓冲区（momentum_buffer）从零重新开始了。"
        "把 optimizer.state_dict() 存进检查点，恢复时调用 optimizer.load_state_dict(...)。",
        "the result matches a resume that did not load the optimizer's state: SGD's momentum buffers started "
        "again from zero. Save optimizer.state_dict() and call optimizer.load_state_dict(...) on resume."),
    "scheduler": problem(
        "结果与“恢复时没有加载学习率调度器状态”的训练一致：StepLR 又从零开始计数，在错误的步数把学习率减半了。"
        "把 scheduler.state_dict() 也存进检查点并加载。",
        "the result matches a resume that did not load the LR scheduler: StepLR counted from zero again and "
        "halved the learning rate at the wrong step. Save and load scheduler.state_dict() too."),
    "rng": problem(
        "结果与“恢复时没有还原随机数生成器状态”的训练一致：dropout 掩码和不中断的训练不一样了。"
        "每个 rank 都要保存并恢复自己的 torch.get_rng_state()。",
        "the result matches a resume that did not restore the random generators: the dropout masks differ "
        "from the uninterrupted run's. Every rank must save its own torch.get_rng_state() and put it back with torch.set_rng_state()."),
    "rng_rank0": problem(
        "结果与“每个 rank 都加载了 rank 0 的随机数状态”的训练一致：rank 0 只保存了自己的生成器状态。"
        "各 rank 的生成器状态各不相同（各 rank 的 dropout 本来就该不同）：用 dist.all_gather_object 收集所有 rank 的状态一起保存，"
        "恢复时每个 rank 取下标为 rank 的那一项（或者每个 rank 各写一个自己的文件）。",
        "the result matches a resume in which every rank loaded rank 0's generator state: rank 0 saved only "
        "its own. Each rank's generator is different (dropout must differ between ranks): gather every rank's "
        "state with dist.all_gather_object, save them all, and let each rank load entry [rank] (or let every "
        "rank write a file of its own)."),
}


def _check_resume(rt, result, module):
    fault = os.environ.get(FAULT_ENV)
    jobs = [j for j in _JOBS if j.rank == rt.rank]
    if not jobs:
        return [problem("train() 没有创建 Job()：请用 Job 提供的模型、优化器和 train_step。",
                        "train() did not create a Job(): use the model, optimizer and train_step it provides.")]
    job = jobs[-1]
    p = []
    if fault and _attempt() == 0:
        return [problem("评分器注入的故障没有发生（第一轮就跑完了）：train() 要按顺序对每一步调用 job.train_step(step)，"
                        "每 job.ckpt_every 步保存一次检查点。",
                        "the grader's fault never fired (the first attempt ran to the end): train() must call "
                        "job.train_step(step) for every step in order and save a checkpoint every job.ckpt_every "
                        "steps.")]
    run = job.steps_run
    if run != list(range(run[0] if run else 0, STEPS)):
        return [problem(f"最后一轮跑过的步是 {run}：应当从恢复的那一步开始，按顺序一直跑到第 {STEPS - 1} 步，"
                        "每步恰好一次。",
                        f"the final attempt ran steps {run}: it should run from the step it resumed at, in order, "
                        f"up to step {STEPS - 1}, each step once.")]
    if fault and run[0] == 0:
        p.append(problem("重启之后训练从第 0 步重新开始了，没有从检查点恢复。结果虽然对，但大模型重跑一遍要花好几天："
                         "启动时应找到最新的完整检查点，从那里接着训练。",
                         "after the restart the training started over from step 0 instead of resuming from a "
                         "checkpoint. The result is right, but on a large model starting over costs days: find the "
                         "newest whole checkpoint at start-up and continue from it."))
    got = _params(result)
    if got is None:
        return p + [problem(f"train() 应当返回模型（job.model），却返回了 {type(result).__name__}。",
                            f"train() should return the model (job.model); it returned {type(result).__name__}.")]
    want = simulate(rt.world_size)
    if not _close(got, want):
        diff = max(float((a - b).abs().max()) for a, b in zip(got, want)) if len(got) == len(want) else float("nan")
        p.append(problem(f"最终参数与不中断训练的参数不同（最大差值 {diff:.3g}）；这次是从第 {run[0] if run else '?'} 步恢复的。",
                         f"the final parameters differ from the uninterrupted run's (max difference {diff:.3g}); the "
                         f"run resumed at step {run[0] if run else '?'}."))
        if run and run[0] > 0:
            for drop, hint in _DROP_HINTS.items():
                if _close(got, simulate(rt.world_size, resume_at=run[0], drop=drop)):
                    p.append(hint)
                    break
    return p


def _explain_resume(outcome: str, feedback: str, source: str) -> list:
    # a torn file fails torch.load in many ways: "PytorchStreamReader failed reading zip archive",
    # "OSError: [Errno 22] Invalid argument" (torch 2.13), EOFError, UnpicklingError...
    in_save_kill = any(SCENARIOS[1]["name"][lang] in feedback for lang in ("en", "zh"))
    load_error = any(k in feedback for k in ("PytorchStreamReader", "central directory", "zip archive", "EOFError",
                                              "UnpicklingError", "OSError", "RuntimeError"))
    if outcome == "crash" and in_save_kill and load_error:
        return [problem(
            "重启后加载检查点失败，文件是残缺的，因为上一轮在写它的时候被杀掉了。要么检查点的写入不是原子的（直接写到了最终文件名上），"
            "要么 latest_checkpoint 挑中了写了一半的临时文件。只把完整的文件改名成检查点的名字，找检查点时只认这个名字。",
            "after the restart a checkpoint failed to load: the file is torn, because the previous attempt was killed "
            "while writing it. Either the save is not atomic (it wrote straight onto the final name), or "
            "latest_checkpoint picked the half-written temporary file. Only rename whole files to a checkpoint's "
            "name, and look for that name only.")]
    return []


SCENARIOS = (
    {"name": {"en": f"rank {KILL_RANK} killed at step {KILL_STEP}", "zh": f"rank {KILL_RANK} 在第 {KILL_STEP} 步被杀"},
     "env": {FAULT_ENV: "kill_rank1_step6"}, "max_restarts": 1},
    {"name": {"en": "rank 0 killed while writing its second checkpoint",
              "zh": "rank 0 在写第二个检查点时被杀"},
     "env": {FAULT_ENV: "kill_rank0_in_save2"}, "max_restarts": 1},
)

register(Exercise(
    id="lab09.resume", lab=LAB, entry="train", filename="lab09_resume.py", timeout=60,
    title={"en": "2 · Survive a killed rank, end with the same parameters",
           "zh": "2 · 挺过被杀的 rank，最终参数分毫不差"},
    checks=[_check_resume], world_sizes=(2,), consistent_collectives=False, runs=SCENARIOS,
    setup=_setup, explain=_explain_resume))
