"""One launch, many checks: dtrain_lab.parallel.compression's hooks against PyTorch's, against hand-computed
values, and their byte counts against the torch.distributed calls they really make.

Launched by tests/test_compression.py at world sizes 2 and 3 (the training comparison of error
feedback runs at 2 only). Every outcome goes back through runtime.report; the test asserts on it.

Byte tracing: :func:`trace_collectives` is a :class:`dtrain_lab.comm.counted.CommTrace`, PyTorch's
``CommDebugMode`` dispatch mode extended to record, for every c10d operation dispatched on this
thread, the bytes of the tensor this rank passes in (nothing in ``torch.distributed`` is replaced).
What a hook's state claims is compared with the trace. A dispatch mode is per thread: PyTorch's
``powerSGD_hook`` issues its P and Q all-reduces from future callbacks, which may run on gloo's
worker threads, so its bytes are checked against PyTorch's own statistics instead.
"""
import contextlib
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as torch_psgd
from torch.nn.parallel import DistributedDataParallel

from dtrain_lab.comm.counted import CommTrace
from dtrain_lab.demos.compression_run import train_with_compression
from dtrain_lab.jobs import runtime
from dtrain_lab.parallel import compression as C
from dtrain_lab.data import global_batch, regression_dataset, shard
from dtrain_lab.parallel.ddp import DDP
from dtrain_lab.models import MLP

STEPS = 5
TRAIN_STEPS = 80   # check_training: steps per method
PER_RANK = 8
THREE_BUCKETS_MB = 0.0004  # MLP(16, 32, 4) splits into 3 buckets in dtrain_lab's DDP


# ------------------------------------------------------------------------------------ helpers
@contextlib.contextmanager
def trace_collectives():
    """``(op, bytes this rank passes in)`` of every c10d operation dispatched inside (CommTrace)."""
    with CommTrace() as trace:
        yield trace.calls


def summarize(calls) -> dict:
    by_op: dict[str, int] = {}
    counts: dict[str, int] = {}
    for op, n in calls:
        by_op[op] = by_op.get(op, 0) + n
        counts[op] = counts.get(op, 0) + 1
    return {"calls": len(calls), "bytes": sum(n for _, n in calls), "by_op": by_op, "counts": counts}


class FakeBucket:
    """A GradBucket stand-in for calling a hook directly: one flat buffer, per-"parameter" views."""

    def __init__(self, grads: list[torch.Tensor], params: list[torch.Tensor], index: int = 0, last: bool = True):
        self._buf = torch.cat([g.reshape(-1) for g in grads]).clone()
        self._params, self._index, self._last = params, index, last

    def buffer(self):
        return self._buf

    def gradients(self):
        out, o = [], 0
        for p in self._params:
            out.append(self._buf[o:o + p.numel()].view_as(p))
            o += p.numel()
        return out

    def parameters(self):
        return list(self._params)

    def index(self):
        return self._index

    def is_last(self):
        return self._last


def flat_params(model) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def same_on_all_ranks(t: torch.Tensor) -> bool:
    every = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(every, t)
    return all(torch.equal(every[0], x) for x in every)


def compare(a: torch.Tensor, b: torch.Tensor) -> dict:
    return {"equal": bool(torch.equal(a, b)), "max_abs_diff": float((a - b).abs().max()),
            "close": bool(torch.allclose(a, b, rtol=1e-5, atol=1e-6))}


