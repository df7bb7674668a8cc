"""Lesson 04's small experiments on gradient compression, one function per part, chosen by name.

    torchrun --standalone --nproc-per-node 2 -m dtrain_lab.demos.compression_parts topk_by_hand,indices_wrong
    torchrun ... -m dtrain_lab.demos.compression_parts powersgd_vs_torch steps=60 start_iter=10
    torchrun ... -m dtrain_lab.demos.compression_parts torch_powersgd_buckets   # expected to fail

The first argument is a comma-separated list of parts; ``key=value`` pairs after it go to every
part that takes that keyword. Each part reports its result under its own name, so
``LaunchResult.metrics[rank]["topk_by_hand"]`` holds what that rank saw. The training task is the one
of :func:`dtrain_lab.demos.compression_run.train_with_compression` (``MLP(16, 64, 4)``, synthetic regression).
"""
import gc
import inspect
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F

from dtrain_lab import caps
from dtrain_lab.jobs import runtime
from dtrain_lab.parallel.compression import (CommState, PowerSGDState, powersgd_hook, topk_allreduce_indices_WRONG,
                                    topk_sparse_allreduce)

# Two ranks' gradients for the worked examples (rank r takes row r; other ranks get zeros).
HAND = [[3.0, 1.0, -2.0, 0.5], [0.0, -4.0, 1.0, 1.0]]
WRONG_CASES = {
    # rank 0's largest entry is at index 1, rank 1's at index 4: an all-reduce of the indices gives 5
    "different": [[0.0, 3.0, 0.5, 0.0, 0.0, 0.0, 0.25, 0.0], [0.5, 0.0, 0.0, 0.0, -4.0, 0.0, 0.0, 1.0]],
    # both ranks choose index 2: the "sum" lands at index 4, the true average stays at 2
    "same": [[0.0, 0.0, 2.0, 0.0, 0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 6.0, 0.0, 1.0, 0.0, 0.0, 0.0]],
}


def _row(rows, rank):
    return torch.tensor(rows[rank]) if rank < len(rows) else torch.zeros(len(rows[0]))


def topk_by_hand(rounds: int = 3) -> dict:
    """Top-k with k = 1 on a 4-entry gradient that is the same at every step, with and without error
    feedback: what each rank sends, the average every rank receives, and the residual it keeps.
    The same operations as :func:`dtrain_lab.parallel.compression.topk_hook`, on a plain tensor."""
    rank = dist.get_rank()
    g = _row(HAND, rank)
    out = {}
    for ef in (True, False):
        state, residual, log = CommState(), torch.zeros_like(g), []
        for _ in range(rounds):
            x = g + residual if ef else g.clone()            # gradient + what was not sent yet
            average, sent = topk_sparse_allreduce(x, 1, state)
            if ef:
                residual = x - sent                           # residual = input − sent
            i = int(sent.abs().argmax())
            log.append({"input": x.tolist(), "sent_index": i, "sent_value": float(sent[i]),
                        "average": average.tolist(), "residual": residual.tolist()})
        out["ef" if ef else "noef"] = {"steps": log, "bytes": state.bytes_sent,
                                       "by_op": {k: v for k, v in state.bytes_by_op.items() if v}}
    out["gradient"] = g.tolist()
    return out


def indices_wrong() -> dict:
    """The correct sparse all-reduce (all-gather of values and indices) against all-reducing the
    value and index tensors as if they were dense, k = 1, on the two cases of ``WRONG_CASES``."""
    rank = dist.get_rank()
    out = {}
    for name, rows in WRONG_CASES.items():
        g = _row(rows, rank)
        right, sent = topk_sparse_allreduce(g, 1, CommState())
        wrong = topk_allreduce_indices_WRONG(g, 1, CommState())
        chosen = [torch.zeros(1, dtype=torch.int64) for _ in range(dist.get_world_size())]
        dist.all_gather(chosen, sent.abs().argmax().reshape(1))
        out[name] = {"gradient": g.tolist(), "chosen": [int(c) for c in chosen],
                     "right": right.tolist(), "wrong": wrong.tolist()}
    return out


