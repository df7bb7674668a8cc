"""DeepSpeed on the course's runtime: configs, engines, ZeRO stages 0-3 against DDP, checkpoints (lesson 06).

DeepSpeed wraps a model in an *engine* built from a JSON-like config. The engine owns the
optimizer, the gradient averaging and, with ``zero_optimization.stage`` 1-3, the partitioning of
the optimizer state (1), the gradients (2) and the parameters (3) over the data-parallel ranks
(ZeRO: Rajbhandari et al., SC 2020). This module keeps DeepSpeed's own API and adds what a course
on 2 CPU processes needs:

* :func:`make_config` — a valid config from a few keyword arguments, checked up front with
  bilingual errors (``train_batch_size = micro × accumulation × world size``, unknown stage, fp16
  on a machine that cannot run it, an optimizer that needs a compiled op or a GPU …).
* :func:`initialize` — ``deepspeed.initialize`` on the process group :mod:`dtrain_lab.jobs.runtime`
  already opened (gloo on CPU, nccl on GPUs): DeepSpeed's ``init_distributed`` sees an initialised
  ``torch.distributed`` and reuses it (``deepspeed/comm/comm.py``).
* :func:`train` / :func:`train_ddp` — the same model, seed and data under a DeepSpeed engine and
  under PyTorch's ``DistributedDataParallel``: per-step losses and final parameters to compare.
* :func:`per_rank_state_bytes` — the bytes of model states this rank holds, counted from the
  engine's tensors (parameters, gradients, the optimizer's fp32 partitions and its state), to put
  next to :func:`dtrain_lab.perfmodel.zero_memory`.
* :func:`checkpoint_roundtrip` — ``engine.save_checkpoint`` / ``load_checkpoint``: which files each
  rank writes (recorded from DeepSpeed's own save calls) and whether a resumed run continues with
  the same loss.
* :func:`probe_features` — what DeepSpeed can run on this machine and what needs a GPU or a
  compiled op, detected (no traceback wall).

Two facts of DeepSpeed 0.19.8 that decide how it is used here (both checked in its source):

* ``gradient_clipping`` defaults to **1.0** (``runtime/constants.py``); plain PyTorch does not clip.
  :func:`make_config` always writes it (0 = off) so a comparison with DDP is a fair one.
* The optimizer ``"type": "Adam"`` means **AdamW** unless ``"adam_w_mode": false``
  (``engine._configure_basic_optimizer``), and without ``"torch_adam": true`` it is DeepSpeed's
  ``FusedAdam``, a compiled op. :func:`make_config` writes both keys explicitly.

The first ``deepspeed.initialize`` of a process JIT-compiles a small C++ op (the CPU
shared-memory all-reduce, ``ShareMemCommBuilder``; g++ and 20-60 s). The build is cached in
``TORCH_EXTENSIONS_DIR``, which this module points at ``<checkout>/.torch_extensions`` unless it is
already set (every launched rank imports this module, so they all use the same cache);
``python -m dtrain_lab.parallel.deepspeed_lab --warm`` builds it once (``make env`` does).

Command line::

    python -m dtrain_lab.parallel.deepspeed_lab --warm      # compile/cache the op
    python -m dtrain_lab.parallel.deepspeed_lab --probe     # what this machine can run
"""
from __future__ import annotations

import contextlib
import copy
import io
import logging
import os
import shutil
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any

from dtrain_lab.i18n import LabError, get_lang

STAGES = (0, 1, 2, 3)
PRECISIONS = ("fp32", "bf16", "fp16")
OPTIMIZERS = ("adam", "adamw", "sgd", "fused_adam", "cpu_adam")
OFFLOADS = (None, "cpu")
_REPO = Path(__file__).resolve().parents[2]

__all__ = ["make_config", "deepspeed_view", "initialize", "train", "train_ddp", "per_rank_state_bytes", "checkpoint_roundtrip",
           "probe_features", "extensions_dir", "warm", "count_tensor_bytes", "STAGES", "PRECISIONS", "OPTIMIZERS"]