def train(wrapper: str, state=None, hook=None, steps: int = STEPS, bucket_cap_mb: float = 25.0, trace=False,
          momentum: float = 0.9):
    """Train MLP(16, 32, 4) ``steps`` SGD steps with ``hook`` through ``wrapper`` ("ours"/"torch");
    returns (flat parameters, traced collectives of the training steps or None, numel)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    model = MLP(16, 32, 4, depth=2, seed=0)
    if wrapper == "ours":
        net = DDP(model, bucket_cap_mb=bucket_cap_mb)
    else:
        net = DistributedDataParallel(model, bucket_cap_mb=bucket_cap_mb)
    if hook is not None:
        net.register_comm_hook(state, hook)
    data = regression_dataset(64, 16, 4, seed=3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=momentum)
    ctx = trace_collectives() if trace else contextlib.nullcontext([])
    with ctx as calls:
        for step in range(steps):
            x, y = shard(global_batch(data, step, PER_RANK * world), rank, world)
            opt.zero_grad(set_to_none=True)
            F.mse_loss(net(x), y).backward()
            opt.step()
    extra = {"hook_calls": net.stats()["hook_calls"], "step_collectives": net.stats()["step_collectives"]} \
        if wrapper == "ours" else {}
    if wrapper == "ours":
        net.remove_hooks()
    return flat_params(model), (list(calls) if trace else None), extra


NUMEL = sum(p.numel() for p in MLP(16, 32, 4, depth=2, seed=0).parameters())
SHAPES = [p.shape for p in MLP(16, 32, 4, depth=2, seed=0).parameters()]


# ------------------------------------------------------------------------------------ checks
def check_cast() -> dict:
    """fp16/bf16: ours equal PyTorch's hooks (bit for bit) and send 2 bytes per entry."""
    out = {}
    plain, _, _ = train("torch")
    for name, ours_hook, theirs_hook in (("fp16", C.fp16_hook, default_hooks.fp16_compress_hook),
                                         ("bf16", C.bf16_hook, default_hooks.bf16_compress_hook)):
        st = C.CommState()
        ours, calls, _ = train("ours", st, ours_hook, trace=True)
        ours_torch_ddp, _, _ = train("torch", C.CommState(), ours_hook)
        # PyTorch's DDP refuses a hook named bf16_compress_hook without CUDA+NCCL: run theirs on our DDP
        theirs, their_calls, _ = train("ours", None, theirs_hook, trace=True)
        out[name] = {"vs_torch_hook": compare(ours, theirs), "torch_ddp_vs_ours_ddp": compare(ours_torch_ddp, ours),
                     "vs_uncompressed": compare(ours, plain), "trace": summarize(calls),
                     "their_trace": summarize(their_calls), "state": st.summary(), "step_bytes": st.step_bytes}
    # fp16 also on PyTorch's DDP with PyTorch's hook
    theirs_tddp, _, _ = train("torch", None, default_hooks.fp16_compress_hook)
    out["fp16"]["torch_ddp_torch_hook_vs_ours"] = compare(theirs_tddp, train("torch", C.CommState(), C.fp16_hook)[0])
    # overflow: fp16 max is 65504; dividing before the sum keeps 40000 + 40000 representable
    st = C.CommState()
    big = torch.full((4,), 40000.0)
    C.cast_allreduce(big, torch.float16, st)
    out["no_overflow"] = bool(torch.isfinite(big).all()) and abs(float(big[0]) - 40000.0) < 40
    return out


def check_allreduce_hook() -> dict:
    """The baseline hook equals DDP without a hook, and counts numel × 4 bytes per step."""
    plain, _, _ = train("torch")
    ours_plain, _, _ = train("ours")
    st = C.CommState()
    hooked, calls, extra = train("ours", st, C.allreduce_hook, trace=True)
    st2 = C.CommState()
    hooked_torch, calls2, _ = train("torch", st2, C.allreduce_hook, trace=True)
    return {"vs_no_hook": compare(hooked, ours_plain), "torch_vs_no_hook": compare(hooked_torch, plain),
            "trace": summarize(calls), "state": st.summary(), "trace_torch": summarize(calls2),
            "state_torch": st2.summary(), "ddp_stats": extra, "numel": NUMEL, "steps": STEPS}


def check_topk_hand(rank: int, world: int) -> dict:
    """k = 1 on a 4-entry gradient, two steps, values computable by hand (see the test)."""
    g = {0: [3.0, 1.0, -2.0, 0.5], 1: [0.0, -4.0, 1.0, 1.0]}.get(rank, [0.0, 0.0, 0.0, 0.0])
    param = torch.zeros(4)
    out = {}
    for label, dtype in (("int32", torch.int32), ("int64", torch.int64)):
        st = C.TopKState(ratio=0.25, index_dtype=dtype)                # k = ceil(0.25 × 4) = 1
        results, residuals = [], []
        with trace_collectives() as calls:
            for _ in range(2):
                b = FakeBucket([torch.tensor(g)], [param])
                results.append(C.topk_hook(st, b).wait().tolist())
                residuals.append(st.residuals[id(param)].tolist())
        out[label] = {"results": results, "residuals": residuals, "trace": summarize(calls),
                      "state": st.summary(), "k": st.k_for(4)}
    # without error feedback nothing is remembered: both steps send the same entry
    st = C.TopKState(ratio=0.25, error_feedback=False)
    res = [C.topk_hook(st, FakeBucket([torch.tensor(g)], [param])).wait().tolist() for _ in range(2)]
    out["noef"] = {"results": res, "residuals": len(st.residuals)}
    return out


