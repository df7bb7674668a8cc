"""One launch, many checks: dtrain_lab.parallel.ddp.DDP against PyTorch's DistributedDataParallel and against
one process trained on the whole global batch.

Launched by tests/test_ddp.py at world sizes 2 and 3. For every case the same seed builds three
models: ours (dtrain_lab DDP, each rank on its shard), PyTorch DDP (same shards) and a single model
trained on the whole global batch (computed on every rank). After a few SGD steps (momentum 0.9, so
that a wrong or missing gradient shows) their parameters must agree. Every outcome goes back through
runtime.report; the test asserts on it, so a failing check names itself.
"""
import contextlib
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import TensorDataset

from dtrain_lab.comm.counted import CommTrace
from dtrain_lab.jobs import runtime
from dtrain_lab.data import classification_dataset, global_batch, regression_dataset, shard, token_dataset
from dtrain_lab.parallel.ddp import DDP, DDPError, naive_allreduce_grads
from dtrain_lab.models import MLP, BranchMLP, FrozenMLP, TiedMLP

STEPS = 5
PER_RANK = 4          # samples per rank and step: divisible by the 2 micro-batches of accumulation
LR, MOMENTUM = 0.1, 0.9
THREE_BUCKETS_MB = 0.0004  # 419 bytes: MLP(16, 32, 4) splits into 3 buckets
ONE_PER_PARAM_MB = 1e-7    # every parameter alone in its bucket
DEVICE = torch.device("cpu")  # the rank's device, set in main(): on a GPU machine NCCL and CUDA

CASES = {
    # name: model, data, DDP keyword arguments, gradient-accumulation micro-batches
    "mlp": dict(model="mlp", kw={}),
    "mlp_no_overlap": dict(model="mlp", kw={"overlap": False}),
    "mlp_buckets": dict(model="mlp", kw={"bucket_cap_mb": THREE_BUCKETS_MB}),
    "mlp_buckets_no_overlap": dict(model="mlp", kw={"bucket_cap_mb": THREE_BUCKETS_MB, "overlap": False}),
    "accum": dict(model="mlp", kw={}, accum=2),
    "accum_buckets": dict(model="mlp", kw={"bucket_cap_mb": THREE_BUCKETS_MB}, accum=2),
    "tied": dict(model="tied", kw={}),
    "tied_buckets": dict(model="tied", kw={"bucket_cap_mb": ONE_PER_PARAM_MB}),
    "frozen": dict(model="frozen", kw={}),
    "classify": dict(model="classify", kw={"bucket_cap_mb": ONE_PER_PARAM_MB}),
    "unused": dict(model="branch", kw={"find_unused_parameters": True}),
    "unused_buckets": dict(model="branch", kw={"find_unused_parameters": True, "bucket_cap_mb": ONE_PER_PARAM_MB}),
    "unused_accum": dict(model="branch", kw={"find_unused_parameters": True, "bucket_cap_mb": THREE_BUCKETS_MB},
                         accum=2),
}


def use_branch(rank: int, step: int) -> bool:
    """BranchMLP's schedule: step%3 == 0 every rank uses the branch, 1 only rank 0, 2 no rank."""
    return step % 3 == 0 or (step % 3 == 1 and rank == 0)


def build(kind: str, seed: int = 0):
    if kind in ("mlp", "classify"):
        model = MLP(16, 32, 4, depth=2, seed=seed)
    elif kind == "frozen":
        model = FrozenMLP(16, 32, 4, depth=2, seed=seed)
    elif kind == "tied":
        model = TiedMLP(vocab=16, d_hidden=32, depth=1, seed=seed)
    elif kind == "branch":
        model = BranchMLP(16, 32, 4, seed=seed)
    else:
        raise ValueError(kind)
    return model.to(DEVICE)


def dataset(kind: str):
    if kind == "tied":
        ds = token_dataset(64, seq_len=3, vocab=16, seed=1)
    elif kind == "classify":
        ds = classification_dataset(64, 16, 4, seed=2)
    else:
        ds = regression_dataset(64, 16, 4, seed=3)
    return TensorDataset(*(t.to(DEVICE) for t in ds.tensors))


def loss_fn(kind: str, out, y):
    if kind == "tied":
        return F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))
    if kind == "classify":
        return F.cross_entropy(out, y)
    return F.mse_loss(out, y)