def _train(hook, state, steps: int, *, bucket_cap_mb: float = 25.0, lr: float = 0.05,
           per_rank_batch: int = 16, d_hidden: int = 64, seed: int = 0) -> dict:
    """Train like ``train_with_compression`` on PyTorch's ``DistributedDataParallel`` with ``hook``;
    returns per-step losses, the flat parameters and the buckets the hook saw."""
    from torch.nn.parallel import DistributedDataParallel

    from dtrain_lab.data import global_batch, regression_dataset, shard
    from dtrain_lab.models import MLP

    rank, world = dist.get_rank(), dist.get_world_size()
    model = MLP(16, d_hidden, 4, depth=2, seed=seed)
    net = DistributedDataParallel(model, bucket_cap_mb=bucket_cap_mb)
    buckets: set[int] = set()

    def counting(st, bucket):                 # records which buckets exist, then runs the hook
        buckets.add(bucket.index())
        return hook(st, bucket)

    net.register_comm_hook(state, counting)
    data = regression_dataset(512, 16, 4, seed=seed + 1)
    x_all, y_all = data.tensors
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    # PyTorch's powerSGD_hook runs Python callbacks on gloo's worker threads (Future.then). Python's
    # cyclic garbage collector runs on whichever thread allocates, so it could destroy an earlier DDP
    # there, and a C++ object that joins that very thread aborts the rank ("Resource deadlock
    # avoided", seen twice under load). The collector is off while the hook trains, and what it finds
    # is collected here, on the main thread.
    gc.disable()
    try:
        for step in range(steps):
            x, y = shard(global_batch(data, step, per_rank_batch * world), rank, world)
            opt.zero_grad(set_to_none=True)
            F.mse_loss(net(x), y).backward()
            opt.step()
            with torch.no_grad():
                losses.append(float(F.mse_loss(model(x_all), y_all)))
        params = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        dist.barrier()                        # every rank's last bucket is done before DDP goes
        del net, opt
    finally:
        gc.enable()
    gc.collect()
    return {"loss": losses, "params": params, "buckets": len(buckets)}


def powersgd_vs_torch(steps: int = 60, rank: int = 1, start_iter: int = 10, seed: int = 0) -> dict:
    """Our ``powersgd_hook`` against PyTorch's ``powerSGD_hook`` with the same settings and seed, each
    on PyTorch's ``DistributedDataParallel``: the largest difference between the trained parameters."""
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as P

    ours_state = PowerSGDState(matrix_approximation_rank=rank, start_iter=start_iter, random_seed=seed)
    their_state = P.PowerSGDState(None, matrix_approximation_rank=rank, start_powerSGD_iter=start_iter,
                                  random_seed=seed)
    ours = _train(powersgd_hook, ours_state, steps)
    theirs = _train(P.powerSGD_hook, their_state, steps)
    default = inspect.signature(P.PowerSGDState).parameters["start_powerSGD_iter"].default
    return {"max_abs_diff": float((ours["params"] - theirs["params"]).abs().max()),
            "equal": bool(torch.equal(ours["params"], theirs["params"])),
            "loss_equal": ours["loss"] == theirs["loss"], "final_loss": ours["loss"][-1],
            "bytes_ratio": ours_state.ratio(),
            # PyTorch's own statistics: elements before and after compression, compressed steps only
            "their_numel": [their_state.total_numel_before_compression,
                            their_state.total_numel_after_compression],
            "iters": [ours_state.iter, their_state.iter], "buckets": ours["buckets"],
            "torch_default_start_iter": default}


def torch_powersgd_buckets(steps: int = 40, bucket_cap_mb: float = 0.01) -> dict:
    """Several buckets on gloo: our blocking ``powersgd_hook`` first, then PyTorch's ``powerSGD_hook``,
    whose P and Q all-reduces are issued from future callbacks (gloo's worker threads, no fixed order
    across buckets). Ours finishes; theirs is expected to crash with a size mismatch or hang."""
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as P

    ours = _train(powersgd_hook, PowerSGDState(start_iter=2), steps, bucket_cap_mb=bucket_cap_mb)
    runtime.report(torch_powersgd_buckets={"ours_finished": True, "buckets": ours["buckets"]})
    runtime.print0(f"ours: {steps} steps with {ours['buckets']} buckets, done; now PyTorch's powerSGD_hook")
    _train(P.powerSGD_hook, P.PowerSGDState(None, start_powerSGD_iter=2), steps, bucket_cap_mb=bucket_cap_mb)
    return {"ours_finished": True, "buckets": ours["buckets"], "theirs_finished": True}


PARTS = {f.__name__: f for f in (topk_by_hand, indices_wrong, powersgd_vs_torch, torch_powersgd_buckets)}


def main() -> None:
    if not caps.have("cuda"):
        torch.set_num_threads(1)                  # CPU ranks share the machine's cores
    names = sys.argv[1].split(",") if len(sys.argv) > 1 else ["topk_by_hand", "indices_wrong"]
    kwargs = dict(item.partition("=")[::2] for item in sys.argv[2:])
    for name in names:
        fn = PARTS[name]
        accepted = inspect.signature(fn).parameters
        result = fn(**{k: runtime.parse_value(v) for k, v in kwargs.items() if k in accepted})
        runtime.report(**{name: result})


if __name__ == "__main__":
    runtime.entrypoint(main)