def check_topk_properties(rank: int, world: int) -> dict:
    """Error feedback loses nothing (it delays): Σ_t result_t + mean_i residual_i = Σ_t mean_i g_i,t.
    k = numel equals the plain all-reduce; all-reducing the indices (WRONG) does not."""
    gen = torch.Generator().manual_seed(100 + rank)
    param = torch.zeros(50)
    out = {}
    for ef in (True, False):
        st = C.TopKState(ratio=0.1, error_feedback=ef)
        sum_results = torch.zeros(50)
        sum_grads = torch.zeros(50)
        for _ in range(10):
            g = torch.randn(50, generator=gen)
            sum_grads += g
            sum_results += C.topk_hook(st, FakeBucket([g], [param])).wait()
        residual = st.residuals.get(id(param), torch.zeros(50)).clone()
        dist.all_reduce(residual)
        dist.all_reduce(sum_grads)
        gap = (sum_results + residual / world - sum_grads / world).abs().max()
        out["ef" if ef else "noef"] = {"conservation_gap": float(gap), "identical": same_on_all_ranks(sum_results)}
    # k = numel: the plain all-reduce, exactly (2 ranks) / to rounding (3)
    t = torch.randn(1000, generator=gen)
    st = C.CommState()
    dense, sent = C.topk_sparse_allreduce(t.clone(), 1000, st)
    ref = t.clone()
    dist.all_reduce(ref)
    ref /= world
    out["k_full"] = {**compare(dense, ref), "sent_is_input": bool(torch.equal(sent, t))}
    # the hook with ratio=1 inside training, on both wrappers: same parameters as no hook
    plain, _, _ = train("torch")
    out["ratio1_torch_ddp"] = compare(train("torch", C.TopKState(ratio=1.0), C.topk_hook)[0], plain)
    out["ratio1_ours_ddp"] = compare(train("ours", C.TopKState(ratio=1.0), C.topk_hook)[0], plain)
    # WRONG: all-reduce the value and index tensors as if dense
    t = torch.randn(200, generator=gen)
    right, _ = C.topk_sparse_allreduce(t.clone(), 20, C.CommState())
    st_w = C.CommState()
    with trace_collectives() as calls:
        wrong = C.topk_allreduce_indices_WRONG(t.clone(), 20, st_w)
    idx, _ = C.topk_select(t, 20)
    every = [torch.empty_like(idx) for _ in range(world)]
    dist.all_gather(every, idx)
    chosen = torch.zeros(200, dtype=torch.bool)
    for i in every:
        chosen[i] = True
    out["wrong"] = {**compare(wrong, right), "nonzero_where_nobody_sent": int(((wrong != 0) & ~chosen).sum()),
                    "right_nonzero_where_nobody_sent": int(((right != 0) & ~chosen).sum()),
                    "trace": summarize(calls), "state": st_w.summary()}
    return out


def check_topk_bytes() -> dict:
    """Top-k through both wrappers: traced bytes = claimed = k × (4 + index bytes) per bucket and step."""
    out = {}
    for wrapper, cap in (("ours", 25.0), ("torch", 25.0), ("ours", THREE_BUCKETS_MB)):
        st = C.TopKState(ratio=0.05)
        _, calls, extra = train(wrapper, st, C.topk_hook, bucket_cap_mb=cap, trace=True)
        key = wrapper if cap == 25.0 else "ours_3_buckets"
        out[key] = {"trace": summarize(calls), "state": st.summary(), "step_bytes": st.step_bytes,
                    "ddp_stats": extra}
    return out