# ------------------------------------------------------------------------------ environment
def extensions_dir() -> str:
    """Where compiled ops are cached: ``$TORCH_EXTENSIONS_DIR`` if set, else ``<checkout>/.torch_extensions``
    (inside a source checkout; elsewhere torch's default ``~/.cache/torch_extensions``). Sets the
    variable, so that every rank launched from here uses the same cache."""
    current = os.environ.get("TORCH_EXTENSIONS_DIR")
    if current:
        return current
    if (_REPO / "pyproject.toml").is_file() and os.access(_REPO, os.W_OK):
        path = str(_REPO / ".torch_extensions")
        os.environ["TORCH_EXTENSIONS_DIR"] = path
        return path
    return os.path.join(os.path.expanduser("~"), ".cache", "torch_extensions")


def _cuda() -> bool:
    import torch

    try:
        return torch.cuda.is_available() and torch.cuda.device_count() > 0
    except Exception:  # noqa: BLE001 - a broken driver means CPU
        return False


def _quiet_logs() -> None:
    with contextlib.suppress(Exception):
        from deepspeed.utils import logger

        logger.setLevel(logging.WARNING)


def _ds():
    """Import deepspeed the course's way: the cache directory set, the CPU accelerator chosen when the
    runtime trains on the CPU (``DS_ACCELERATOR=cpu``), DeepSpeed's INFO logs silenced."""
    if "deepspeed" not in sys.modules:
        extensions_dir()
        if "DS_ACCELERATOR" not in os.environ:
            device = "cpu"
            with contextlib.suppress(Exception):
                from dtrain_lab.jobs import runtime

                rt = runtime._current
                device = rt.device.type if rt is not None and hasattr(rt.device, "type") else (
                    "cuda" if _cuda() else "cpu")
            if device == "cpu":
                os.environ["DS_ACCELERATOR"] = "cpu"
    import deepspeed

    _quiet_logs()
    _skip_shm_op_without_compiler(deepspeed)
    # torch 2.13 marks the collectives ZeRO calls (all_gather_into_tensor, reduce_scatter_tensor) as
    # deprecated and warns on every call: one line per step per rank would bury the lesson's output
    warnings.filterwarnings("ignore", message=r"`torch\.distributed\.\w+` is deprecated", category=FutureWarning)
    return deepspeed


def _has_compiler() -> bool:
    return shutil.which(os.environ.get("CXX", "g++") or "g++") is not None and shutil.which("ninja") is not None


def _skip_shm_op_without_compiler(deepspeed) -> None:
    """Without g++/ninja the CPU accelerator's shared-memory op cannot be built, and DeepSpeed's
    ``init_distributed`` would fail trying. That op only serves ``inference_all_reduce``; training
    collectives go through torch.distributed either way. So when it cannot be built (and is not in
    the cache), mark it incompatible in DeepSpeed's own table of ops (``deepspeed.ops.__compatible_ops__``,
    a module-level dict meant to persist edits) and DeepSpeed skips it."""
    if getattr(_skip_shm_op_without_compiler, "done", False):
        return
    _skip_shm_op_without_compiler.done = True  # type: ignore[attr-defined]
    with contextlib.suppress(Exception):
        from deepspeed.accelerator import get_accelerator

        builder = get_accelerator().create_op_builder("ShareMemCommBuilder")
        if builder is None or _has_compiler() or any(Path(extensions_dir()).glob(f"{builder.NAME}/*.so")):
            return
        deepspeed.ops.__compatible_ops__[builder.NAME] = False


# ------------------------------------------------------------------------------ config
def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def fp16_supported() -> bool:
    """True where DeepSpeed accepts ``fp16``: a CUDA GPU, or a CPU whose oneDNN has fp16 kernels (the
    CPU accelerator's own test, ``torch.ops.mkldnn._is_mkldnn_fp16_supported``)."""
    if _cuda():
        return True
    import torch

    try:
        return bool(torch.ops.mkldnn._is_mkldnn_fp16_supported())
    except Exception:  # noqa: BLE001
        return False


