"""Lesson 08: pipeline-parallel training, ours and torch.distributed.pipelining, against one process.

    torchrun --standalone --nproc-per-node 2 -m dtrain_lab.demos.pp_run train,timing
    torchrun --standalone --nproc-per-node 4 -m dtrain_lab.demos.pp_run train,dims 5

Parts (comma-separated first argument):

* ``train`` — ``MLP(16, 32, 4, depth=3, seed=0)`` (four Linear layers) cut into one stage per rank
  (:func:`dtrain_lab.parallel.pipeline.split_sequential`), trained ``STEPS`` SGD steps on batches of
  ``4·m`` rows in ``m`` micro-batches, for each schedule (gpipe, 1f1b) and each ``m`` of the
  second argument (default ``3,4`` with 2 ranks): with :func:`dtrain_lab.parallel.pipeline.train_step`, and
  with ``torch.distributed.pipelining`` (``PipelineStage`` + ``ScheduleGPipe``/``Schedule1F1B``,
  when ``m ≥ p``, which its 1F1B requires). Each rank reports its stage's parameters, those of the
  same layers after training the whole model in one process on the whole batches, the measured
  timeline, the peak number of micro-batches in flight and the activation bytes the executor kept.
  One more run (gpipe, batches of 10 rows in 3 micro-batches of 4, 3, 3 rows) checks unequal
  micro-batches.
* ``timing`` — stages that sleep ``T_F`` in forward and ``T_B`` in backward (a compute-bound stage
  that does not need a CPU core: with 2 cores shared by several processes, real computation would
  time the OS scheduler), ``m`` = 1, 2, 4, 8, both schedules: measured idle fraction from the
  recorded timelines against ``(p-1)/(m+p-1)``.
* ``dims`` — 4 ranks: :class:`dtrain_lab.parallel.dims.ParallelDims` meshes ``(pp, dp, tp)`` =
  (2, 2, 1) and (1, 2, 2): the ranks of each dimension's group; then DP × PP training on the
  (2, 2, 1) mesh (pipeline over ``mesh["pp"]``, gradients averaged over ``mesh["dp"]``) against one
  process on the whole batches.
"""
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from dtrain_lab import caps
from dtrain_lab.jobs import runtime
from dtrain_lab.data import regression_dataset
from dtrain_lab.models import MLP
from dtrain_lab.parallel.pipeline import (bubble_fraction, schedule, split_sequential, PipelineStage,
                                 run_schedule, train_step)

STEPS, LR, MB_ROWS = 3, 0.1, 4
T_F, T_B = 0.02, 0.04


def make_model() -> MLP:
    return MLP(16, 32, 4, depth=3, seed=0)     # same seed: same weights on every rank


def flat(params) -> list:
    return torch.cat([p.detach().reshape(-1) for p in params]).tolist()


def batches(rows: int, steps: int = STEPS):
    data = regression_dataset(n=256, d_in=16, d_out=4, seed=0)
    x, y = data.tensors
    return [(x[i * rows:(i + 1) * rows], y[i * rows:(i + 1) * rows]) for i in range(steps)]


def reference(p: int, rows: int, steps: int = STEPS) -> list:
    """Unpipelined: the whole model, the whole batch, one process. Returns each stage's parameters."""
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for x, y in batches(rows, steps):
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        opt.step()
    return [flat(part.parameters()) for part in split_sequential(model, p)]


def chunks(t: torch.Tensor, m: int) -> list:
    return list(torch.tensor_split(t, m))      # as torch.distributed.pipelining splits a batch


def ours(kind: str, m: int, rows: int, group=None) -> dict:
    rt = runtime.current()
    p = dist.get_world_size(group)
    s = dist.get_rank(group)
    part = split_sequential(make_model(), p)[s].to(rt.device)
    stage = PipelineStage(part, s, p, group=group)
    opt = torch.optim.SGD(part.parameters(), lr=LR)
    acts = schedule(kind, p, m)[s]
    stats = None
    losses = []
    for x, y in batches(rows):
        stats = train_step(stage, acts, chunks(x, m) if stage.is_first else None,
                           chunks(y, m) if stage.is_last else None, F.mse_loss, opt)
        losses.append(stats["losses"])
    return {"params": flat(part.parameters()), "timeline": stats["timeline"],
            "peak_in_flight": stats["peak_in_flight"], "peak_activation_bytes": stats["peak_activation_bytes"],
            "activation_bytes": stats["activation_bytes"], "losses": losses}


def torch_pipelining(kind: str, m: int, rows: int) -> dict:
    from torch.distributed.pipelining import PipelineStage as TorchStage, Schedule1F1B, ScheduleGPipe

    rt = runtime.current()
    p, s = rt.world_size, rt.rank
    part = split_sequential(make_model(), p)[s].to(rt.device)
    stage = TorchStage(part, s, p, rt.device)
    cls = ScheduleGPipe if kind == "gpipe" else Schedule1F1B
    sched = cls(stage, n_microbatches=m, loss_fn=F.mse_loss)   # scale_grads=True: gradients / m
    opt = torch.optim.SGD(part.parameters(), lr=LR)
    for x, y in batches(rows):
        opt.zero_grad()
        if s == 0:
            sched.step(x.to(rt.device))
        elif s == p - 1:
            sched.step(target=y.to(rt.device))
        else:
            sched.step()
        opt.step()
    return {"params": flat(part.parameters())}


