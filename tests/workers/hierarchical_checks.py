"""Hierarchical all-reduce under torchrun: every layout of the world size in one launch.

Launched by tests/test_hierarchical.py at world sizes 2, 3 and 4. Each rank reports its input, the
hierarchical result and dist.all_reduce's result per layout, and which collectives it issued; the
test recomputes the sum from the seeds in its own process (a single-process baseline).
"""
import torch
import torch.distributed as dist

from dtrain_lab.comm.counted import count_collectives
from dtrain_lab.comm.hierarchical import hierarchical_all_reduce, hierarchical_groups, node_layout
from dtrain_lab.i18n import LabError
from dtrain_lab.jobs import runtime

LAYOUTS = {2: {"1x2": 2, "2x1": 1},
           3: {"1x3": 3, "2+1": [2, 1], "1+2": [1, 2], "3x1": 1},
           4: {"2x2": 2, "3+1": [3, 1], "1+3": [1, 3], "4x1": 1, "1x4": 4}}


def data(rank: int) -> torch.Tensor:
    return torch.randn(257, dtype=torch.float64, generator=torch.Generator().manual_seed(100 + rank))


def main() -> None:
    rt = runtime.current()
    p, r = rt.world_size, rt.rank
    out = {}
    for name, per_node in LAYOUTS[p].items():
        hg = hierarchical_groups(node_layout(p, per_node))
        x = data(r)
        ref = x.clone()
        dist.all_reduce(ref)
        mine = hierarchical_all_reduce(x.clone(), hg)
        avg = hierarchical_all_reduce(x.clone(), hg, op="avg")
        # a non-contiguous view is reduced in place as well
        base = torch.arange(12, dtype=torch.float32).reshape(3, 4) * (r + 1)
        view = base.t()
        hierarchical_all_reduce(view, hg)
        _, counts = count_collectives(hierarchical_all_reduce, torch.zeros(4), hg)
        out[name] = {"layout": [list(n) for n in hg.layout], "leader": hg.leader, "is_leader": hg.is_leader,
                     "result": mine.tolist(), "reference": ref.tolist(), "avg": avg.tolist(),
                     "view": base.tolist(), "counts": counts}
    # a layout that does not cover the world is refused on every rank before any group is made
    try:
        hierarchical_groups([[0]] if p > 1 else [[0, 1]])
        refused = None
    except LabError as exc:
        refused = str(exc)
    runtime.report(layouts=out, refused=refused)


if __name__ == "__main__":
    runtime.entrypoint(main)