def make_config(*, stage: int = 0, micro_batch: int = 8, grad_accum: int = 1, world_size: int | None = None,
                precision: str = "fp32", optimizer: str = "adam", lr: float = 1e-2, clipping: float = 0.0,
                offload: str | None = None, checkpoint_dir: str | None = None, train_batch: int | None = None,
                **overrides: Any) -> dict:
    """A DeepSpeed config (a ``dict`` for ``deepspeed.initialize(config=...)``), checked before DeepSpeed sees it.

    * ``stage`` → ``zero_optimization.stage`` (0 = plain data parallelism, 1 = optimizer state,
      2 = + gradients, 3 = + parameters partitioned).
    * ``micro_batch`` → ``train_micro_batch_size_per_gpu``; ``grad_accum`` →
      ``gradient_accumulation_steps``; ``train_batch_size`` = micro × accum × ``world_size`` (default:
      the runtime's world size). Passing ``train_batch`` too checks the product as DeepSpeed would,
      with a readable error.
    * ``precision``: ``"fp32"``, ``"bf16"`` (``bf16.enabled``) or ``"fp16"`` (``fp16.enabled``, dynamic
      loss scaling; refused where this machine cannot run fp16).
    * ``optimizer``: ``"adam"`` / ``"adamw"`` — PyTorch's ``torch.optim.Adam`` / ``AdamW`` (``torch_adam``,
      ``adam_w_mode`` written explicitly); ``"sgd"`` — ``torch.optim.SGD``; ``"fused_adam"`` — DeepSpeed's
      FusedAdam (a compiled op; CUDA); ``"cpu_adam"`` — DeepSpeed's CPU Adam for ``offload="cpu"`` (compiled);
      ``None`` — no ``optimizer`` key: the code passes its own (``initialize(..., client_optimizer=...)``).
    * ``clipping`` → ``gradient_clipping`` (DeepSpeed's default is 1.0; here 0.0 = off unless asked).
    * ``offload="cpu"`` → ``zero_optimization.offload_optimizer = {"device": "cpu"}`` (stage ≥ 1);
      with a PyTorch optimizer DeepSpeed then requires ``zero_force_ds_cpu_optimizer: false``, written here.
    * ``checkpoint_dir`` is not a DeepSpeed key: it is kept under ``"dtrain_lab"`` and removed by :func:`initialize`.
    * ``**overrides`` are merged last, recursively (e.g. ``zero_optimization={"overlap_comm": True}``).
    """
    if not _is_int(stage) or stage not in STAGES:
        raise LabError("ds_bad_stage", value=stage)
    for name, value in (("micro_batch", micro_batch), ("grad_accum", grad_accum)):
        if not _is_int(value) or value < 1:
            raise LabError("ds_bad_positive_int", name=name, value=value)
    if world_size is None:
        from dtrain_lab.jobs import runtime

        world_size = runtime._current.world_size if runtime._current is not None else int(
            os.environ.get("WORLD_SIZE", "1") or 1)
    if not _is_int(world_size) or world_size < 1:
        raise LabError("ds_bad_positive_int", name="world_size", value=world_size)
    expected = micro_batch * grad_accum * world_size
    if train_batch is not None and train_batch != expected:
        raise LabError("ds_batch_mismatch", train=train_batch, micro=micro_batch, accum=grad_accum,
                       world=world_size, product=expected)
    if precision not in PRECISIONS:
        raise LabError("ds_bad_choice", name="precision", value=precision, choices=", ".join(PRECISIONS))
    if optimizer is not None and optimizer not in OPTIMIZERS:
        raise LabError("ds_bad_choice", name="optimizer", value=optimizer, choices=", ".join(OPTIMIZERS))
    if offload not in OFFLOADS:
        raise LabError("ds_bad_choice", name="offload", value=offload, choices="None, 'cpu'")
    try:
        lr_ok = float(lr) > 0 and float(lr) < float("inf")
        clip_ok = float(clipping) >= 0 and float(clipping) < float("inf")
    except (TypeError, ValueError):
        lr_ok = clip_ok = False
    if not lr_ok or isinstance(lr, bool):
        raise LabError("ds_bad_number", name="lr", value=lr, rule="> 0")
    if not clip_ok or isinstance(clipping, bool):
        raise LabError("ds_bad_number", name="clipping", value=clipping, rule="≥ 0 (0 = off)")
    if offload is not None and stage == 0:
        raise LabError("ds_offload_needs_zero", stage=stage)
    if precision == "fp16" and not fp16_supported():
        raise LabError("ds_no_fp16")
    if optimizer == "fused_adam" and not _cuda():
        raise LabError("ds_no_fused_adam")
    if optimizer == "cpu_adam" and offload != "cpu":
        raise LabError("ds_cpu_adam_needs_offload")

    if optimizer is None:  # the optimizer comes from the code: initialize(..., client_optimizer=...)
        opt = None
    elif optimizer == "sgd":
        opt = {"type": "SGD", "params": {"lr": float(lr)}}
    elif optimizer in ("adam", "adamw"):
        opt = {"type": "Adam" if optimizer == "adam" else "AdamW",
               "params": {"lr": float(lr), "torch_adam": True, "adam_w_mode": optimizer == "adamw"}}
    else:  # DeepSpeed's own Adam kernels: FusedAdam (GPU) or CPU Adam (with offload), both compiled ops
        opt = {"type": "Adam", "params": {"lr": float(lr), "adam_w_mode": False}}
    zero: dict[str, Any] = {"stage": stage}
    if offload == "cpu":
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": _cuda()}
    config: dict[str, Any] = {
        "train_batch_size": expected,
        "train_micro_batch_size_per_gpu": micro_batch,
        "gradient_accumulation_steps": grad_accum,
        "gradient_clipping": float(clipping),
        "zero_optimization": zero,
        "steps_per_print": 10 ** 9,
        "wall_clock_breakdown": False,
    }
    if opt is not None:
        config["optimizer"] = opt
    if precision == "bf16":
        config["bf16"] = {"enabled": True}
    elif precision == "fp16":
        config["fp16"] = {"enabled": True, "loss_scale": 0, "initial_scale_power": 16}
    if offload == "cpu" and optimizer != "cpu_adam":
        config["zero_force_ds_cpu_optimizer"] = False   # a PyTorch optimizer with offload: allowed, slower
    if optimizer == "sgd" and stage > 0:
        config["zero_allow_untested_optimizer"] = True  # ZeRO lists Adam/AdamW/Adagrad as tested, not SGD
    if checkpoint_dir is not None:
        config["dtrain_lab"] = {"checkpoint_dir": str(checkpoint_dir)}
    _merge(config, overrides)
    return config