def part_train(ms: list) -> dict:
    rt = runtime.current()
    p = rt.world_size
    out = {}
    for m in ms:
        rows = MB_ROWS * m
        ref = reference(p, rows)[rt.rank]
        for kind in ("gpipe", "1f1b"):
            r = ours(kind, m, rows)
            r["reference"] = ref
            if m >= p:
                r["torch"] = torch_pipelining(kind, m, rows)["params"]
            out[f"{kind}_m{m}"] = r
    r = ours("gpipe", 3, 10)            # micro-batches of 4, 3, 3 rows
    r["reference"] = reference(p, 10)[rt.rank]
    out["gpipe_unequal"] = r
    return out


class _Sleep(torch.autograd.Function):
    """Identity that takes T_F seconds in forward and T_B in backward: a stage of known cost."""

    @staticmethod
    def forward(ctx, x, t_f, t_b):
        ctx.t_b = t_b
        time.sleep(t_f)
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        time.sleep(ctx.t_b)
        return g, None, None


class SleepStage(nn.Module):
    def __init__(self, t_f: float, t_b: float):
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.t_f, self.t_b = t_f, t_b

    def forward(self, x):
        return _Sleep.apply(self.lin(x), self.t_f, self.t_b)


def part_timing(ms=(1, 2, 4, 8)) -> dict:
    rt = runtime.current()
    p, s = rt.world_size, rt.rank
    stage = PipelineStage(SleepStage(T_F, T_B), s, p)
    out = {}
    for kind in ("gpipe", "1f1b"):
        for m in ms:
            x = torch.zeros(m, 8)
            stats = run_schedule(stage, schedule(kind, p, m)[s], chunks(x, m) if s == 0 else None,
                                 chunks(x, m) if s == p - 1 else None, lambda out, y: out.sum())
            out[f"{kind}_m{m}"] = {"timeline": stats["timeline"], "m": m,
                                   "formula": bubble_fraction(p, m)}
    return out


def part_dims() -> dict:
    from dtrain_lab.parallel.dims import ParallelDims

    rt = runtime.current()
    out = {}
    for pp, dp, tp in ((2, 2, 1), (1, 2, 2)):
        dims = ParallelDims(dp=dp, tp=tp, pp=pp, world_size=rt.world_size)
        mesh = dims.build_mesh()
        out[f"{pp}{dp}{tp}"] = {
            "coordinate": list(mesh.get_coordinate()),
            "groups": {d: dist.get_process_group_ranks(mesh[d].get_group()) for d in ("pp", "dp", "tp")},
            "expected": dims.coordinate(rt.rank)}
        if (pp, dp, tp) == (2, 2, 1):
            pp_mesh = mesh
    # DP x PP: each dp replica pipelines half of the batch; then average gradients over dp
    pp_group, dp_group = pp_mesh["pp"].get_group(), pp_mesh["dp"].get_group()
    s, dp_rank, m = dist.get_rank(pp_group), dist.get_rank(dp_group), 2
    part = split_sequential(make_model(), 2)[s]
    stage = PipelineStage(part, s, 2, group=pp_group)
    opt = torch.optim.SGD(part.parameters(), lr=LR)
    acts = schedule("1f1b", 2, m)[s]
    rows = 2 * MB_ROWS * m                       # global batch: two dp replicas × m micro-batches
    for x, y in batches(rows):
        half = slice(dp_rank * rows // 2, (dp_rank + 1) * rows // 2)
        opt.zero_grad()
        run_schedule(stage, acts, chunks(x[half], m) if stage.is_first else None,
                     chunks(y[half], m) if stage.is_last else None, F.mse_loss)
        for prm in part.parameters():
            dist.all_reduce(prm.grad, group=dp_group)
            prm.grad /= dist.get_world_size(dp_group)
        opt.step()
    out["dp_pp"] = {"params": flat(part.parameters()), "reference": reference(2, rows)[s], "stage": s,
                    "dp_rank": dp_rank}
    return out


def main() -> None:
    parts = (sys.argv[1] if len(sys.argv) > 1 else "train").split(",")
    ms = [int(v) for v in sys.argv[2].split(",")] if len(sys.argv) > 2 else [3, 4]
    if not caps.have("cuda"):
        torch.set_num_threads(1)   # ranks share the machine's cores
    rt = runtime.current()
    result = {"backend": rt.backend, "world_size": rt.world_size, "rank": rt.rank}
    t0 = time.perf_counter()
    if "train" in parts:
        result["train"] = part_train(ms)
    if "timing" in parts:
        result["timing"] = part_timing()
    if "dims" in parts:
        result["dims"] = part_dims()
    result["seconds"] = time.perf_counter() - t0
    runtime.report(**result)


if __name__ == "__main__":
    runtime.entrypoint(main)
