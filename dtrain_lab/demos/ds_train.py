"""Lesson 06's DeepSpeed runs: the same model, seed and data under a DeepSpeed engine and under
PyTorch's ``DistributedDataParallel``, and a checkpoint round trip. Called on every rank of a launched
job (:mod:`dtrain_lab.demos.ds_zero`); the mechanism (config, engine, bytes) is in
:mod:`dtrain_lab.parallel.deepspeed_lab`.

* :func:`train` / :func:`train_ddp` — per-step losses and final parameters to compare;
* :func:`train_step` — one optimizer step of an engine (forward, ``engine.backward``, ``engine.step``);
* :func:`checkpoint_roundtrip` — ``engine.save_checkpoint`` / ``load_checkpoint``: which files each
  rank writes (recorded from DeepSpeed's own save calls) and whether a resumed run continues with
  the same loss.
"""
from __future__ import annotations

import contextlib
import io
import os
import shutil
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from dtrain_lab.data import global_batch, regression_dataset, shard
from dtrain_lab.i18n import LabError
from dtrain_lab.jobs import runtime
from dtrain_lab.models import MLP
from dtrain_lab.parallel.deepspeed_lab import config_summary, full_params, initialize, make_config, per_rank_state_bytes

__all__ = ["make_model", "batches", "mean_over_ranks", "train_step", "train", "train_ddp", "compare",
           "checkpoint_roundtrip"]


def make_model(seed: int = 0, d_hidden: int = 32):
    """``MLP(16, d_hidden, 4, depth=2)`` from ``seed``: the model of every run here (1732 parameters at 32)."""
    return MLP(16, d_hidden, 4, depth=2, seed=seed)


def batches(step: int, micro: int, grad_accum: int, seed: int, rank: int, world: int):
    """This rank's shard of the ``grad_accum`` micro-batches of global batch ``step``."""
    data = regression_dataset(n=256, d_in=16, d_out=4, seed=seed)
    for m in range(grad_accum):
        yield shard(global_batch(data, step * grad_accum + m, micro * world), rank, world)


def mean_over_ranks(value: float) -> float:
    """The mean of ``value`` over the ranks (every rank gets it)."""
    # NCCL reduces only GPU tensors; gloo only CPU ones: the runtime's device is the right one
    t = torch.tensor([float(value)], dtype=torch.float64, device=runtime.current().device)
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(t)
        t /= dist.get_world_size()
    return float(t.item())


def train_step(engine, step: int, micro: int, grad_accum: int, seed: int, measure: bool = False):
    """One optimizer step of ``engine`` on global batch ``step`` (``grad_accum`` micro-steps of ``micro``
    samples per rank): forward, ``engine.backward``, ``engine.step``. Returns the loss (mean over ranks
    and micro-steps) and, with ``measure``, :func:`per_rank_state_bytes` (gradients after the last
    backward, the rest after the step)."""
    rt = runtime.current()
    losses, state = [], None
    for x, y in batches(step, micro, grad_accum, seed, rt.rank, rt.world_size):
        x, y = x.to(engine.device), y.to(engine.device)
        out = engine(x.to(next(engine.module.parameters()).dtype))
        loss = F.mse_loss(out.float(), y)
        engine.backward(loss)
        losses.append(loss.item())
        boundary = engine.is_gradient_accumulation_boundary()
        if measure and boundary:
            after_backward = per_rank_state_bytes(engine)
        engine.step()
        if measure and boundary:
            # gradients exist between backward and step; Adam's state is created by the first step
            state = per_rank_state_bytes(engine)
            state["grads"] = after_backward["grads"]
            state["total"] = state["params"] + state["grads"] + state["optimizer"]
    return mean_over_ranks(sum(losses) / len(losses)), state


