"""PyTorch FSDP2 (``torch.distributed.fsdp.fully_shard``) the way the course uses it: sharding, counting
the bytes each rank holds, and distributed checkpoints that are never half-written.

FSDP2 replaces every parameter of a sharded module by a :class:`~torch.distributed.tensor.DTensor`
sharded on dim 0 (``Shard(0)``): rank r keeps rows ``torch.chunk(p, N)[r]`` (the last ranks get fewer
rows, or none, when dim 0 does not divide by N). Before a unit's forward its parameters are
all-gathered, after it (``reshard_after_forward=True``) freed again, all-gathered once more in
backward, and the gradients are reduce-scattered (averaged): ZeRO stage 3. The optimizer built on
``model.parameters()`` afterwards sees only the local shards, so its state (Adam's m, v) is sharded
too. Works on CPU with gloo (device mesh ``"cpu"``) and on GPUs with NCCL (mesh ``"cuda"``); the mesh
type follows the process group's backend.

    model = TinyTransformer(seed=0)
    shard_model(model)                         # each Block, then the root
    opt = torch.optim.Adam(model.parameters())  # after sharding: the optimizer sees the shards
    ...
    sharded_state_bytes(model, opt)             # {"params", "grads", "optimizer"} on this rank
    save_checkpoint(model, opt, "ckpt")         # every rank writes its shards (DCP), atomically
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Iterable

import torch
import torch.distributed as dist
import torch.nn as nn

from dtrain_lab.comm import groups
from dtrain_lab.i18n import LabError

__all__ = ["shard_model", "default_units", "make_mesh", "mixed_precision_policy", "sharded_state_bytes",
           "full_state_bytes", "save_checkpoint", "load_checkpoint", "full_state_dict", "checkpoint_complete",
           "PARTIAL_SUFFIX"]

PARTIAL_SUFFIX = ".partial"   # a save in progress (or interrupted) lives in "<path>.partial"
_OLD_SUFFIX = ".old"


def make_mesh(device_type: str | None = None):
    """A 1-D device mesh over every rank: ``"cuda"`` when the process group is NCCL, else ``"cpu"``."""
    from torch.distributed.device_mesh import init_device_mesh

    if device_type is None:
        device_type = "cuda" if dist.get_backend() == "nccl" else "cpu"
    return init_device_mesh(device_type, (groups.size(),))


def mixed_precision_policy(mixed_precision):
    """``None`` → no policy (fp32 everywhere); ``"bf16"`` → compute and all-gather in bf16, reduce
    gradients in fp32; a :class:`MixedPrecisionPolicy` is returned unchanged. The sharded parameters
    the optimizer updates stay in their original dtype (fp32) in every case."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if mixed_precision is None:
        return MixedPrecisionPolicy()
    if isinstance(mixed_precision, MixedPrecisionPolicy):
        return mixed_precision
    if isinstance(mixed_precision, str) and mixed_precision.lower() == "bf16":
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    raise LabError("fsdp_bad_mp", value=mixed_precision)


def _owns_params(module: nn.Module) -> bool:
    return any(True for _ in module.parameters())


def default_units(model: nn.Module) -> list[nn.Module]:
    """The submodules to shard one by one: every :class:`dtrain_lab.models.Block` if the model has
    any; otherwise each child that holds parameters, looking inside ``Sequential``/``ModuleList``
    containers (an :class:`~dtrain_lab.models.MLP` gives its ``Linear`` layers)."""
    from dtrain_lab.models import Block

    blocks = [m for m in model.modules() if isinstance(m, Block)]
    if blocks:
        return blocks
    units: list[nn.Module] = []

    def visit(parent: nn.Module) -> None:
        for child in parent.children():
            if not _owns_params(child):
                continue
            if isinstance(child, (nn.Sequential, nn.ModuleList, nn.ModuleDict)):
                visit(child)
            else:
                units.append(child)

    visit(model)
    return units


def shard_model(model: nn.Module, *, mesh=None, mixed_precision=None, reshard_after_forward: bool | int = True,
                units: Iterable[nn.Module] | None = None) -> nn.Module:
    """Apply FSDP2 in place: ``fully_shard`` each unit (default :func:`default_units`), then the root.

    Each unit is one communication group (one all-gather, one reduce-scatter); the root gathers
    the parameters left over (embeddings, final norm, head). ``mesh`` defaults to :func:`make_mesh`
    (cuda with NCCL, cpu with gloo). ``mixed_precision``: see :func:`mixed_precision_policy`.
    ``reshard_after_forward=True`` frees gathered parameters after each unit's forward (ZeRO-3);
    ``False`` keeps them until backward (ZeRO-2-like memory, one all-gather fewer). Build the
    optimizer *after* this call. Returns ``model`` (now also an ``FSDPModule``).
    """
    from torch.distributed.fsdp import fully_shard

    policy = mixed_precision_policy(mixed_precision)
    mesh = mesh if mesh is not None else make_mesh()
    units = default_units(model) if units is None else list(units)
    inside = {id(m) for m in model.modules()}
    for unit in units:
        if id(unit) not in inside or unit is model:
            raise LabError("fsdp_no_units", name=type(unit).__name__)
    for unit in units:
        fully_shard(unit, mesh=mesh, reshard_after_forward=reshard_after_forward, mp_policy=policy)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard_after_forward, mp_policy=policy)
    return model