def _merge(base: dict, extra: dict) -> None:
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            _merge(base[key], value)
        else:
            base[key] = copy.deepcopy(value)


def config_summary(config: dict) -> dict:
    """The few keys that decide what a config does, flattened (for a table in the lesson)."""
    zero = config.get("zero_optimization", {})
    precision = "fp16" if config.get("fp16", {}).get("enabled") else (
        "bf16" if config.get("bf16", {}).get("enabled") else "fp32")
    return {"stage": zero.get("stage", 0), "train_batch_size": config.get("train_batch_size"),
            "micro": config.get("train_micro_batch_size_per_gpu"), "accum": config.get("gradient_accumulation_steps"),
            "precision": precision, "optimizer": config.get("optimizer", {}).get("type"),
            "clipping": config.get("gradient_clipping", 1.0),
            "offload": (zero.get("offload_optimizer") or {}).get("device")}


def deepspeed_view(config: dict) -> dict:
    """What DeepSpeed's own parser (``deepspeed.runtime.config.DeepSpeedConfig``) reads from ``config``:
    batch sizes, ZeRO stage and its defaults (``overlap_comm``, ``contiguous_gradients``, bucket sizes),
    clipping, precision, optimizer. The world size is this process's (1 in a notebook kernel: give
    ``make_config(world_size=1)``). A config DeepSpeed rejects raises a bilingual ``LabError`` quoting it."""
    _ds()
    from deepspeed.runtime.config import DeepSpeedConfig

    config = {k: v for k, v in copy.deepcopy(config).items() if k != "dtrain_lab"}
    try:
        c = DeepSpeedConfig(config)
    except (AssertionError, ValueError) as exc:
        raise LabError("ds_rejected", detail=str(exc).splitlines()[0][:300]) from None
    z = c.zero_config
    return {"train_batch_size": c.train_batch_size, "micro": c.train_micro_batch_size_per_gpu,
            "accum": c.gradient_accumulation_steps, "world_size": c.world_size, "stage": int(c.zero_optimization_stage),
            "gradient_clipping": c.gradient_clipping, "optimizer": c.optimizer_name,
            "optimizer_params": c.optimizer_params, "bf16": bool(c.bfloat16_config.enabled),
            "fp16": bool(c.float16_config.enabled), "overlap_comm": z.overlap_comm,
            "contiguous_gradients": z.contiguous_gradients, "reduce_bucket_size": int(z.reduce_bucket_size),
            "allgather_bucket_size": int(z.allgather_bucket_size),
            "offload_optimizer": None if z.offload_optimizer is None else str(getattr(z.offload_optimizer.device, "value", z.offload_optimizer.device))}