def train(stage: int = 0, steps: int = 10, seed: int = 0, *, micro_batch: int = 8, grad_accum: int = 1,
          precision: str = "fp32", optimizer: str = "adam", lr: float = 1e-2, clipping: float = 0.0,
          d_hidden: int = 32, offload: str | None = None, **overrides) -> dict:
    """Train :func:`make_model` under a DeepSpeed engine with ZeRO ``stage``; call it on every rank.

    Step ``s`` trains on global batch ``s`` of ``regression_dataset(seed)`` (``micro_batch × world``
    samples per micro-step, each rank its contiguous shard), exactly as :func:`train_ddp`. Returns
    ``loss`` (per step, mean over ranks and micro-steps), ``params`` (final, flattened, gathered),
    ``state_bytes`` (:func:`per_rank_state_bytes`: gradients after the first backward, the rest after the
    first step, when Adam has created its state) and
    ``config`` (:func:`config_summary`), ``engine_config`` (what the engine reports it runs: stage,
    batch sizes, clipping, the optimizer class and the wrapper DeepSpeed put around it), ``step_seconds``
    (median time of a step after the first; it includes the state measurement of step 0 only) and ``engine``.
    """
    rt = runtime.current()
    config = make_config(stage=stage, micro_batch=micro_batch, grad_accum=grad_accum, world_size=rt.world_size,
                         precision=precision, optimizer=optimizer, lr=lr, clipping=clipping, offload=offload,
                         **overrides)
    engine = initialize(make_model(seed, d_hidden), config, device=rt.device)
    losses, state, seconds = [], None, []
    for step in range(steps):
        t0 = time.perf_counter()
        loss, st = train_step(engine, step, micro_batch, grad_accum, seed, measure=step == 0)
        seconds.append(time.perf_counter() - t0)
        losses.append(loss)
        state = state or st
    seen = {"stage": engine.zero_optimization_stage(), "train_batch_size": engine.train_batch_size(),
            "micro": engine.train_micro_batch_size_per_gpu(), "accum": engine.gradient_accumulation_steps(),
            "clipping": engine.gradient_clipping(), "optimizer": type(engine.basic_optimizer).__name__,
            "wrapper": type(engine.optimizer).__name__}
    later = sorted(seconds[1:]) or seconds
    return {"loss": losses, "params": full_params(engine), "state_bytes": state, "config": config_summary(config),
            "engine_config": seen, "step_seconds": later[len(later) // 2], "engine": engine}


def train_ddp(steps: int = 10, seed: int = 0, *, micro_batch: int = 8, grad_accum: int = 1, optimizer: str = "adam",
              lr: float = 1e-2, d_hidden: int = 32) -> dict:
    """The reference: the same model, data and optimizer under ``torch.nn.parallel.DistributedDataParallel``
    (a world of one: the model alone). Returns ``loss`` and ``params`` like :func:`train`."""
    rt = runtime.current()
    model = make_model(seed, d_hidden).to(rt.device)
    net = DistributedDataParallel(model) if dist.is_initialized() and rt.world_size > 1 else model
    opt = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW, "sgd": torch.optim.SGD}.get(optimizer)
    if opt is None:
        raise LabError("ds_bad_choice", name="optimizer", value=optimizer, choices="adam, adamw, sgd")
    opt = opt(model.parameters(), lr=lr)
    losses = []
    for step in range(steps):
        opt.zero_grad(set_to_none=True)
        step_losses = []
        for x, y in batches(step, micro_batch, grad_accum, seed, rt.rank, rt.world_size):
            loss = F.mse_loss(net(x.to(rt.device)), y.to(rt.device))
            (loss / grad_accum).backward()
            step_losses.append(loss.item())
        opt.step()
        losses.append(mean_over_ranks(sum(step_losses) / len(step_losses)))
    params = torch.cat([p.detach().reshape(-1).cpu() for p in model.parameters()]).tolist()
    return {"loss": losses, "params": params}


def compare(a: list[float], b: list[float]) -> dict:
    """``equal`` (bit for bit) and ``max_abs_diff`` of two flat lists of numbers."""
    if len(a) != len(b):
        return {"equal": False, "max_abs_diff": float("inf"), "n": (len(a), len(b))}
    diff = max((abs(x - y) for x, y in zip(a, b)), default=0.0)
    return {"equal": list(a) == list(b), "max_abs_diff": diff, "n": len(a)}


# ------------------------------------------------------------------------------ checkpoints
class _SaveRecorder:
    """Wraps the engine's checkpoint engine: records every path this rank saves, and its size."""

    def __init__(self, engine):
        self.engine, self.inner, self.saved = engine, engine.checkpoint_engine, []

    def __enter__(self):
        inner, saved = self.inner, self.saved
        original = inner.save

        def save(state_dict, path, *args, **kwargs):
            result = original(state_dict, path, *args, **kwargs)
            saved.append(str(path))
            return result

        inner.save = save
        self._original = original
        return self

    def __exit__(self, *exc):
        self.inner.save = self._original


def _shared_tempdir() -> str:
    path = [tempfile.mkdtemp(prefix="dtrain_ds_ckpt_") if not dist.is_initialized() or dist.get_rank() == 0 else None]
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.broadcast_object_list(path, src=0)
    return path[0]


def checkpoint_roundtrip(stage: int = 2, steps_before: int = 3, seed: int = 0, *, ckpt_dir: str | None = None,
                         micro_batch: int = 8, lr: float = 1e-2, keep: bool = False) -> dict:
    """Save after ``steps_before`` steps, take one more step (loss L), then start a *fresh* engine from
    another random initialisation, ``load_checkpoint`` and take that step again (loss L'): a correct
    resume gives L' == L and the same parameters.

    Returns ``files`` (the paths *this* rank saved, relative to the checkpoint directory, recorded from
    DeepSpeed's own save calls), ``sizes`` (bytes of each), ``listing`` (every file in the directory,
    on rank 0), ``tag``, ``next_loss``, ``resumed_loss``, ``params_equal``, ``before_load_differs`` (the fresh
    engine really started elsewhere), ``loaded_equal_saved``, ``client_next_step`` (our ``client_state``
    came back), ``consolidated`` (rank 0, ZeRO ≥ 1: ``zero_to_fp32``'s merged ``state_dict`` keys and
    whether it equals the saved parameters) and ``dir``. The directory is a temporary one unless ``ckpt_dir``;
    it is removed unless ``keep``.
    """
    rt = runtime.current()
    root = ckpt_dir or _shared_tempdir()
    config = make_config(stage=stage, micro_batch=micro_batch, world_size=rt.world_size, lr=lr)
    engine = initialize(make_model(seed), config, device=rt.device)
    for step in range(steps_before):
        train_step(engine, step, micro_batch, 1, seed)
    tag = f"step{steps_before}"
    with _SaveRecorder(engine) as rec:
        engine.save_checkpoint(root, tag=tag, client_state={"next_step": steps_before})
    if dist.is_initialized():
        dist.barrier()
    saved_params = full_params(engine)
    consolidated = None
    if rt.rank == 0 and stage > 0:
        # zero_to_fp32: merge the per-rank ZeRO shards into one ordinary state_dict, in one process
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            sd = get_fp32_state_dict_from_zero_checkpoint(root, tag=tag)   # (its progress bars: on stderr)
        names = [n for n, _ in engine.module.named_parameters()]
        merged = torch.cat([sd[n].float().reshape(-1) for n in names]).tolist()
        consolidated = {"keys": sorted(sd), "equal": merged == saved_params}
    next_loss, _ = train_step(engine, steps_before, micro_batch, 1, seed)
    params_a = full_params(engine)

    fresh = initialize(make_model(seed + 1), config, device=rt.device)
    before = full_params(fresh)
    load_path, client_state = fresh.load_checkpoint(root, tag=None)  # None: the tag in the file 'latest'
    after_load = full_params(fresh)
    resumed_loss, _ = train_step(fresh, int(client_state["next_step"]), micro_batch, 1, seed)
    params_b = full_params(fresh)
    listing = {}
    if rt.rank == 0:
        for path in sorted(Path(root).rglob("*")):
            if path.is_file():
                listing[str(path.relative_to(root))] = path.stat().st_size
    files = [os.path.relpath(p, root) for p in rec.saved]
    out = {"tag": tag, "files": files, "sizes": {f: os.path.getsize(os.path.join(root, f)) for f in files},
           "listing": listing, "next_loss": next_loss, "resumed_loss": resumed_loss,
           "params_equal": params_a == params_b, "params_diff": compare(params_a, params_b)["max_abs_diff"],
           "before_load_differs": before != after_load, "loaded_equal_saved": after_load == saved_params,
           "client_next_step": client_state.get("next_step"), "consolidated": consolidated,
           "load_path": os.path.relpath(load_path, root) if load_path else None, "dir": root, "stage": stage}
    if dist.is_initialized():
        dist.barrier()
    if not keep and ckpt_dir is None and rt.rank == 0:
        shutil.rmtree(root, ignore_errors=True)
    return out
