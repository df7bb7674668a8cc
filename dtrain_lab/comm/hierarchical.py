"""Hierarchical all-reduce: reduce inside each node, all-reduce between the node leaders, broadcast
inside each node.

The two-level scheme of large clusters (Jia et al. 2018, "Highly Scalable Deep Learning Training
System with Mixed-Precision: Training ImageNet in Four Minutes", arXiv:1807.11205): the fast links
inside a node carry the node's partial sums, and only one rank per node, its *leader*, talks over the
slow links between nodes::

    node A: ranks 0 1        node B: ranks 2 3
    1. reduce   0 <- 1                2 <- 3            (node group, to the leader)
    2. all-reduce      0 <-------------> 2              (leaders-only group)
    3. broadcast 0 -> 1               2 -> 3            (node group, from the leader)

Step 2 must run on a process group that holds **only the leaders**. The version that circulates
calls ``dist.all_reduce(t)`` there, on the default (world) group: that collective waits for every
rank of the world, while the non-leaders are already waiting in step 3 for their leader, which never
comes: a deadlock (``dtrain_lab.demos.hierarchical``, lesson 01, shows it). ``new_group`` builds
the leaders' group, and every rank of the job must call ``new_group`` for every group, in the same
order, members or not (PyTorch's documentation of ``new_group``): :func:`hierarchical_groups` does.

Cost under the α-β model (:func:`predict`, with :mod:`dtrain_lab.perfmodel`'s formulas): a reduce and
a broadcast of ``n`` bytes over ``g`` ranks of a node, ``(g-1)·α_intra + n·β_intra`` each, plus a ring
all-reduce between ``N`` leaders, ``2(N-1)·α_inter + 2(N-1)/N·n·β_inter``. A flat ring over all
``g·N`` ranks crosses the node boundary, so its slowest link sets the pace of each of its ``2(gN-1)``
steps.

Production variants (Horovod's ``HOROVOD_HIERARCHICAL_ALLREDUCE``, NCCL's own topology-aware rings
and trees) replace step 1 by a reduce-scatter and step 3 by an all-gather inside the node, so that
every rank, not only the leader, sends its shard between nodes and every NIC is used.

Every function takes explicit groups and runs as plain code on a world of one.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
import torch.distributed as dist

from dtrain_lab import perfmodel
from dtrain_lab.comm import groups
from dtrain_lab.comm.groups import Group
from dtrain_lab.i18n import LabError

__all__ = ["HierarchicalGroups", "node_layout", "hierarchical_groups", "hierarchical_all_reduce", "predict"]


def node_layout(world_size: int, ranks_per_node: int | Sequence[int]) -> list[list[int]]:
    """The global ranks of each node, consecutive as torchrun numbers them
    (``RANK = GROUP_RANK × LOCAL_WORLD_SIZE + LOCAL_RANK``). ``ranks_per_node`` is one size for
    every node (it must divide ``world_size``) or a list of sizes, one per node (``[3, 1]``)."""
    if isinstance(ranks_per_node, bool) or isinstance(world_size, bool) \
            or not isinstance(world_size, int) or world_size < 1:
        raise LabError("hier_bad_layout", world=world_size, layout=ranks_per_node)
    if isinstance(ranks_per_node, int):
        if ranks_per_node < 1 or world_size % ranks_per_node:
            raise LabError("hier_bad_layout", world=world_size, layout=ranks_per_node)
        sizes = [ranks_per_node] * (world_size // ranks_per_node)
    else:
        sizes = list(ranks_per_node)
        if not sizes or any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in sizes) \
                or sum(sizes) != world_size:
            raise LabError("hier_bad_layout", world=world_size, layout=ranks_per_node)
    layout, start = [], 0
    for s in sizes:
        layout.append(list(range(start, start + s)))
        start += s
    return layout


@dataclass(frozen=True)
class HierarchicalGroups:
    """The groups one rank needs: its node's group, the leaders-only group, and who leads."""

    layout: tuple[tuple[int, ...], ...]   # global ranks of each node; the first one leads
    node: Group                           # this rank's node (None on a world of one)
    leaders: Group                        # the leaders only (a non-member sentinel elsewhere)
    leader: int                           # global rank of this rank's node leader

    @property
    def is_leader(self) -> bool:
        return groups.rank() == self.leader

    @property
    def node_size(self) -> int:
        return next(len(n) for n in self.layout if self.leader == n[0])