# ------------------------------------------------------------------------------------ counting bytes
def sharded_state_bytes(model: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> dict:
    """Bytes of model states this rank holds: ``{"params", "grads", "optimizer"}``.

    Counted tensor by tensor — the local shard of each DTensor (``.to_local()``), a plain tensor
    whole — not the process's memory (RSS). ``optimizer`` counts every tensor in the optimizer's
    state (Adam: ``exp_avg``, ``exp_avg_sq`` and the 4-byte ``step`` per parameter). Gradients are
    counted where they exist (after a backward, before ``zero_grad(set_to_none=True)``).
    Parameters shared by two modules are counted once.
    """
    params = list(model.parameters())  # deduplicated by PyTorch
    out = {"params": sum(groups.nbytes(p) for p in params),
           "grads": sum(groups.nbytes(p.grad) for p in params),
           "optimizer": 0}
    if optimizer is not None:
        for state in optimizer.state.values():
            for value in state.values():
                if isinstance(value, torch.Tensor):
                    out["optimizer"] += groups.nbytes(value)
    return out


def full_state_bytes(model: nn.Module) -> int:
    """Bytes of the full (unsharded) parameters: the global shape of each DTensor × element size."""
    return sum(p.numel() * p.element_size() for p in model.parameters())


# ------------------------------------------------------------------------------------ checkpoints
def _options(**kw):
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(**kw)


def checkpoint_complete(path: str | os.PathLike) -> bool:
    """True when ``path`` is a finished checkpoint: a folder with DCP's ``.metadata`` (written last,
    by the coordinator) that reached its name by the final rename of :func:`save_checkpoint`."""
    p = Path(path)
    return p.is_dir() and (p / ".metadata").is_file() and not p.name.endswith(PARTIAL_SUFFIX)


def save_checkpoint(model: nn.Module, optimizer: torch.optim.Optimizer | None, path: str | os.PathLike) -> Path:
    """Save the sharded model and optimizer with ``torch.distributed.checkpoint``: every rank writes
    only its own shards; call it on every rank.

    Atomic: the ranks write into ``<path>.partial``; after a barrier (every rank's files and DCP's
    ``.metadata`` are written) rank 0 renames it to ``path`` — replacing an older checkpoint there —
    and the other ranks wait at a second barrier. A save interrupted at any point leaves at most a
    ``.partial`` folder, which :func:`load_checkpoint` never reads. Several nodes must share the
    file system (``path`` is one folder seen by every rank).
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    final = Path(path)
    partial = final.with_name(final.name + PARTIAL_SUFFIX)
    if groups.rank() == 0:
        if partial.exists():
            shutil.rmtree(partial)  # an earlier interrupted save
        partial.mkdir(parents=True)
    groups.barrier()
    optimizers = [optimizer] if optimizer is not None else []
    model_sd, optim_sd = get_state_dict(model, optimizers)
    state = {"model": model_sd}
    if optimizer is not None:
        state["optim"] = optim_sd
    dcp.save(state, checkpoint_id=str(partial))
    groups.barrier()
    if groups.rank() == 0:
        old = final.with_name(final.name + _OLD_SUFFIX)
        if final.exists():
            if old.exists():
                shutil.rmtree(old)
            os.replace(final, old)
        os.replace(partial, final)   # the commit: one rename
        if old.exists():
            shutil.rmtree(old)
    groups.barrier()
    return final


def load_checkpoint(model: nn.Module, optimizer: torch.optim.Optimizer | None, path: str | os.PathLike) -> None:
    """Load a checkpoint written by :func:`save_checkpoint` into an already sharded ``model`` (and its
    ``optimizer``), on every rank; the world size may differ from the one that saved (DCP reshards).
    Raises a bilingual :class:`~dtrain_lab.i18n.LabError` if ``path`` is not a complete checkpoint."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    final = Path(path)
    if not checkpoint_complete(final):
        raise LabError("fsdp_no_checkpoint", path=str(final), partial=final.name + PARTIAL_SUFFIX)
    optimizers = [optimizer] if optimizer is not None else []
    model_sd, optim_sd = get_state_dict(model, optimizers)
    state = {"model": model_sd}
    if optimizer is not None:
        state["optim"] = optim_sd
    dcp.load(state, checkpoint_id=str(final))
    set_state_dict(model, optimizers, model_state_dict=state["model"],
                   optim_state_dict=state.get("optim", {}))


def full_state_dict(model: nn.Module) -> dict:
    """The full (unsharded) parameters and buffers, gathered on rank 0 and moved to the CPU; other
    ranks get ``{}``. Call it on every rank (it all-gathers). For comparing with a single process."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    return get_model_state_dict(model, options=_options(full_state_dict=True, cpu_offload=True))
