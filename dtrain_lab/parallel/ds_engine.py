"""A DeepSpeed engine on the course's process group, the model states it holds, and its parameters.

* :func:`initialize` — ``deepspeed.initialize`` on the process group the launcher already opened
  (gloo on CPU, nccl on GPUs): DeepSpeed's ``init_distributed`` sees an initialised
  ``torch.distributed`` and reuses it (``deepspeed/comm/comm.py``).
* :func:`per_rank_state_bytes` — the bytes of model states this rank holds, counted from the engine's
  tensors (parameters, gradients, the optimizer's fp32 partitions and its state), to put next to
  :func:`dtrain_lab.perfmodel.zero_memory`.
* :func:`full_params` — every parameter as a full tensor (ZeRO-3 partitions gathered).
"""
from __future__ import annotations

import contextlib
import copy
import io
import os

import torch
import torch.distributed as dist

from dtrain_lab.comm import groups
from dtrain_lab.i18n import LabError
from dtrain_lab.parallel.ds_env import cuda_available, import_deepspeed

__all__ = ["initialize", "default_device", "per_rank_state_bytes", "count_tensor_bytes", "full_params"]


def default_device() -> torch.device:
    """The device of this process: its GPU under an NCCL process group (``cuda:LOCAL_RANK``, set by
    the launcher), the CPU under gloo; with no process group, a GPU if there is one."""
    if groups.initialized():
        return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    return torch.device("cuda" if cuda_available() else "cpu")


def initialize(model, config: dict, *, client_optimizer=None, model_parameters=None, device=None):
    """``deepspeed.initialize`` on the process group already open; returns the engine.

    The launcher's runtime opens ``torch.distributed`` first (gloo on the CPU, nccl with one GPU per
    rank); here the model goes to ``device`` (default :func:`default_device`) and DeepSpeed's
    ``init_distributed(dist_backend=...)`` finds the group initialised and wraps it
    (``dist_init_required=False``: it must not open a second one). With no process group (a notebook
    kernel) DeepSpeed opens a world of one. ``client_optimizer`` (a ``torch.optim.Optimizer`` or a
    callable ``params -> optimizer``) replaces the config's optimizer. Errors DeepSpeed raises for a
    feature this machine lacks are turned into a bilingual :class:`~dtrain_lab.i18n.LabError`.
    """
    if not isinstance(config, dict):
        raise LabError("ds_bad_choice", name="config", value=type(config).__name__, choices="dict (make_config)")
    config = copy.deepcopy(config)
    config.pop("dtrain_lab", None)
    device = torch.device(device) if device is not None else default_device()
    deepspeed = import_deepspeed(device.type)
    if groups.initialized():
        backend = dist.get_backend()
    else:
        backend = "nccl" if device.type == "cuda" else "gloo"
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
    model = model.to(device)
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


def full_params(engine_or_model) -> list[float]:
    """Every parameter, flattened in registration order, as full tensors (ZeRO-3 partitions gathered)."""
    module = getattr(engine_or_model, "module", engine_or_model)
    params = list(module.parameters())
    if any(hasattr(p, "ds_id") for p in params):
        deepspeed = import_deepspeed()
        with deepspeed.zero.GatheredParameters(params):
            return torch.cat([p.detach().float().reshape(-1).cpu() for p in params]).tolist()
    return torch.cat([p.detach().float().reshape(-1).cpu() for p in params]).tolist()