def hierarchical_groups(layout: Sequence[Sequence[int]]) -> HierarchicalGroups:
    """Build the node groups and the leaders-only group for ``layout`` (global ranks per node, the
    first of each node its leader). **Every rank of the job calls it with the same layout**:
    ``new_group`` is collective over the whole world, members or not."""
    world = groups.size()
    flat = [r for node in layout for r in node]
    if not layout or any(len(node) == 0 for node in layout) or sorted(flat) != list(range(world)):
        raise LabError("hier_bad_layout", world=world, layout=[list(n) for n in layout])
    layout = tuple(tuple(int(r) for r in node) for node in layout)
    me = groups.rank()
    mine = next(node for node in layout if me in node)
    if not groups.initialized():          # a world of one: plain code, no groups
        return HierarchicalGroups(layout, None, None, mine[0])
    node_group = None
    for node in layout:                   # same calls, same order, on every rank
        g = dist.new_group(list(node))
        if node is mine:
            node_group = g
    leaders = dist.new_group([node[0] for node in layout])
    return HierarchicalGroups(layout, node_group, leaders, mine[0])


def hierarchical_all_reduce(tensor: torch.Tensor, hg: HierarchicalGroups, op: str = "sum") -> torch.Tensor:
    """All-reduce ``tensor`` in place in three steps: reduce to the node leader, all-reduce among the
    leaders (on their own group), broadcast from the leader. The same result as ``dist.all_reduce``
    over the world, up to the order of floating-point additions. ``op``: ``"sum"`` or ``"avg"``."""
    if op not in ("sum", "avg"):
        raise LabError("comm_bad_choice", name="op", value=op, choices="sum, avg")
    world = groups.size()
    if world == 1:
        return tensor
    work = tensor if tensor.is_contiguous() else tensor.contiguous()
    if hg.node_size > 1:
        dist.reduce(work, dst=hg.leader, group=hg.node)              # 1. inside the node
    if hg.is_leader and len(hg.layout) > 1:
        dist.all_reduce(work, group=hg.leaders)                      # 2. leaders only, NOT the world
    if hg.node_size > 1:
        dist.broadcast(work, src=hg.leader, group=hg.node)           # 3. inside the node
    if op == "avg":
        work.div_(world)
    if work is not tensor:
        tensor.copy_(work)
    return tensor


def predict(nbytes: float, ranks_per_node: int, nodes: int, intra: tuple[float, float],
            inter: tuple[float, float]) -> dict:
    """α-β prediction (seconds) of a hierarchical all-reduce of ``nbytes`` on ``nodes`` × ``ranks_per_node``
    ranks against a flat ring over all of them. ``intra`` and ``inter`` are (α, β) of the links
    inside a node and between nodes. Returns the three steps, their sum and the flat ring."""
    g, n_nodes = ranks_per_node, nodes
    reduce = perfmodel.collective_time("reduce", nbytes, g, *intra)
    leaders = perfmodel.collective_time("all_reduce", nbytes, n_nodes, *inter)
    broadcast = perfmodel.collective_time("broadcast", nbytes, g, *intra)
    # a flat ring over g·N ranks crosses the node boundary: every step waits for the slow link
    slow = inter if n_nodes > 1 else intra
    flat = perfmodel.collective_time("all_reduce", nbytes, g * n_nodes, *slow)
    return {"reduce": reduce, "leaders_all_reduce": leaders, "broadcast": broadcast,
            "hierarchical": reduce + leaders + broadcast, "flat_ring": flat}