# ------------------------------------------------------------------------------ what needs a GPU
def _why(feature: str, lang: str | None = None) -> str:
    """Why ``feature`` ("fp16", "fused_adam", "cpu_adam") is not usable here, in the learner's language."""
    from dtrain_lab.i18n import tr

    key = {"fp16": "ds_no_fp16", "fused_adam": "ds_no_fused_adam", "cpu_adam": "ds_why_cpu_adam"}[feature]
    return tr(key, lang)


def probe_features(lang: str | None = None) -> list[dict]:
    """What DeepSpeed can do on this machine, found by asking DeepSpeed and torch (nothing compiled).

    One row per feature: ``feature``, ``ok`` (usable now, without compiling anything), ``detail``
    (in the learner's language). Checks: the accelerator DeepSpeed picked and its communication
    backend, bf16 and fp16 support, whether each compiled op (FusedAdam, CPU Adam, the shared-memory
    all-reduce) is prebuilt, already in the JIT cache, or would need a compile (and whether g++/ninja
    exist), and whether a CUDA GPU is present for NCCL/offload.
    """
    deepspeed = _ds()
    from deepspeed.accelerator import get_accelerator
    from deepspeed.git_version_info import installed_ops

    from dtrain_lab.i18n import tr

    zh = (lang or get_lang()) == "zh"
    acc = get_accelerator()
    rows = [{"feature": "accelerator", "ok": True,
             "detail": f"{acc._name} / {acc.communication_backend_name()} (DeepSpeed {deepspeed.__version__})"}]
    rows.append({"feature": "bf16", "ok": bool(acc.is_bf16_supported()),
                 "detail": "bf16.enabled" + (" 可用" if zh else " works") if acc.is_bf16_supported() else "—"})
    ok16 = fp16_supported()
    rows.append({"feature": "fp16", "ok": ok16, "detail": ("fp16.enabled" + (" 可用" if zh else " works"))
                 if ok16 else _why("fp16", lang)})
    compiler = _has_compiler()
    cache = Path(extensions_dir())
    for op_class, name in (("FusedAdamBuilder", "fused_adam"), ("CPUAdamBuilder", "cpu_adam"),
                           ("ShareMemCommBuilder", "shm_comm")):
        try:
            builder = acc.create_op_builder(op_class)
        except Exception:  # noqa: BLE001
            builder = None
        if builder is None:
            rows.append({"feature": name, "ok": False, "detail": "不适用于此加速器" if zh else "n/a on this accelerator"})
            continue
        prebuilt = bool(installed_ops.get(builder.NAME, False))
        cached = any(cache.glob(f"**/{builder.NAME}*.so"))
        if prebuilt or cached:
            detail = ("已预编译" if prebuilt else f"已在缓存中（{cache}）") if zh else (
                "prebuilt" if prebuilt else f"in the JIT cache ({cache})")
            rows.append({"feature": name, "ok": True, "detail": detail})
            continue
        if name == "cpu_adam" or (name == "fused_adam" and not _cuda()):
            detail = _why(name, lang)
        else:
            detail = tr("ds_compiled_on_first_use", lang)
        if not compiler:
            detail += "；未找到 g++/ninja" if zh else "; g++/ninja not found"
        rows.append({"feature": name, "ok": False, "detail": detail})
    gpu = _cuda()
    rows.append({"feature": "nccl", "ok": gpu, "detail": ("有 CUDA GPU" if gpu else "没有 CUDA GPU：用 gloo")
                 if zh else ("CUDA GPUs present" if gpu else "no CUDA GPU: gloo")})
    return rows


