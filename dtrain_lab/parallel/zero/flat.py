"""The flat, padded buffer that ZeRO shards, and the pieces of it this rank's optimizer updates.

All parameters, in order, are laid end to end in one buffer padded with zeros to a multiple of N; rank
r owns the contiguous slice ``[r·S, (r+1)·S)`` with ``S = ceil(P / N)``. The slice is cut at parameter
boundaries into *pieces*, one per parameter it overlaps, and the wrapped ``torch.optim`` optimizer gets
one tensor per piece (views into the slice, or into its fp32 master copy). That is what lets a sharded
step skip a parameter exactly as ``torch.optim`` does: a parameter that got no gradient this step
(frozen, or not used) hands its pieces ``grad = None``, and the optimizer leaves them and their state
alone — no weight decay, no momentum, no step count. The padding belongs to no piece: it holds no
optimizer state.
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn as nn

from dtrain_lab.comm import groups
from dtrain_lab.comm.counted import Comm
from dtrain_lab.comm.groups import Group
from dtrain_lab.i18n import LabError

LOW_PRECISION = (torch.bfloat16, torch.float16)
COUNTED = ("all_reduce", "reduce_scatter", "all_gather", "reduce")


def group_rank_size(process_group: Group) -> tuple[int, int]:
    """(rank, world size) in ``process_group``; (0, 1) outside a job, where a group makes no sense."""
    if process_group is not None and not groups.initialized():
        raise LabError("zero_opt_no_process_group")
    return groups.rank_size(process_group)


def check_params(params: list[torch.Tensor], what: str) -> list[torch.Tensor]:
    """One flat buffer needs: at least one tensor, each once, one dtype, one device."""
    if not params or not all(isinstance(p, torch.Tensor) for p in params):
        raise LabError("zero_opt_bad_params", what=what)
    if len({id(p) for p in params}) != len(params):
        raise LabError("zero_opt_shared_params", what=what)
    dtypes = {p.dtype for p in params}
    devices = {p.device for p in params}
    if len(dtypes) > 1 or len(devices) > 1:
        raise LabError("zero_opt_mixed_dtypes", dtypes=sorted(map(str, dtypes | devices)))
    return params


class FlatShard:
    """One flat, padded buffer over ``params`` and this rank's slice of it.

    * ``full``: ``N·S`` elements in the params' dtype; the params are views into it.
    * ``shard``: ``full[r·S:(r+1)·S]`` (stages 1/2) or a separate persistent tensor (stage 3).
    * ``master``: what the optimizer updates — ``shard`` itself for fp32, an fp32 copy otherwise.
    * ``pieces``: ``(i, a, b)`` — ``shard[a:b]`` holds elements of ``params[i]``; ``piece_params``: one
      leaf tensor per piece, a view of ``master[a:b]`` (updating it updates the slice in place).
    * ``had_grad[i]``: whether ``params[i]`` got a gradient since the last ``zero_grad``.
    """

    def __init__(self, params: list[torch.Tensor], rank: int, world_size: int, *, keep_full: bool):
        self.params = params
        self.dtype, self.device = params[0].dtype, params[0].device
        self.numel = sum(p.numel() for p in params)
        self.shard_numel = math.ceil(self.numel / world_size)
        self.padded_numel = self.shard_numel * world_size
        self.rank, self.world_size = rank, world_size
        self.offsets = []
        full = torch.zeros(self.padded_numel, dtype=self.dtype, device=self.device)
        offset = 0
        with torch.no_grad():
            for p in params:
                full[offset:offset + p.numel()].copy_(p.reshape(-1))
                self.offsets.append(offset)
                offset += p.numel()
        lo, hi = rank * self.shard_numel, (rank + 1) * self.shard_numel
        self.full = full
        self.shard = full[lo:hi] if keep_full else full[lo:hi].clone()   # stage 3 keeps only the shard
        for p, off in zip(params, self.offsets):
            p.data = self.full[off:off + p.numel()].view_as(p)
        low = self.dtype in LOW_PRECISION
        self.master = self.shard.detach().float().clone() if low else self.shard
        self.pieces: list[tuple[int, int, int]] = []
        for i, (p, off) in enumerate(zip(params, self.offsets)):
            a, b = max(off, lo), min(off + p.numel(), hi)
            if a < b:
                self.pieces.append((i, a - lo, b - lo))
        # nn.Parameter of a view shares its storage: the optimizer's in-place update lands in master
        self.piece_params = [nn.Parameter(self.master[a:b], requires_grad=True) for _, a, b in self.pieces]
        self.had_grad = [False] * len(params)
        self.grad: torch.Tensor | None = None     # this rank's averaged gradient shard, params' dtype

    def note_grads(self) -> None:
        """Record which parameters hold a gradient now (before their ``.grad`` is freed)."""
        for i, p in enumerate(self.params):
            if p.grad is not None:
                self.had_grad[i] = True

    def flat_grads(self) -> torch.Tensor:
        """The params' gradients laid end to end in a new padded flat buffer (zeros for None); each
        ``p.grad`` is freed as soon as it is copied, so that the gradient is never held twice over
        (the caller points ``p.grad`` back into the buffer where the stage keeps full gradients)."""
        self.note_grads()
        flat = torch.zeros(self.padded_numel, dtype=self.dtype, device=self.device)
        for p, off in zip(self.params, self.offsets):
            if p.grad is not None:
                flat[off:off + p.numel()].copy_(p.grad.reshape(-1))
                p.grad = None
        return flat

    def add_grad_shard(self, g: torch.Tensor) -> None:
        self.grad = g if self.grad is None else self.grad.add_(g)

    def load_piece_grads(self) -> None:
        """Hand each piece its slice of the averaged gradient, or ``None`` if its parameter got none
        this step: ``torch.optim`` then skips it (no update, no weight decay, no state change)."""
        for (i, a, b), pp in zip(self.pieces, self.piece_params):
            if self.had_grad[i] and self.grad is not None:
                g = self.grad[a:b]
                pp.grad = g.float() if pp.dtype != g.dtype else g
            else:
                pp.grad = None

    def clear_grads(self) -> None:
        self.grad = None
        self.had_grad = [False] * len(self.params)
        for pp in self.piece_params:
            pp.grad = None

    def copy_master_to_shard(self) -> None:
        if self.master.data_ptr() != self.shard.data_ptr():
            with torch.no_grad():
                self.shard.copy_(self.master)


def counted(comm: Comm, what: str) -> dict[str, int]:
    """``comm``'s ``calls`` or ring ``wire`` bytes of the collectives ZeRO issues, as integers."""
    table = comm.calls if what == "calls" else comm.wire
    return {op: int(round(table[op])) for op in COUNTED}


