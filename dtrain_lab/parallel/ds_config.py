"""DeepSpeed configs: a valid config from a few keyword arguments, checked up front with bilingual
errors, and what DeepSpeed's own parser reads from it.

Two facts of DeepSpeed 0.19.8 that decide how it is used here (both checked in its source):

* ``gradient_clipping`` defaults to **1.0** (``runtime/constants.py``); plain PyTorch does not clip.
  :func:`make_config` always writes it (0 = off) so a comparison with DDP is a fair one.
* The optimizer ``"type": "Adam"`` means **AdamW** unless ``"adam_w_mode": false``
  (``engine._configure_basic_optimizer``), and without ``"torch_adam": true`` it is DeepSpeed's
  ``FusedAdam``, a compiled op. :func:`make_config` writes both keys explicitly.
"""
from __future__ import annotations

import copy
import os
from typing import Any

from dtrain_lab.comm import groups
from dtrain_lab.i18n import LabError
from dtrain_lab.parallel.ds_env import cuda_available, fp16_supported, import_deepspeed

__all__ = ["make_config", "config_summary", "deepspeed_view", "STAGES", "PRECISIONS", "OPTIMIZERS", "OFFLOADS"]

STAGES = (0, 1, 2, 3)
PRECISIONS = ("fp32", "bf16", "fp16")
OPTIMIZERS = ("adam", "adamw", "sgd", "fused_adam", "cpu_adam")
OFFLOADS = (None, "cpu")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def make_config(*, stage: int = 0, micro_batch: int = 8, grad_accum: int = 1, world_size: int | None = None,
                precision: str = "fp32", optimizer: str = "adam", lr: float = 1e-2, clipping: float = 0.0,
                offload: str | None = None, checkpoint_dir: str | None = None, train_batch: int | None = None,
                **overrides: Any) -> dict:
    """A DeepSpeed config (a ``dict`` for ``deepspeed.initialize(config=...)``), checked before DeepSpeed sees it.

    * ``stage`` → ``zero_optimization.stage`` (0 = plain data parallelism, 1 = optimizer state,
      2 = + gradients, 3 = + parameters partitioned).
    * ``micro_batch`` → ``train_micro_batch_size_per_gpu``; ``grad_accum`` →
      ``gradient_accumulation_steps``; ``train_batch_size`` = micro × accum × ``world_size`` (default:
      the process group's size). Passing ``train_batch`` too checks the product as DeepSpeed would,
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
    if world_size is None:   # the process group's, or torchrun's before the group is open
        world_size = groups.size() if groups.initialized() else int(os.environ.get("WORLD_SIZE", "1") or 1)
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
    if optimizer == "fused_adam" and not cuda_available():
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
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": cuda_available()}
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
    import_deepspeed()
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
            "offload_optimizer": None if z.offload_optimizer is None else
            str(getattr(z.offload_optimizer.device, "value", z.offload_optimizer.device))}