# ------------------------------------------------------------------------------ engine
def initialize(model, config: dict, *, client_optimizer=None, model_parameters=None):
    """``deepspeed.initialize`` on the runtime's process group; returns the engine.

    The runtime (:func:`dtrain_lab.jobs.runtime.current`) opens ``torch.distributed`` first (gloo on the
    CPU, nccl with one GPU per rank) and moves nothing; here the model goes to the runtime's device and
    DeepSpeed's ``init_distributed(dist_backend=...)`` finds the group initialised and wraps it
    (``dist_init_required=False``: it must not open a second one). ``client_optimizer`` (a
    ``torch.optim.Optimizer`` or a callable ``params -> optimizer``) replaces the config's optimizer.
    Errors DeepSpeed raises for a feature this machine lacks are turned into a bilingual
    :class:`~dtrain_lab.i18n.LabError`.
    """
    import torch.distributed as dist

    from dtrain_lab.jobs import runtime

    rt = runtime.current()
    if not isinstance(config, dict):
        raise LabError("ds_bad_choice", name="config", value=type(config).__name__, choices="dict (make_config)")
    config = copy.deepcopy(config)
    config.pop("dtrain_lab", None)
    deepspeed = _ds()
    from deepspeed.accelerator import get_accelerator

    backend = rt.backend if rt.backend in ("gloo", "nccl") else get_accelerator().communication_backend_name()
    sink = io.StringIO()  # DeepSpeed prints "... built successfully" each time it loads its op
    if not dist.is_initialized():
        # a world of one (notebook kernel, plain python): DeepSpeed needs the torchrun variables
        for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1")):
            os.environ.setdefault(key, value)
        if "MASTER_PORT" not in os.environ:
            import socket

            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                os.environ["MASTER_PORT"] = str(s.getsockname()[1])
        with contextlib.redirect_stdout(sink):
            deepspeed.init_distributed(dist_backend=backend, verbose=False)
    else:
        with contextlib.redirect_stdout(sink):
            deepspeed.init_distributed(dist_backend=backend, dist_init_required=False, verbose=False)
    for line in sink.getvalue().splitlines():
        if "built successfully" not in line:
            print(line)
    model = model.to(rt.device)
    params = model_parameters if model_parameters is not None else [p for p in model.parameters() if p.requires_grad]
    try:
        engine, *_ = deepspeed.initialize(model=model, optimizer=client_optimizer, model_parameters=params,
                                          config=config, dist_init_required=False)
    except Exception as exc:  # noqa: BLE001
        translated = _translate(exc)
        if translated is None:
            raise
        raise translated from exc
    return engine


def _translate(exc: BaseException) -> LabError | None:
    text = str(exc)
    if "fp16 is not supported" in text:
        return LabError("ds_no_fp16")
    if "ZeRO-Offload with a client provided optimizer" in text:
        return LabError("ds_offload_client_optimizer")
    if "Unable to JIT load" in text or "ninja" in text.lower() and "not" in text.lower():
        return LabError("ds_op_build_failed", detail=text.splitlines()[0][:300])
    if "incompatible with pipeline" in text:
        return LabError("ds_pipeline_zero")
    return None


# ------------------------------------------------------------------------------ bytes
def _intervals(tensors) -> list[tuple[int, int]]:
    spans = []
    for t in tensors:
        if t is None or not hasattr(t, "data_ptr") or t.numel() == 0:
            continue
        start = t.data_ptr()
        spans.append((start, start + t.numel() * t.element_size()))
    return spans


def _union(spans: list[tuple[int, int]]) -> int:
    total, end = 0, None
    for a, b in sorted(spans):
        if end is None or a >= end:
            total += b - a
            end = b
        elif b > end:
            total += b - end
            end = b
    return total


def count_tensor_bytes(tensors) -> int:
    """Bytes of memory the tensors occupy, each byte counted once (views and aliases overlap)."""
    return _union(_intervals(tensors))


def _flatten(items) -> list:
    out = []
    for item in items:
        out.extend(_flatten(item) if isinstance(item, (list, tuple)) else [item])
    return out


def _grad_tensors(engine, opt) -> list:
    out = [p.grad for p in engine.module.parameters()]
    for name in ("grads_in_partition", "grad_partitions_flat_buffer"):
        out.append(getattr(opt, name, None))
    out.extend(_flatten(getattr(opt, "fp32_groups_gradients_flat", []) or []))
    avg = getattr(opt, "averaged_gradients", None)
    if isinstance(avg, dict):
        for value in avg.values():
            out.extend(value if isinstance(value, (list, tuple)) else [value])
    for group in getattr(opt, "single_partition_of_fp32_groups", []) or []:
        out.append(getattr(group, "grad", None))
    for group in getattr(opt, "fp32_partitioned_groups_flat", []) or []:
        out.append(getattr(group, "grad", None))
    return [t for t in out if t is not None and hasattr(t, "data_ptr")]


