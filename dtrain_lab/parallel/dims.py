"""Combining the five parallelisms: one validated dataclass, the rank grid, and its process groups.

``world_size`` ranks are arranged as a grid ``pp × dp × cp × tp`` (:meth:`ParallelDims.build_mesh`
gives the ``DeviceMesh``); rank ``r = ((i_pp · dp + i_dp) · cp + i_cp) · tp + i_tp`` — the last
dimension varies fastest, so consecutive ranks (the GPUs of one node, with ``torchrun``'s usual
numbering) share a pp, a dp and a cp index. With ``cp = 1`` (lesson 08's three dimensions) the grid
is ``pp × dp × tp`` and the mesh has exactly those three names.

The usual order, and why (torchtitan's ``ParallelDims`` builds its mesh as
``["pp", "dp_replicate", "dp_shard", "cp", "tp"]``; Megatron-LM's default rank order is the same
from the inside out: tp fastest, then cp, dp, pp):

* **TP innermost**, inside a node: tensor parallelism all-reduces activations in every layer,
  forward and backward, on the critical path — it needs NVLink bandwidth, so its group is ``tp``
  consecutive ranks (the GPUs of one node).
* **CP next**: ring attention sends every layer's K/V blocks point to point, overlapped with the
  attention compute — less than TP's All-Reduces, more than DP's once-per-step gradients.
* **DP**: one gradient all-reduce (or reduce-scatter/all-gather with ZeRO/FSDP) per step,
  overlapped with backward; often spans nodes.
* **PP outermost**, across nodes: a stage boundary sends one activation (and one gradient) per
  micro-batch, point to point between two ranks — the least traffic, which tolerates the slower
  inter-node network.

**EP shares ranks.** Expert parallelism adds no ranks of its own: the MoE layers' experts are spread
over ``ep`` of the ``dp × cp`` ranks that hold the same pipeline stage and TP shard (those ranks
process different tokens anyway, which is what an MoE layer dispatches). So ``ep`` must divide
``dp · cp``; the ranks that hold the *same* experts form the expert-data-parallel group ``edp``
(``dp · cp / ep`` ranks) over which expert gradients are averaged, while dense gradients are
averaged over all ``dp · cp`` ranks (CP ranks hold the same weights and see different tokens).
torchtitan's ``ParallelDims._validate`` (``torchtitan/distributed/parallel_dims.py``) is stricter:
with ``etp == tp``, "# EP would borrow all cp and some dp_shard degree" and
``assert ep % cp == 0 and (dp_shard * cp) % ep == 0``; with ``etp == 1``, "# EP would borrow all cp
and tp and some dp_shard degree" and ``assert ep % (cp * tp) == 0 and (dp_shard * cp * tp) % ep == 0``.
This course accepts any ``ep`` dividing ``dp · cp``, ``ep < cp`` included (an EP group is then part of
a CP group): more general than torchtitan, and the same idea as Megatron-LM's expert-data-parallel
group. EP cannot share PP
ranks (different stages hold different layers) and here does not share TP (experts are not
tensor-sharded).

What divides what: ``dp · cp · tp · pp = world_size``; ``ep | dp · cp``; for a model
(:meth:`ParallelDims.check_model`): ``tp | heads`` and ``tp | kv_heads``, ``pp ≤ layers``,
``2·cp | seq_len`` (zig-zag; times tp with sequence parallelism) and ``ep | experts``. Every error
names the factors and what to change.
"""
from __future__ import annotations

from dataclasses import dataclass

from dtrain_lab.i18n import LabError

__all__ = ["ParallelDims", "MESH_DIMS", "ALL_DIMS", "GROUP_DIMS"]

MESH_DIMS = ("pp", "dp", "tp")                   # lesson 08's three dimensions (cp = 1)
ALL_DIMS = ("pp", "dp", "cp", "tp", "ep")        # the five degrees
GROUP_DIMS = ("pp", "dp", "cp", "tp", "dp_cp", "ep", "edp")   # every group a rank belongs to