PSGD_CONFIGS = [  # rank, start_iter, min_compression_rate, use_error_feedback, warm_start
    dict(rank=1, start=2, rate=2, ef=True, warm=True),
    dict(rank=2, start=3, rate=2, ef=True, warm=True),
    dict(rank=4, start=2, rate=2, ef=True, warm=True),
    dict(rank=1, start=2, rate=2, ef=False, warm=False),
    dict(rank=3, start=2, rate=1, ef=True, warm=False),
]


def _states(cfg, seed=0):
    ours = C.PowerSGDState(matrix_approximation_rank=cfg["rank"], start_iter=cfg["start"],
                           min_compression_rate=cfg["rate"], use_error_feedback=cfg["ef"],
                           warm_start=cfg["warm"], random_seed=seed)
    theirs = torch_psgd.PowerSGDState(None, matrix_approximation_rank=cfg["rank"], start_powerSGD_iter=cfg["start"],
                                      min_compression_rate=cfg["rate"], use_error_feedback=cfg["ef"],
                                      warm_start=cfg["warm"], random_seed=seed)
    return ours, theirs


def serial_torch_powersgd(state, bucket):
    """PyTorch's powerSGD_hook, waited for before the next bucket's hook starts. Unwrapped, with
    several buckets on gloo it deadlocks (torch 2.13, CPU; with its own DDP too): it issues the P and
    Q all-reduces from future callbacks, which run on gloo's worker threads in no fixed order, so the
    ranks can issue the buckets' collectives in different orders."""
    fut = torch_psgd.powerSGD_hook(state, bucket)
    fut.wait()
    return fut


def check_powersgd() -> dict:
    """Ours against PyTorch's powerSGD_hook, same settings and seed, on both wrappers."""
    out = []
    for cfg in PSGD_CONFIGS:
        res = {"cfg": cfg}
        ours_st, theirs_st = _states(cfg)
        theirs, _, _ = train("torch", theirs_st, torch_psgd.powerSGD_hook)
        ours, calls, _ = train("torch", ours_st, C.powersgd_hook, trace=True)
        res["torch_ddp"] = compare(ours, theirs)
        res["trace"] = summarize(calls)
        res["state"] = ours_st.summary()
        res["step_bytes"] = ours_st.step_bytes
        res["iter"], res["their_iter"] = ours_st.iter, theirs_st.iter
        res["their_numel_after"] = theirs_st.total_numel_after_compression
        res["their_numel_before"] = theirs_st.total_numel_before_compression
        res["expected_elements"] = ours_st.compressed_elements(SHAPES)
        o2, t2 = _states(cfg)
        res["ours_ddp"] = compare(train("ours", o2, C.powersgd_hook)[0], theirs)
        res["ours_ddp_torch_hook"] = compare(train("ours", t2, torch_psgd.powerSGD_hook)[0], theirs)
        # several buckets (our DDP's bucketing): Q drawn per bucket in the same order as PyTorch's.
        # PyTorch's hook is serialised (see serial_torch_powersgd) or it deadlocks on gloo.
        o3, t3 = _states(cfg)
        res["three_buckets"] = compare(train("ours", o3, C.powersgd_hook, bucket_cap_mb=THREE_BUCKETS_MB)[0],
                                       train("ours", t3, serial_torch_powersgd, bucket_cap_mb=THREE_BUCKETS_MB)[0])
        out.append(res)
    # a different seed changes the result (the random Q matters)
    cfg = PSGD_CONFIGS[0]
    a = train("torch", _states(cfg, seed=0)[0], C.powersgd_hook)[0]
    b = train("torch", _states(cfg, seed=1)[0], C.powersgd_hook)[0]
    extra = {"seed_matters": not torch.equal(a, b)}
    # start_iter = 0 compresses from the first step on our DDP (PyTorch's state refuses < 2 with EF)
    st = C.PowerSGDState(matrix_approximation_rank=1, start_iter=0)
    train("ours", st, C.powersgd_hook)
    extra["start0_step_bytes"] = st.step_bytes
    return {"configs": out, **extra}


