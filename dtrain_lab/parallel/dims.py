"""Combining data, tensor and pipeline parallelism: one validated dataclass and one device mesh.

``world_size`` ranks are arranged as a 3-D grid ``pp × dp × tp`` (:meth:`ParallelDims.build_mesh`
gives the ``DeviceMesh`` with dimension names ``("pp", "dp", "tp")``); rank
``r = (i_pp · dp + i_dp) · tp + i_tp`` — the last dimension varies fastest, so consecutive ranks
(the GPUs of one node, with ``torchrun``'s usual numbering) share a pp and a dp index.

The usual order, and why (torchtitan's ``ParallelDims`` builds its mesh as
``["pp", "dp_replicate", "dp_shard", "cp", "tp"]``; Megatron-LM's default rank order is the same
from the inside out: tp fastest, pp slowest):

* **TP innermost**, inside a node: tensor parallelism all-reduces activations in every layer,
  forward and backward, on the critical path — it needs NVLink bandwidth, so its group is ``tp``
  consecutive ranks (the GPUs of one node).
* **PP outermost**, across nodes: a stage boundary sends one activation (and one gradient) per
  micro-batch, point to point between two ranks — the least traffic of the three, which tolerates
  the slower inter-node network.
* **DP in between**: one gradient all-reduce (or reduce-scatter/all-gather with ZeRO/FSDP) per
  step, overlapped with backward; each dp group holds the same stage and the same TP shard, and
  often spans nodes too.

Each factor must be ≥ 1 and ``dp · tp · pp == world_size``; the error names every factor. With
world size 1 everything is 1 and :meth:`ParallelDims.build_mesh` still works (a 1×1×1 mesh) once a
process group exists.
"""
from __future__ import annotations

from dataclasses import dataclass

from dtrain_lab.i18n import LabError

__all__ = ["ParallelDims", "MESH_DIMS"]

MESH_DIMS = ("pp", "dp", "tp")


@dataclass(frozen=True)
class ParallelDims:
    """Degrees of data (``dp``), tensor (``tp``) and pipeline (``pp``) parallelism of a job."""

    dp: int
    tp: int
    pp: int
    world_size: int

    def __post_init__(self) -> None:
        for name in ("dp", "tp", "pp", "world_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise LabError("dims_bad_factor", name=name, value=value)
        if self.dp * self.tp * self.pp != self.world_size:
            raise LabError("dims_product", dp=self.dp, tp=self.tp, pp=self.pp,
                           product=self.dp * self.tp * self.pp, world=self.world_size)

    @property
    def shape(self) -> tuple[int, int, int]:
        """The mesh shape, in the order of :data:`MESH_DIMS` (``pp, dp, tp``)."""
        return (self.pp, self.dp, self.tp)

    def coordinate(self, rank: int) -> dict[str, int]:
        """Where global ``rank`` sits in the grid, without any process group: ``{"pp":…, "dp":…, "tp":…}``."""
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < self.world_size:
            raise LabError("dims_bad_factor", name="rank", value=rank)
        i_pp, rest = divmod(rank, self.dp * self.tp)
        i_dp, i_tp = divmod(rest, self.tp)
        return {"pp": i_pp, "dp": i_dp, "tp": i_tp}

    def groups(self, dim: str) -> list[list[int]]:
        """The rank groups along ``dim``: ranks that differ only in that coordinate."""
        if dim not in MESH_DIMS:
            raise LabError("dims_bad_factor", name="dim", value=dim)
        out: dict[tuple, list[int]] = {}
        for r in range(self.world_size):
            c = self.coordinate(r)
            out.setdefault(tuple(v for k, v in c.items() if k != dim), []).append(r)
        return list(out.values())

    def build_mesh(self, device_type: str | None = None):
        """``torch.distributed.device_mesh.init_device_mesh(device_type, (pp, dp, tp),
        mesh_dim_names=("pp", "dp", "tp"))``; ``mesh["tp"]`` etc. give each dimension's sub-mesh and
        ``mesh["pp"].get_group()`` its process group. ``device_type``: "cuda" when the runtime uses
        nccl, else "cpu" (gloo). Needs an initialised process group of ``world_size`` ranks."""
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh

        if dist.is_initialized() and dist.get_world_size() != self.world_size:
            raise LabError("dims_world_mismatch", expected=self.world_size, actual=dist.get_world_size())
        if device_type is None:
            device_type = "cuda" if dist.is_initialized() and dist.get_backend() == "nccl" else "cpu"
        return init_device_mesh(device_type, self.shape, mesh_dim_names=MESH_DIMS)