def flat_params(model) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def train(case: dict, variant: str, rank: int, world: int, group=None) -> tuple[torch.nn.Module, dict]:
    """Train ``STEPS`` steps; ``variant`` is "ours", "torch" or "single". Returns the inner module and
    the last DDP statistics (ours only)."""
    kind = case["model"]
    accum = case.get("accum", 1)
    model = build(kind)
    data = dataset(kind)
    if variant == "ours":
        net = DDP(model, process_group=group, **case["kw"])
    elif variant == "torch":
        kw = {k: v for k, v in case["kw"].items() if k in ("bucket_cap_mb", "find_unused_parameters")}
        ids = [DEVICE] if DEVICE.type == "cuda" else None
        net = DistributedDataParallel(model, device_ids=ids, process_group=group, **kw)
    else:
        net = model
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=LR, momentum=MOMENTUM)
    stats = []
    for step in range(STEPS):
        batch = global_batch(data, step, PER_RANK * world)
        opt.zero_grad(set_to_none=True)
        if variant == "single":  # the whole global batch in one process
            x, y = batch
            if kind == "branch":  # per-shard forwards: each shard follows its rank's branch schedule
                out = torch.cat([model(shard(x, r, world), use_branch=use_branch(r, step)) for r in range(world)])
            else:
                out = model(x)
            loss_fn(kind, out, y).backward()
        else:
            x, y = shard(batch, rank, world)
            micro = list(zip(x.chunk(accum), y.chunk(accum)))
            for k, (mx, my) in enumerate(micro):
                last = k == accum - 1
                ctx = net.no_sync() if not last else contextlib.nullcontext()
                with ctx:
                    out = net(mx, use_branch=use_branch(rank, step)) if kind == "branch" else net(mx)
                    (loss_fn(kind, out, my) / accum).backward()
        opt.step()
        if variant == "ours":
            stats.append(net.stats())
    if variant == "ours":
        net.remove_hooks()
    return model, {"stats": stats}


def compare(a: torch.nn.Module, b: torch.nn.Module) -> dict:
    fa, fb = flat_params(a), flat_params(b)
    try:
        torch.testing.assert_close(fa, fb)
        ok = True
    except AssertionError:
        ok = False
    return {"close": ok, "max_abs_diff": float((fa - fb).abs().max())}


def identical_across_ranks(model, group=None) -> bool:
    mine = flat_params(model)
    every = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
    dist.all_gather(every, mine, group=group)
    return all(torch.equal(every[0], t) for t in every)


def check_case(name: str, case: dict, rank: int, world: int) -> dict:
    ours, info = train(case, "ours", rank, world)
    theirs, _ = train(case, "torch", rank, world)
    single, _ = train(case, "single", rank, world)
    last = info["stats"][-1]
    frozen_moved = None
    if case["model"] == "frozen":
        frozen_moved = not torch.equal(ours.layers[0].weight, build("frozen").layers[0].weight)
    return {
        "vs_torch": compare(ours, theirs),
        "vs_single": compare(ours, single),
        "torch_vs_single": compare(theirs, single),
        "identical": identical_across_ranks(ours),
        "num_buckets": last["num_buckets"],
        "num_params": last["num_params"],
        "bucket_params": last["bucket_params"],
        "step_collectives": [s["step_collectives"] for s in info["stats"]],
        "step_bytes": last["step_bytes"],
        "launched_in_backward": last["launched_in_backward"],
        "sync_steps": last["sync_steps"],
        "total_collectives": last["total_collectives"],
        "globally_unused": [s["globally_unused"] for s in info["stats"]],
        "frozen_moved": frozen_moved,
        "tied_once": case["model"] != "tied" or ours.head.weight is ours.embed.weight,
    }


def check_unused_error(rank: int, world: int) -> dict:
    """find_unused_parameters=False and a step that skips the branch on every rank: a clear error at
    the end of backward (after the buckets already launched have finished), then training goes on."""
    out = {}
    for label, kw in (("one_bucket", {}), ("many_buckets", {"bucket_cap_mb": ONE_PER_PARAM_MB}),
                      ("no_overlap", {"overlap": False})):
        model = build("branch")
        net = DDP(model, **kw)
        x, y = shard(global_batch(dataset("branch"), 0, PER_RANK * world), rank, world)
        res = {"raised": False}
        try:
            F.mse_loss(net(x, use_branch=False), y).backward()
        except DDPError as exc:
            res.update(raised=True, type=type(exc).__name__, is_runtime_error=isinstance(exc, RuntimeError),
                       message=str(exc), en=exc.message("en"), zh=exc.message("zh"))
        res["stats_after_error"] = net.stats()
        # the wrapper is usable again: a full step synchronises and the replicas stay equal
        model.zero_grad(set_to_none=True)
        F.mse_loss(net(x, use_branch=True), y).backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= 0.1 * p.grad
        res["recovered_identical"] = identical_across_ranks(model)
        res["recovered_sync_steps"] = net.stats()["sync_steps"]
        out[label] = res
    return out