def check_powersgd_lowrank(rank: int, world: int) -> dict:
    """A gradient matrix of rank 1, the same on every rank, is reconstructed by rank-1 PowerSGD; a
    rank-2 one is not, and the error it leaves is remembered and added to the next step."""
    g = torch.Generator().manual_seed(7)
    u, v = torch.randn(16, 1, generator=g), torch.randn(8, 1, generator=g)
    m1 = u @ v.T
    param = torch.zeros(16, 8)
    st = C.PowerSGDState(matrix_approximation_rank=1, start_iter=0)
    got = C.powersgd_hook(st, FakeBucket([m1], [param])).wait().view(16, 8)
    res = {"rank1": compare(got, m1), "error_max": float(st.errors[id(param)].abs().max())}
    u2, v2 = torch.randn(16, 1, generator=g), torch.randn(8, 1, generator=g)
    m2 = m1 + u2 @ v2.T
    st = C.PowerSGDState(matrix_approximation_rank=1, start_iter=0)
    got2 = C.powersgd_hook(st, FakeBucket([m2], [param])).wait().view(16, 8)
    err = st.errors[id(param)].view(16, 8)
    res["rank2_error_is_input_minus_output"] = compare(err, m2 - got2)
    res["rank2_error_norm"] = float(err.norm())
    # next step with a zero gradient: the input is the error itself
    zero = torch.zeros(16, 8)
    got3 = C.powersgd_hook(st, FakeBucket([zero], [param])).wait().view(16, 8)
    res["second_step_nonzero"] = float(got3.abs().max())
    # a 1-D tensor (a bias) is sent uncompressed: exactly the average
    bias = torch.full((8,), float(rank + 1))
    st = C.PowerSGDState(matrix_approximation_rank=1, start_iter=0)
    got4 = C.powersgd_hook(st, FakeBucket([bias], [torch.zeros(8)])).wait()
    res["bias_average"] = got4.tolist()
    res["bias_bytes"] = st.bytes_sent
    return res


def check_training(rank: int, world: int) -> dict:
    """train_with_compression: loss and bytes; error feedback keeps top-k near the uncompressed loss."""
    runs = {}
    for method in ("none", "topk", "topk_noef", "powersgd"):
        runs[method] = train_with_compression(method, TRAIN_STEPS, ratio=0.01, rank=1, start_iter=10)
    out = {m: {"final_loss": r["loss"][-1], "first_loss": r["loss"][0], "ratio": r["ratio"],
               "bytes_last": r["bytes"][-1], "bytes_len": len(r["bytes"]), "monotone": r["bytes"] == sorted(r["bytes"]),
               "baseline_last": r["baseline_bytes"][-1], "wire_last": r["wire_bytes"][-1],
               "params": r["params"]} for m, r in runs.items()}
    loss = torch.tensor([runs["topk"]["loss"][-1]])
    out["loss_same_on_ranks"] = same_on_all_ranks(loss)
    torch_run = train_with_compression("topk", 20, ddp="torch")
    ours_run = train_with_compression("topk", 20, ddp="ours")
    out["torch_vs_ours_wrapper"] = {"loss_equal": torch_run["loss"] == ours_run["loss"],
                                    "bytes_equal": torch_run["bytes"] == ours_run["bytes"]}
    return out


def main() -> None:
    rt = runtime.current()
    torch.set_num_threads(1)
    rank, world = rt.rank, rt.world_size
    runtime.report(rank=rank, world_size=world, numel=NUMEL)
    timings = {}

    def timed(key, fn, *a):
        t0 = time.perf_counter()
        result = fn(*a)
        timings[key] = round(time.perf_counter() - t0, 3)
        runtime.report(**{key: result})

    timed("cast", check_cast)
    timed("allreduce", check_allreduce_hook)
    timed("topk_hand", check_topk_hand, rank, world)
    timed("topk_props", check_topk_properties, rank, world)
    timed("topk_bytes", check_topk_bytes)
    timed("powersgd", check_powersgd)
    timed("powersgd_lowrank", check_powersgd_lowrank, rank, world)
    if world == 2:
        timed("training", check_training, rank, world)
    runtime.report(timings=timings, last=True)


if __name__ == "__main__":
    runtime.entrypoint(main)