@dataclass(frozen=True)
class ParallelDims:
    """Degrees of data (``dp``), tensor (``tp``), pipeline (``pp``), context (``cp``) and expert
    (``ep``) parallelism of a job of ``world_size`` ranks. ``ParallelDims(dp, tp, pp, world_size)``
    is lesson 08's three-dimensional layout."""

    dp: int
    tp: int
    pp: int
    world_size: int
    cp: int = 1
    ep: int = 1

    def __post_init__(self) -> None:
        for name in ("dp", "tp", "pp", "world_size", "cp", "ep"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise LabError("dims_bad_factor", name=name, value=value)
        product = self.dp * self.cp * self.tp * self.pp
        if product != self.world_size:
            if self.cp == 1:
                raise LabError("dims_product", dp=self.dp, tp=self.tp, pp=self.pp, product=product,
                               world=self.world_size)
            raise LabError("dims_product_cp", dp=self.dp, cp=self.cp, tp=self.tp, pp=self.pp, product=product,
                           world=self.world_size)
        if (self.dp * self.cp) % self.ep:
            raise LabError("dims_ep_divides", ep=self.ep, dp=self.dp, cp=self.cp, dpcp=self.dp * self.cp)

    # ------------------------------------------------------------------------------ the grid
    @property
    def mesh_dims(self) -> tuple[str, ...]:
        """Names of the mesh dimensions: ``("pp", "dp", "tp")``, with ``"cp"`` before ``"tp"`` when cp > 1."""
        return ("pp", "dp", "cp", "tp") if self.cp > 1 else MESH_DIMS

    @property
    def shape(self) -> tuple[int, ...]:
        """The mesh shape, in the order of :attr:`mesh_dims`."""
        return tuple(getattr(self, d) for d in self.mesh_dims)

    @property
    def edp(self) -> int:
        """Expert-data-parallel degree: ranks holding the same experts, ``dp · cp / ep``."""
        return self.dp * self.cp // self.ep

    def _check_rank(self, rank) -> None:
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < self.world_size:
            raise LabError("dims_bad_factor", name="rank", value=rank)

    def coordinate(self, rank: int) -> dict[str, int]:
        """Where global ``rank`` sits in the grid, without any process group: one entry per mesh
        dimension (``{"pp":…, "dp":…, "tp":…}`` for lesson 08's layouts)."""
        self._check_rank(rank)
        full = dict(zip(("pp", "dp", "cp", "tp"), self._full(rank)))
        return {d: full[d] for d in self.mesh_dims}

    def _full(self, rank: int) -> tuple[int, int, int, int]:
        """(i_pp, i_dp, i_cp, i_tp) of ``rank``."""
        i_pp, rest = divmod(rank, self.dp * self.cp * self.tp)
        i_dp, rest = divmod(rest, self.cp * self.tp)
        i_cp, i_tp = divmod(rest, self.tp)
        return i_pp, i_dp, i_cp, i_tp

    def _key(self, rank: int, dim: str) -> tuple:
        """What ranks of one ``dim`` group have in common."""
        i_pp, i_dp, i_cp, i_tp = self._full(rank)
        j = i_dp * self.cp + i_cp                    # position among the dp × cp ranks of a (pp, tp) slice
        return {"pp": (i_dp, i_cp, i_tp), "dp": (i_pp, i_cp, i_tp), "cp": (i_pp, i_dp, i_tp),
                "tp": (i_pp, i_dp, i_cp), "dp_cp": (i_pp, i_tp), "ep": (i_pp, i_tp, j // self.ep),
                "edp": (i_pp, i_tp, j % self.ep)}[dim]

    def groups(self, dim: str) -> list[list[int]]:
        """The rank groups along ``dim`` (one of :data:`GROUP_DIMS`): ranks that differ only in that
        coordinate. ``dp_cp``: the ranks that hold the same dense weights (gradients averaged there);
        ``ep``: the ranks whose experts together make one MoE layer; ``edp``: ranks holding the same
        experts."""
        if dim not in GROUP_DIMS:
            raise LabError("dims_bad_factor", name="dim", value=dim)
        out: dict[tuple, list[int]] = {}
        for r in range(self.world_size):
            out.setdefault(self._key(r, dim), []).append(r)
        return list(out.values())

    def group_of(self, rank: int, dim: str) -> list[int]:
        """The ranks of ``rank``'s group along ``dim``."""
        self._check_rank(rank)
        return next(g for g in self.groups(dim) if rank in g)

    # ------------------------------------------------------------------------------ a model
    def check_model(self, *, n_layers: int, n_heads: int, n_kv_heads: int | None = None,
                    seq_len: int | None = None, n_experts: int = 0, zigzag: bool = True,
                    sequence_parallel: bool = False) -> None:
        """Raise a :class:`LabError` saying what to change if the layout cannot run this model.
        ``sequence_parallel``: activations outside attention and MLP are also cut over tp (Megatron's
        sequence parallelism), so the sequence must divide by tp as well."""
        kv = n_heads if n_kv_heads is None else n_kv_heads
        if n_heads % self.tp:
            raise LabError("tp_uneven_heads", heads=n_heads, tp=self.tp)
        if kv % self.tp:
            raise LabError("dims_kv_heads_tp", kv=kv, tp=self.tp)
        if self.pp > n_layers:
            raise LabError("dims_stages_layers", pp=self.pp, layers=n_layers)
        chunks = 2 * self.cp if zigzag and self.cp > 1 else self.cp
        if seq_len is not None and sequence_parallel and seq_len % (chunks * self.tp):
            raise LabError("dims_seq_len_sp", seq=seq_len, cp=self.cp, tp=self.tp, multiple=chunks * self.tp)
        if seq_len is not None and seq_len % chunks:
            raise LabError("dims_seq_len", seq=seq_len, cp=self.cp, multiple=chunks)
        if self.ep > 1 and not n_experts:
            raise LabError("dims_ep_dense", ep=self.ep)
        if n_experts and n_experts % self.ep:
            raise LabError("ep_uneven_experts", experts=n_experts, ep=self.ep)

    # ------------------------------------------------------------------------------ process groups
    def build_mesh(self, device_type: str | None = None):
        """``torch.distributed.device_mesh.init_device_mesh(device_type, shape, mesh_dim_names=mesh_dims)``;
        ``mesh["tp"]`` etc. give each dimension's sub-mesh and ``mesh["pp"].get_group()`` its process
        group. ``device_type``: "cuda" when the runtime uses nccl, else "cpu" (gloo). Needs an
        initialised process group of ``world_size`` ranks."""
        from torch.distributed.device_mesh import init_device_mesh

        return init_device_mesh(self._device(device_type), self.shape, mesh_dim_names=self.mesh_dims)

    def build_expert_mesh(self, device_type: str | None = None):
        """The expert view of the same ranks: mesh ``("pp", "edp", "ep", "tp")`` of shape
        ``(pp, dp·cp/ep, ep, tp)`` — the same rank numbering, with the ``dp × cp`` ranks regrouped."""
        from torch.distributed.device_mesh import init_device_mesh

        return init_device_mesh(self._device(device_type), (self.pp, self.edp, self.ep, self.tp),
                                mesh_dim_names=("pp", "edp", "ep", "tp"))

    def process_groups(self) -> dict:
        """``{dim: process group of this rank}`` for every dim of :data:`GROUP_DIMS`, made with
        ``dist.new_group`` (every rank creates every group, in the same order, as it must)."""
        import torch.distributed as dist

        self._device(None)
        me, out = dist.get_rank(), {}
        for dim in GROUP_DIMS:
            for ranks in self.groups(dim):
                g = dist.new_group(ranks)
                if me in ranks:
                    out[dim] = g
        return out

    def _device(self, device_type: str | None) -> str:
        import torch.distributed as dist

        if dist.is_initialized() and dist.get_world_size() != self.world_size:
            raise LabError("dims_world_mismatch", expected=self.world_size, actual=dist.get_world_size())
        if device_type is None:
            device_type = "cuda" if dist.is_initialized() and dist.get_backend() == "nccl" else "cpu"
        return device_type