def check_collective_counts(rank: int, world: int) -> dict:
    """Bucketed DDP issues fewer all-reduces than one per parameter, with the same result; what the
    wrapper counts is what a CommTrace (CommDebugMode's dispatch mode) saw go through c10d."""
    x, y = shard(global_batch(dataset("mlp"), 0, PER_RANK * world), rank, world)
    a, b = build("mlp"), build("mlp")
    with CommTrace() as t_init:
        net = DDP(a)
    with CommTrace() as t_step:
        F.mse_loss(net(x), y).backward()
    F.mse_loss(b(x), y).backward()
    with CommTrace() as t_naive:
        naive = naive_allreduce_grads(b)
    grads_equal = all(torch.allclose(p.grad, q.grad, rtol=1e-6, atol=1e-7) for p, q in zip(a.parameters(), b.parameters()))
    tiny = DDP(build("mlp"), bucket_cap_mb=ONE_PER_PARAM_MB)
    with CommTrace() as t_tiny:
        F.mse_loss(tiny(x), y).backward()
    return {"bucketed": net.stats()["step_collectives"], "bucketed_bytes": net.stats()["step_bytes"],
            "naive": naive["collectives"], "naive_bytes": naive["bytes"], "grads_equal": grads_equal,
            "one_per_param": tiny.stats()["step_collectives"], "num_params": len(list(a.parameters())),
            "init_collectives": net.stats()["init_collectives"], "traced_init": t_init.summary()["counts"],
            "traced_step": t_step.summary(), "traced_naive": t_naive.summary(), "traced_tiny": t_tiny.summary()}


def check_init_broadcast(rank: int) -> dict:
    """Models seeded differently on each rank are equal to rank 0's after wrapping."""
    model = build("mlp", seed=100 + rank)
    before_differs = not torch.equal(flat_params(model), flat_params(build("mlp", seed=100)))
    net = DDP(model)
    return {"before_differs": before_differs if rank else None,
            "equal_to_rank0": torch.equal(flat_params(model), flat_params(build("mlp", seed=100))),
            "init_collectives": net.stats()["init_collectives"]}


def check_subgroup(rank: int, world: int) -> dict:
    """DDP over a process group of the last two ranks (global ranks world-2, world-1)."""
    members = [world - 2, world - 1]
    group = dist.new_group(members)
    if rank not in members:
        return {"member": False}
    r = members.index(rank)
    case = {"model": "mlp", "kw": {"bucket_cap_mb": THREE_BUCKETS_MB}}
    ours, _ = train(case, "ours", r, 2, group)
    theirs, _ = train(case, "torch", r, 2, group)
    single, _ = train(case, "single", r, 2, group)
    return {"member": True, "vs_torch": compare(ours, theirs), "vs_single": compare(ours, single),
            "identical": identical_across_ranks(ours, group)}


def check_group_of_one(rank: int, world: int) -> dict:
    """A process group of one member: DDP is the plain module (no hooks, no collectives)."""
    groups = [dist.new_group([r]) for r in range(world)]  # every rank creates every group
    model = build("mlp")
    net = DDP(model, process_group=groups[rank])
    x = torch.randn(3, 16, device=DEVICE)
    same = torch.equal(net(x), model(x))
    net(x).sum().backward()
    return {"distributed": net.distributed, "same_output": same, "hooks": len(net._hook_handles),
            "collectives": net.stats()["total_collectives"], "grad_present": model.layers[0].weight.grad is not None}


def check_buffer_broadcasts(rank: int, world: int) -> dict:
    """When buffers are broadcast: before the first forward, and before a forward that follows a
    synchronised training forward -- never because of an eval/no_grad forward (PyTorch's rule)."""
    from dtrain_lab.parallel.ddp import DDP

    torch.manual_seed(rank)   # different BatchNorm running stats per rank before the broadcast
    model = DDP(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4)))
    x = torch.randn(8, 4)
    log = []

    def fwd(train: bool, grad: bool, label: str):
        model.train(train)
        before = model.total_collectives
        with torch.set_grad_enabled(grad):
            out = model(x)
        if grad:
            out.sum().backward()
        log.append((label, model.total_collectives - before - (model.stats()["step_collectives"] if grad else 0)))

    fwd(True, True, "first train")          # broadcast (first forward)
    fwd(True, True, "second train")         # broadcast (previous was a training forward)
    fwd(False, False, "eval after train")   # broadcast (previous was a training forward)
    fwd(False, False, "eval after eval")    # none: previous forward was under no_grad
    fwd(True, True, "train after eval")     # none, as PyTorch
    return {"log": log}


def main() -> None:
    global DEVICE
    rt = runtime.current()
    DEVICE = torch.device(rt.device)
    rank, world = rt.rank, rt.world_size
    runtime.report(rank=rank, world_size=world)
    timings = {}

    def timed(key, fn, *a):
        t0 = time.perf_counter()
        out = fn(*a)
        timings[key] = round(time.perf_counter() - t0, 3)
        return out

    runtime.report(cases={name: timed(name, check_case, name, case, rank, world) for name, case in CASES.items()})
    runtime.report(unused_error=timed("unused_error", check_unused_error, rank, world))
    runtime.report(counts=timed("counts", check_collective_counts, rank, world))
    runtime.report(init=timed("init", check_init_broadcast, rank))
    runtime.report(subgroup=timed("subgroup", check_subgroup, rank, world))
    runtime.report(group_of_one=timed("group_of_one", check_group_of_one, rank, world))
    runtime.report(buffers=timed("buffers", check_buffer_broadcasts, rank, world))
    runtime.report(timings=timings, last=True)

if __name__ == "__main__":
    runtime.entrypoint(main)