def per_rank_state_bytes(engine) -> dict:
    """Bytes of model states this rank holds now, counted from the engine's tensors.

    * ``params`` — the parameters this rank stores: every full parameter for stages 0-2, only this
      rank's partition (``param.ds_tensor``) for stage 3;
    * ``grads`` — gradient memory (``param.grad`` and the ZeRO optimizer's gradient partitions);
      meaningful after ``backward`` and before ``step`` (``step`` frees them);
    * ``optimizer`` — the optimizer's fp32 partitions where they are memory of their own (DeepSpeed
      0.19.8's ZeRO optimizers clone this rank's slice, stages 1-3, even for an fp32 model; a copy
      that aliased the parameters would add nothing) plus the optimizer's state tensors (Adam's
      ``exp_avg``/``exp_avg_sq``; the 0-d ``step`` counters left out);
    * ``total`` — the sum of the three (each byte counted once: views and aliases overlap);
      ``numel`` — parameters in the model; ``master_bytes``, ``state_bytes`` — the two parts of
      ``optimizer``; ``master_is_params`` — the fp32 partitions are the parameters' own memory.

    Temporary communication buffers (buckets) are not model states and are not counted.
    """
    import torch

    opt = engine.optimizer
    stage = engine.zero_optimization_stage()
    module_params = list(engine.module.parameters())
    if stage == 3:
        param_tensors = [getattr(p, "ds_tensor", None) for p in module_params]
        numel = sum(int(getattr(p, "ds_numel", p.numel())) for p in module_params)
    else:
        param_tensors = [p.data for p in module_params]
        numel = sum(p.numel() for p in module_params)
    masters = []   # ZeRO 1-2, ZeRO 3, BF16_Optimizer, FP16_Optimizer, FP16_UnfusedOptimizer (stage 0, 16-bit)
    for name in ("single_partition_of_fp32_groups", "fp32_partitioned_groups_flat", "fp32_groups_flat_partition",
                 "fp32_groups_flat", "fp32_groups"):
        masters.extend(_flatten(getattr(opt, name, []) or []))
    inner = getattr(opt, "optimizer", opt)  # ZeRO wraps the torch optimizer; stage 0 is the optimizer itself
    states = []
    for state in getattr(inner, "state", {}).values():
        for key, value in state.items():
            if isinstance(value, torch.Tensor) and key != "step" and value.dim() > 0:
                states.append(value)
    p_spans = _intervals(param_tensors)
    g_spans = _intervals(_grad_tensors(engine, opt))
    o_spans = _intervals(masters + states)
    params_b = _union(p_spans)
    grads_b = _union(p_spans + g_spans) - params_b
    optim_b = _union(p_spans + g_spans + o_spans) - params_b - grads_b
    return {"params": params_b, "grads": grads_b, "optimizer": optim_b, "total": params_b + grads_b + optim_b,
            "numel": numel, "stage": stage, "master_bytes": count_tensor_bytes(masters),
            "state_bytes": count_tensor_bytes(states),
            "master_is_params": bool(masters) and _union(p_spans + _intervals(masters)) == params_b}


# ------------------------------------------------------------------------------ training
def make_model(seed: int = 0, d_hidden: int = 32):
    """``MLP(16, d_hidden, 4, depth=2)`` from ``seed``: the model of every run here (1732 parameters at 32)."""
    from dtrain_lab.models import MLP

    return MLP(16, d_hidden, 4, depth=2, seed=seed)


def _batches(step: int, micro: int, grad_accum: int, seed: int, rank: int, world: int):
    from dtrain_lab.data import global_batch, regression_dataset, shard

    data = regression_dataset(n=256, d_in=16, d_out=4, seed=seed)
    for m in range(grad_accum):
        yield shard(global_batch(data, step * grad_accum + m, micro * world), rank, world)


def _mean_over_ranks(value: float) -> float:
    import torch
    import torch.distributed as dist

    from dtrain_lab.jobs import runtime

    # NCCL reduces only GPU tensors; gloo only CPU ones: the runtime's device is the right one
    t = torch.tensor([float(value)], dtype=torch.float64, device=runtime.current().device)
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(t)
        t /= dist.get_world_size()
    return float(t.item())


def full_params(engine_or_model) -> list[float]:
    """Every parameter, flattened in registration order, as full tensors (ZeRO-3 partitions gathered)."""
    import torch

    module = getattr(engine_or_model, "module", engine_or_model)
    params = list(module.parameters())
    if any(hasattr(p, "ds_id") for p in params):
        import deepspeed

        with deepspeed.zero.GatheredParameters(params):
            return torch.cat([p.detach().float().reshape(-1).cpu() for p in params]).tolist()
    return torch.cat([p.detach().float().reshape(-1).cpu() for p in params]).tolist()


