"""Process-group helpers: the one place that answers "who am I, how many are we, am I in it".

Every technique takes a process group (``None`` meaning the default group, the world) and runs as
plain single-process code when torch.distributed is not initialised: then rank is 0 and size is 1.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist

# What technique code accepts as its ``group`` parameter: None is the default group.
Group = Optional[dist.ProcessGroup]


def initialized() -> bool:
    return dist.is_available() and dist.is_initialized()


def rank(group: Group = None) -> int:
    """This process's rank inside ``group`` (0 outside a job)."""
    return dist.get_rank(group) if initialized() else 0


def size(group: Group = None) -> int:
    """Number of ranks in ``group`` (1 outside a job)."""
    return dist.get_world_size(group) if initialized() else 1


def rank_size(group: Group = None) -> tuple[int, int]:
    return rank(group), size(group)


def global_rank(group: Group, group_rank: int) -> int:
    """The global rank of ``group``'s rank ``group_rank`` (what ``src=``/``dst=`` arguments want)."""
    return group_rank if group is None or not initialized() else dist.get_global_rank(group, group_rank)


def members(group: Group = None) -> list[int]:
    """Global ranks in ``group``, in group order."""
    if not initialized():
        return [0]
    return list(range(dist.get_world_size())) if group is None else dist.get_process_group_ranks(group)


def is_member(group: Group = None) -> bool:
    """Whether this process belongs to ``group`` (``new_group`` returns a non-member sentinel otherwise)."""
    if not initialized() or group is None:
        return True
    return group != dist.GroupMember.NON_GROUP_MEMBER and dist.get_rank() in members(group)


def barrier(group: Group = None) -> None:
    """A barrier that is a no-op at world size 1."""
    if size(group) > 1:
        dist.barrier(group)


def nbytes(t: Optional[torch.Tensor]) -> int:
    """Bytes of a tensor's local data (a DTensor's local shard; 0 for None)."""
    if t is None:
        return 0
    local = t.to_local() if hasattr(t, "to_local") else t
    return local.numel() * local.element_size()