class CommCounts:
    """``comm_bytes`` / ``comm_calls`` read from ``self._comm``: what the lessons print for every ZeRO stage."""

    _comm: Comm

    @property
    def comm_bytes(self) -> dict[str, int]:
        """Bytes this rank has sent so far per collective (ring volumes, :func:`dtrain_lab.perfmodel.ring_bytes_sent`)."""
        return counted(self._comm, "wire")

    @property
    def comm_calls(self) -> dict[str, int]:
        """Calls this rank has issued so far per collective."""
        return counted(self._comm, "calls")


def state_tensors(optimizer: torch.optim.Optimizer, flats: list[FlatShard]):
    """(piece, state tensor) for every per-element optimizer state tensor (Adam's m and v; the
    zero-dimensional ``step`` counter does not scale with Ψ and is left out)."""
    for flat in flats:
        for pp in flat.piece_params:
            for value in optimizer.state.get(pp, {}).values():
                if torch.is_tensor(value) and value.dim() > 0 and value.numel() == pp.numel():
                    yield pp, value


def optimizer_bytes(optimizer: torch.optim.Optimizer, flats: list[FlatShard]) -> int:
    """fp32 master copies that are not the shard itself + every per-element optimizer state tensor."""
    total = sum(groups.nbytes(f.master) for f in flats if f.master.data_ptr() != f.shard.data_ptr())
    return total + sum(groups.nbytes(v) for _, v in state_tensors(optimizer, flats))


def optimizer_state_numel(optimizer: torch.optim.Optimizer, flats: list[FlatShard]) -> int:
    """Elements of per-element optimizer state on this rank (Adam: 2 per element of a parameter that
    has been updated at least once; SGD without momentum: 0)."""
    return sum(v.numel() for _, v in state_tensors(optimizer, flats))


def global_norm(comm: Comm, shard_grads: list[torch.Tensor]) -> torch.Tensor:
    """sqrt of the sum over ranks of the squared norms of the shards: the norm of the full gradient."""
    local = torch.zeros((), dtype=torch.float32, device=shard_grads[0].device)
    for g in shard_grads:
        local += g.float().pow(2).sum()
    if comm.size > 1:
        dist.all_reduce(local, group=comm.group)   # one number: not counted in comm_bytes
    return local.sqrt()


def clip_(grads: list[torch.Tensor], total_norm: torch.Tensor, max_norm: float) -> None:
    coef = torch.clamp(max_norm / (total_norm + 1e-6), max=1.0)   # as torch.nn.utils.clip_grad_norm_
    for g in grads:
        g.mul_(coef.to(g.dtype))


def load_optimizer_state(optimizer: torch.optim.Optimizer, state: dict, groups_saved: list[dict]) -> None:
    """Load the wrapped optimizer's per-piece ``state`` with hyperparameters ``groups_saved`` (the
    outer optimizer's groups, without ``params``)."""
    mine = optimizer.state_dict()["param_groups"]
    merged = [{**{k: v for k, v in g.items() if k != "params"}, "params": m["params"]}
              for g, m in zip(groups_saved, mine)]
    optimizer.load_state_dict({"state": state, "param_groups": merged})