def train_step(engine, step: int, micro: int, grad_accum: int, seed: int, measure: bool = False):
    """One optimizer step of ``engine`` on global batch ``step`` (``grad_accum`` micro-steps of ``micro``
    samples per rank): forward, ``engine.backward``, ``engine.step``. Returns the loss (mean over ranks
    and micro-steps) and, with ``measure``, :func:`per_rank_state_bytes` (gradients after the last
    backward, the rest after the step)."""
    import torch.nn.functional as F

    from dtrain_lab.jobs import runtime

    rt = runtime.current()
    losses, state = [], None
    for x, y in _batches(step, micro, grad_accum, seed, rt.rank, rt.world_size):
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
    return _mean_over_ranks(sum(losses) / len(losses)), state


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
    from dtrain_lab.jobs import runtime

    rt = runtime.current()
    config = make_config(stage=stage, micro_batch=micro_batch, grad_accum=grad_accum, world_size=rt.world_size,
                         precision=precision, optimizer=optimizer, lr=lr, clipping=clipping, offload=offload,
                         **overrides)
    engine = initialize(make_model(seed, d_hidden), config)
    import time

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
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel

    from dtrain_lab.jobs import runtime

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
        for x, y in _batches(step, micro_batch, grad_accum, seed, rt.rank, rt.world_size):
            loss = F.mse_loss(net(x.to(rt.device)), y.to(rt.device))
            (loss / grad_accum).backward()
            step_losses.append(loss.item())
        opt.step()
        losses.append(_mean_over_ranks(sum(step_losses) / len(step_losses)))
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
    import torch.distributed as dist

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
    import torch.distributed as dist

    from dtrain_lab.jobs import runtime

    rt = runtime.current()
    root = ckpt_dir or _shared_tempdir()
    config = make_config(stage=stage, micro_batch=micro_batch, world_size=rt.world_size, lr=lr)
    engine = initialize(make_model(seed), config)
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
        import torch
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            sd = get_fp32_state_dict_from_zero_checkpoint(root, tag=tag)   # (its progress bars: on stderr)
        names = [n for n, _ in engine.module.named_parameters()]
        merged = torch.cat([sd[n].float().reshape(-1) for n in names]).tolist()
        consolidated = {"keys": sorted(sd), "equal": merged == saved_params}
    next_loss, _ = train_step(engine, steps_before, micro_batch, 1, seed)
    params_a = full_params(engine)

    fresh = initialize(make_model(seed + 1), config)
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


# ------------------------------------------------------------------------------ warm-up
def warm(verbose: bool = True) -> dict:
    """Compile (or find in the cache) the op ``deepspeed.init_distributed`` needs on this accelerator."""
    import time

    deepspeed = _ds()
    from deepspeed.accelerator import get_accelerator

    t0 = time.time()
    acc = get_accelerator()
    builder = acc.create_op_builder("ShareMemCommBuilder")
    built = None
    if builder is not None and deepspeed.ops.__compatible_ops__.get(builder.NAME, False):
        sink = io.StringIO()
        with contextlib.redirect_stdout(sink):
            builder.load(verbose=False)
        built = builder.NAME
    info = {"accelerator": acc._name, "op": built, "cache": extensions_dir(), "seconds": round(time.time() - t0, 1)}
    if verbose:
        zh = get_lang() == "zh"
        if built:
            print((f"DeepSpeed 算子 {built} 已就绪（缓存目录 {info['cache']}，用时 {info['seconds']} 秒）" if zh else
                   f"DeepSpeed op {built} ready (cache {info['cache']}, {info['seconds']} s)"), flush=True)
        else:
            print(("这个加速器不需要预编译算子" if zh else "nothing to compile on this accelerator") +
                  f" ({acc._name})", flush=True)
    return info


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m dtrain_lab.parallel.deepspeed_lab",
                                 description="DeepSpeed helpers of dtrain-lab / dtrain-lab 的 DeepSpeed 工具")
    ap.add_argument("--warm", action="store_true", help="compile/cache DeepSpeed's op once / 预先编译并缓存算子")
    ap.add_argument("--probe", action="store_true", help="what this machine can run / 本机能跑什么")
    args = ap.parse_args(argv)
    if args.warm:
        warm()
    if args.probe:
        for row in probe_features():
            print(f"{'✓' if row['ok'] else '✗'} {row['feature']:<12} {row['detail']}")
    if not (args.warm or args.probe):
        ap.print_help()
    return 0


if __name__ == "__main__":
    sys.exit(main())
