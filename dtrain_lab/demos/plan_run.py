"""Lesson 14: small layouts of all five dimensions run for real, against one process and the planner.

    torchrun --standalone --nproc-per-node 4 -m dtrain_lab.demos.plan_run

Three 4-rank layouts of :class:`dtrain_lab.parallel.dims.ParallelDims`, one after the other in the
same job, each training the blocks of :mod:`dtrain_lab.parallel.compose` for 3 Adam steps (fp32,
MSE against random targets, ``m = 2`` micro-batches through :func:`dtrain_lab.parallel.pipeline.run_schedule`,
gradients averaged by :func:`dtrain_lab.parallel.compose.sync_gradients`):

* ``tp2_dp2`` — tiny-dense, tp = 2, dp = 2;
* ``pp2_cp2`` — tiny-dense, pp = 2, cp = 2 (ring attention inside a pipeline);
* ``cp2_dp2_ep2`` — tiny-moe, cp = 2, dp = 2, ep = 2 (edp = 2).

Each rank reports, per layout: the largest difference of its parameters from one process training the
full blocks on the whole batch; the calls and bytes its backend was handed in step 2, per dimension
(:func:`dtrain_lab.demos.commcount.counted`); the activation bytes the pipeline executor measured per
micro-batch; its parameter counts; and in step 3 the peak bytes of live tensor storage
(:class:`dtrain_lab.planner.memtrack.PeakMemory`). tests/test_planner.py compares these with
:func:`dtrain_lab.planner.plan`.
"""
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from dtrain_lab.demos.commcount import counted
from dtrain_lab.jobs import runtime
from dtrain_lab.parallel.compose import Block, ParallelBlock, expert_parameters, sync_gradients
from dtrain_lab.parallel.context import shard_sequence
from dtrain_lab.parallel.dims import ParallelDims
from dtrain_lab.parallel.pipeline import PipelineStage, run_schedule, schedule
from dtrain_lab.planner import model_preset, stage_layers
from dtrain_lab.planner.memtrack import PeakMemory

LAYOUTS = {"tp2_dp2": ("tiny-dense", dict(dp=2, tp=2, pp=1, cp=1, ep=1)),
           "pp2_cp2": ("tiny-dense", dict(dp=1, tp=1, pp=2, cp=2, ep=1)),
           "cp2_dp2_ep2": ("tiny-moe", dict(dp=2, tp=1, pp=1, cp=2, ep=2))}
M, MB, SEQ, STEPS, LR = 2, 2, 64, 3, 1e-2


def data(cfg, dp: int):
    g = torch.Generator().manual_seed(5)
    rows = dp * M * MB
    return torch.randn(rows, SEQ, cfg.d_model, generator=g), torch.randn(rows, SEQ, cfg.d_model, generator=g)


def reference(cfg, x, y, solo) -> list:
    blocks = nn.Sequential(*[Block(cfg, layer, seed=0, moe_group=solo) for layer in range(cfg.n_layers)])
    opt = torch.optim.Adam(blocks.parameters(), lr=LR)
    for _ in range(STEPS):
        opt.zero_grad(set_to_none=True)
        F.mse_loss(blocks(x), y).backward()
        opt.step()
    return list(blocks)


def expected(name: str, ref: Block, blk: ParallelBlock, tp_rank: int) -> torch.Tensor:
    """The slice of the reference parameter that ``blk``'s parameter ``name`` holds."""
    full = dict(ref.named_parameters())[name]
    local = dict(blk.named_parameters())[name]
    if name.startswith("experts."):
        if name.endswith("router.weight"):
            return full
        return full[blk.experts.first:blk.experts.first + blk.experts.local]
    if name in ("wq", "wk", "wv", "w1", "w3"):
        n = local.shape[0]
        return full[tp_rank * n:(tp_rank + 1) * n]
    if name in ("wo", "w2"):
        n = local.shape[1]
        return full[:, tp_rank * n:(tp_rank + 1) * n]
    return full


def run_layout(preset: str, degrees: dict) -> dict:
    rt = runtime.current()
    cfg = model_preset(preset).config
    dims = ParallelDims(world_size=rt.world_size, **degrees)
    pgs = dims.process_groups()
    solo = [dist.new_group([i]) for i in range(rt.world_size)][rt.rank]
    c = dims.coordinate(rt.rank) | {"cp": dims._full(rt.rank)[2]}
    s, i_dp, i_cp = c["pp"], c["dp"], c["cp"]
    tp_rank = dist.get_rank(pgs["tp"])
    layers = stage_layers(cfg.n_layers, dims.pp, s)
    blocks = [ParallelBlock(cfg, layer, seed=0, tp=pgs["tp"], cp=pgs["cp"], ep=pgs["ep"]) for layer in layers]
    module = nn.Sequential(*blocks)
    stage = PipelineStage(module, s, dims.pp, group=pgs["pp"])
    acts = schedule("1f1b", dims.pp, M)[s]
    opt = torch.optim.Adam(module.parameters(), lr=LR)
    x, y = data(cfg, dims.dp)
    mine = slice(i_dp * M * MB, (i_dp + 1) * M * MB)
    xs = list(torch.tensor_split(shard_sequence(x[mine], i_cp, dims.cp, "zigzag", dim=1), M))
    ys = list(torch.tensor_split(shard_sequence(y[mine], i_cp, dims.cp, "zigzag", dim=1), M))
    out = {"stage": s, "groups": {dim: dist.get_process_group_ranks(g) for dim, g in pgs.items()},
           "expected_groups": {dim: dims.group_of(rt.rank, dim) for dim in pgs}}

    def step():
        opt.zero_grad(set_to_none=True)
        stats = run_schedule(stage, acts, xs if stage.is_first else None, ys if stage.is_last else None, F.mse_loss)
        sync_gradients(module, pgs["dp_cp"], pgs["edp"], dims.dp * dims.cp)
        opt.step()
        return stats

    step()
    with counted(by_dim=True) as comm:
        stats = step()
    out["comm"], out["activation_bytes"] = comm, stats["activation_bytes"]
    with PeakMemory(module, optimizer=opt) as mem:
        step()
    out["peak"], out["start_bytes"] = mem.peak, mem.start
    experts = {id(p) for p in expert_parameters(module)}
    out["params"] = {"dense": sum(p.numel() for p in module.parameters() if id(p) not in experts),
                     "expert": sum(p.numel() for p in module.parameters() if id(p) in experts)}
    ref = reference(cfg, x, y, solo)
    out["max_diff"] = max((p - expected(n, ref[layer], blk, tp_rank)).abs().max().item()
                          for layer, blk in zip(layers, blocks) for n, p in blk.named_parameters())
    initial = {layer: Block(cfg, layer, seed=0, moe_group=solo) for layer in layers}
    out["moved"] = max((p - expected(n, initial[layer], blk, tp_rank)).abs().max().item()
                       for layer, blk in zip(layers, blocks) for n, p in blk.named_parameters())
    return out


def main() -> None:
    torch.set_num_threads(1)
    rt = runtime.current()
    runtime.report(world_size=rt.world_size, rank=rt.rank,
                   layouts={name: run_layout(preset, degrees) for name, (preset, degrees) in LAYOUTS.items()})


if __name__ == "__main__":
    runtime.entrypoint(main)
