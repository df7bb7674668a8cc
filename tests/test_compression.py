"""dtrain_lab.parallel.compression: hooks equal PyTorch's, hand-computed top-k, error feedback, and the bytes
each hook claims equal the bytes it passes to torch.distributed.

One launch per world size (2, 3) runs every multi-process check (tests/workers/compression_checks.py;
the training comparison runs at 2 only). The in-process tests at the end cover argument checking,
the byte formulas and the pieces that need no process group.

Exact or close? With 2 ranks every comparison here is exact (``torch.equal``): a + b is the same
whichever rank's value comes first. With 3 ranks gloo's ring all-reduce adds the three values of an
element in an order that depends on the element's position in the buffer; PyTorch's DDP lays out its
first iteration's bucket in registration order, ours in reverse (PyTorch's, too, from iteration 2 on),
so comparisons *across the two wrappers* round differently in the last bit and are checked with a
tolerance. Comparisons of two hooks on the same wrapper stay exact at 3 ranks.
"""
import math

import pytest
import torch

from conftest import WORKERS, job_metrics
from forkjob import fork_launch

WORLD_SIZES = [2, 3]
STEPS = 5                 # tests/workers/compression_checks.py: STEPS
TRAIN_STEPS = 80          # compression_checks.TRAIN_STEPS
NUMEL = 4 * (16 * 32 + 32 + 32 * 32 + 32 + 32 * 4 + 4) // 4   # MLP(16, 32, 4, depth=2): 1732 entries
MLP_SHAPES = [(32, 16), (32,), (32, 32), (32,), (4, 32), (4,)]
TRAIN_NUMEL = 16 * 64 + 64 + 64 * 64 + 64 + 64 * 4 + 4      # MLP(16, 64, 4) of train_with_compression: 5508


@pytest.fixture(scope="module")
def results():
    import uuid


    return {n: fork_launch(str(WORKERS / "compression_checks.py"), nproc=n, timeout=400, quiet=True,
                           env={"DTRAIN_TEST_TAG": uuid.uuid4().hex})
            for n in WORLD_SIZES}


def metrics(results, n):
    return job_metrics(results[n], n)


def exact_or_close(c: dict, n: int, what: str) -> None:
    """Exact with 2 ranks; to rounding with 3 (across wrappers: see the module docstring)."""
    if n == 2:
        assert c["equal"], f"{what}: max abs diff {c['max_abs_diff']}"
    else:
        assert c["close"] and c["max_abs_diff"] < 1e-6, f"{what}: max abs diff {c['max_abs_diff']}"


def assert_bytes_traced(state: dict, trace: dict, torch_ddp: bool = False) -> None:
    """What the state claims equals what torch.distributed was handed, call for call, op by op.

    Under PyTorch's DistributedDataParallel the trace also holds the wrapper's own collectives: after
    the first iteration its reducer rebuilds the buckets and broadcasts the new layout from rank 0
    (two broadcasts: bucket indices, bucket sizes). They are not the hook's, and are set apart."""
    trace = dict(trace, by_op=dict(trace["by_op"]), counts=dict(trace["counts"]))
    if torch_ddp:
        assert trace["counts"].pop("broadcast") == 2
        trace["bytes"] -= trace["by_op"].pop("broadcast")
        trace["calls"] -= 2
    assert set(trace["by_op"]) <= {"all_reduce", "all_gather"}, trace
    assert state["bytes_sent"] == trace["bytes"]
    assert state["collectives"] == trace["calls"]
    assert {k: v for k, v in state["bytes_by_op"].items() if v} == trace["by_op"]


def hook_calls(trace: dict, torch_ddp: bool = False) -> int:
    return trace["calls"] - (trace["counts"].get("broadcast", 0) if torch_ddp else 0)


def ring_wire(op: str, payload: float, p: int) -> float:
    return 2 * (p - 1) / p * payload if op == "all_reduce" else (p - 1) * payload


@pytest.mark.timeout(600)
@pytest.mark.parametrize("n", WORLD_SIZES)
def test_job_ok(results, n):
    for rank, m in metrics(results, n).items():
        assert m["rank"] == rank and m["world_size"] == n and m["numel"] == NUMEL


@pytest.mark.timeout(600)
@pytest.mark.parametrize("n", WORLD_SIZES)
def test_fp16_bf16_equal_pytorch_hooks_and_send_half(results, n):
    for m in metrics(results, n).values():
        c = m["cast"]
        assert c["no_overflow"] is True                      # divide before the sum: 2 × 40000 fits
        for name in ("fp16", "bf16"):
            h = c[name]
            assert h["vs_torch_hook"]["equal"], (name, h["vs_torch_hook"])   # same wrapper: bit for bit
            if n == 2:
                assert h["torch_ddp_vs_ours_ddp"]["equal"], name
            else:  # a different summation order, seen through 16-bit rounding (bf16: 8-bit mantissa)
                assert h["torch_ddp_vs_ours_ddp"]["max_abs_diff"] < {"fp16": 2e-4, "bf16": 2e-3}[name], name
            assert not h["vs_uncompressed"]["equal"] and h["vs_uncompressed"]["max_abs_diff"] < 1e-2
            # bytes: 2 per entry, one all-reduce per step; the same as PyTorch's hook sends
            assert_bytes_traced(h["state"], h["trace"])
            assert h["trace"] == h["their_trace"]
            assert h["step_bytes"] == [2 * NUMEL] * STEPS
            assert h["state"]["baseline_bytes"] == 4 * NUMEL * STEPS and h["state"]["ratio"] == 0.5
            assert h["state"]["wire_bytes"] == pytest.approx(ring_wire("all_reduce", 2 * NUMEL * STEPS, n))
        assert c["fp16"]["torch_ddp_torch_hook_vs_ours"]["equal"]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("n", WORLD_SIZES)
def test_allreduce_hook_is_the_baseline(results, n):
    for m in metrics(results, n).values():
        a = m["allreduce"]
        exact_or_close(a["vs_no_hook"], n, "our DDP, hook vs none")
        exact_or_close(a["torch_vs_no_hook"], n, "PyTorch DDP, hook vs none")
        for s, t in (("state", "trace"), ("state_torch", "trace_torch")):
            assert_bytes_traced(a[s], a[t], torch_ddp=t == "trace_torch")
            assert a[s]["bytes_sent"] == a[s]["baseline_bytes"] == 4 * NUMEL * STEPS
            assert a[s]["steps"] == STEPS and a[s]["ratio"] == 1.0
        # with a hook our DDP issues no all-reduce of its own: one hook call per bucket
        assert a["ddp_stats"] == {"hook_calls": 1, "step_collectives": 0}


@pytest.mark.timeout(600)
@pytest.mark.parametrize("n", WORLD_SIZES)
def test_topk_hand_computed_with_error_feedback(results, n):
    # rank 0: g = [3, 1, -2, 0.5], rank 1: g = [0, -4, 1, 1], others 0; k = 1; the same g twice.
    # step 1: rank 0 sends 3 at 0, rank 1 sends -4 at 1          -> [3, -4, 0, 0] / n
    #         residuals: [0, 1, -2, 0.5] and [0, 0, 1, 1]
    # step 2: inputs g + residual: [3, 2, -4, 1] and [0, -4, 2, 2]
    #         rank 0 sends -4 at 2, rank 1 sends -4 at 1          -> [0, -4, -4, 0] / n
    #         residuals: [3, 2, 0, 1] and [0, 0, 2, 2]
    expected = [[3 / n, -4 / n, 0.0, 0.0], [0.0, -4 / n, -4 / n, 0.0]]
    residuals = {0: [[0, 1, -2, 0.5], [3, 2, 0, 1]], 1: [[0, 0, 1, 1], [0, 0, 2, 2]]}
    for rank, m in metrics(results, n).items():
        h = m["topk_hand"]
        for label, index_bytes in (("int32", 4), ("int64", 8)):
            r = h[label]
            assert r["k"] == 1
            for got, want in zip(r["results"], expected):
                assert got == pytest.approx(want, abs=1e-7)
            assert r["residuals"] == residuals.get(rank, [[0.0] * 4, [0.0] * 4])
            # per step: 1 value (4 bytes) + 1 index, two all-gathers; never an all-reduce
            assert_bytes_traced(r["state"], r["trace"])
            assert r["state"]["bytes_sent"] == 2 * (4 + index_bytes)
            assert r["state"]["bytes_by_op"]["all_reduce"] == 0 and r["trace"]["calls"] == 4
            assert r["state"]["wire_bytes"] == pytest.approx(ring_wire("all_gather", 2 * (4 + index_bytes), n))
        # without error feedback the same entries win every step; nothing is remembered
        assert h["noef"]["results"][0] == h["noef"]["results"][1] == pytest.approx(expected[0], abs=1e-7)
        assert h["noef"]["residuals"] == 0


@pytest.mark.timeout(600)
@pytest.mark.parametrize("n", WORLD_SIZES)
def test_topk_error_feedback_delays_but_loses_nothing(results, n):
    for m in metrics(results, n).values():
        p = m["topk_props"]
        # Σ_t result_t + mean residual = Σ_t mean gradient: with EF, to rounding; without, far off
        assert p["ef"]["conservation_gap"] < 1e-5
        assert p["noef"]["conservation_gap"] > 0.5
        assert p["ef"]["identical"] and p["noef"]["identical"]        # every rank gets the same average


@pytest.mark.timeout(600)
@pytest.mark.parametrize("n", WORLD_SIZES)
def test_topk_with_k_numel_is_the_plain_all_reduce(results, n):
    for m in metrics(results, n).values():
        p = m["topk_props"]
        exact_or_close(p["k_full"], n, "k = numel vs dist.all_reduce")
        assert p["k_full"]["sent_is_input"]
        exact_or_close(p["ratio1_torch_ddp"], n, "ratio=1 hook on PyTorch DDP vs no hook")
        exact_or_close(p["ratio1_ours_ddp"], n, "ratio=1 hook on our DDP vs PyTorch DDP without hook")


@pytest.mark.timeout(600)
@pytest.mark.parametrize("n", WORLD_SIZES)
def test_all_reducing_indices_is_wrong(results, n):
    for m in metrics(results, n).values():
        w = m["topk_props"]["wrong"]
        assert not w["close"] and w["max_abs_diff"] > 0.1
        assert w["nonzero_where_nobody_sent"] > 0                     # values land where no rank sent any
        assert w["right_nonzero_where_nobody_sent"] == 0
        assert_bytes_traced(w["state"], w["trace"])
        assert w["trace"]["by_op"] == {"all_reduce": 20 * 4 + 20 * 8}  # k values + k int64 indices


@pytest.mark.timeout(600)
@pytest.mark.parametrize("n", WORLD_SIZES)
def test_topk_bytes_equal_the_traced_collectives(results, n):
    k = math.ceil(0.05 * NUMEL)                                        # 87 entries of one bucket
    # three buckets of our DDP (reverse order: layers.4, layers.2, layers.0): k per bucket
    k3 = sum(math.ceil(0.05 * b) for b in (4 + 4 * 32, 32 + 32 * 32, 32 + 32 * 16))
    for m in metrics(results, n).values():
        t = m["topk_bytes"]
        for key, kk, buckets in (("ours", k, 1), ("torch", k, 1), ("ours_3_buckets", k3, 3)):
            r = t[key]
            assert_bytes_traced(r["state"], r["trace"], torch_ddp=key == "torch")
            assert r["step_bytes"] == [kk * (4 + 4)] * STEPS, key
            assert hook_calls(r["trace"], key == "torch") == 2 * buckets * STEPS
            assert set(r["trace"]["by_op"]) - {"broadcast"} == {"all_gather"}
            assert r["state"]["baseline_bytes"] == 4 * NUMEL * STEPS
            assert r["state"]["ratio"] == pytest.approx(kk * 8 / (4 * NUMEL))
            assert r["state"]["wire_bytes"] == pytest.approx((n - 1) * kk * 8 * STEPS)
        assert t["ours_3_buckets"]["ddp_stats"]["hook_calls"] == 3


def powersgd_elements(rank: int, min_rate: float) -> int:
    """Elements PowerSGD sends per compressed step for MLP(16, 32, 4): (n + m)·r per compressed
    matrix, n·m for vectors and matrices not worth it."""
    total = 0
    for s in MLP_SHAPES:
        n, m = s[0], (s[1] if len(s) > 1 else 1)
        r = min(n, m, rank)
        total += (n + m) * r if (n + m) * r * min_rate < n * m else n * m
    return total


@pytest.mark.timeout(600)
@pytest.mark.parametrize("n", WORLD_SIZES)
def test_powersgd_matches_pytorch_powersgd_hook(results, n):
    """Our PowerSGD against torch's powerSGD_hook with the same rank, start iteration,
    min_compression_rate, error feedback, warm start and seed: bit-identical parameters after 5 SGD
    steps when both run on the same wrapper (same random Q from the same numpy seed, same
    Gram-Schmidt/QR, matrix products as batches of one like PyTorch's bmm). Across wrappers: exact
    with 2 ranks, to rounding with 3 (module docstring)."""
    for m in metrics(results, n).values():
        p = m["powersgd"]
        assert len(p["configs"]) == 5
        for c in p["configs"]:
            cfg = c["cfg"]
            assert c["torch_ddp"]["equal"], (cfg, c["torch_ddp"])              # same wrapper: exact
            assert c["three_buckets"]["equal"], (cfg, c["three_buckets"])
            exact_or_close(c["ours_ddp"], n, f"{cfg} our DDP + ours vs PyTorch DDP + theirs")
            exact_or_close(c["ours_ddp_torch_hook"], n, f"{cfg} our DDP + theirs vs PyTorch DDP + theirs")
            # bytes: plain all-reduce before start_iter, then uncompressed + P + Q
            after = powersgd_elements(cfg["rank"], cfg["rate"])
            assert tuple(c["expected_elements"]) == (NUMEL, after)
            compressed_steps = STEPS - cfg["start"]
            assert c["step_bytes"] == [4 * NUMEL] * cfg["start"] + [4 * after] * compressed_steps
            assert_bytes_traced(c["state"], c["trace"], torch_ddp=True)
            # as many bytes as PyTorch's hook: its own statistics (its P and Q all-reduces run in future
            # callbacks, possibly on gloo's threads, out of reach of a per-thread trace)
            assert c["their_numel_after"] == after * compressed_steps
            assert c["their_numel_before"] == NUMEL * compressed_steps
            assert c["iter"] == c["their_iter"] == STEPS
            # calls: one per vanilla step, then 3 per compressed step (uncompressed, P, Q)
            assert hook_calls(c["trace"], torch_ddp=True) == cfg["start"] + 3 * compressed_steps
        assert p["seed_matters"] is True
        assert p["start0_step_bytes"] == [4 * powersgd_elements(1, 2)] * STEPS


@pytest.mark.timeout(600)
@pytest.mark.parametrize("n", WORLD_SIZES)
def test_powersgd_low_rank_and_error_feedback(results, n):
    for m in metrics(results, n).values():
        lr = m["powersgd_lowrank"]
        assert lr["rank1"]["close"] and lr["error_max"] < 1e-5               # rank 1 in, rank 1 out
        assert lr["rank2_error_is_input_minus_output"]["equal"]
        assert lr["rank2_error_norm"] > 1.0
        assert lr["second_step_nonzero"] > 0.1                                # the error is sent later
        assert lr["bias_average"] == [sum(range(1, n + 1)) / n] * 8           # a vector: uncompressed
        assert lr["bias_bytes"] == 8 * 4                                      # P and Q are empty: 0 bytes


@pytest.mark.timeout(600)
def test_training_error_feedback_keeps_topk_near_uncompressed(results):
    m = metrics(results, 2)[0]
    t = m["training"]
    none, topk, noef, psgd = t["none"], t["topk"], t["topk_noef"], t["powersgd"]
    for r in (none, topk, noef, psgd):
        assert r["bytes_len"] == TRAIN_STEPS and r["monotone"] and r["params"] == TRAIN_NUMEL
        assert r["baseline_last"] == 4 * TRAIN_NUMEL * TRAIN_STEPS
        assert r["final_loss"] < r["first_loss"]
    assert none["first_loss"] == psgd["first_loss"]          # PowerSGD starts with plain all-reduce
    # same seeds, same data: with error feedback top-k ends near the uncompressed loss, without far off
    gap_ef = abs(topk["final_loss"] - none["final_loss"])
    gap_noef = abs(noef["final_loss"] - none["final_loss"])
    assert gap_ef < 0.5 * gap_noef, (none["final_loss"], topk["final_loss"], noef["final_loss"])
    assert noef["final_loss"] > 1.5 * topk["final_loss"]
    # 1 % of the entries, 4-byte values + 4-byte indices, vs 4 bytes per entry
    k = math.ceil(0.01 * TRAIN_NUMEL)
    assert topk["ratio"] == noef["ratio"] == pytest.approx(k * 8 / (4 * TRAIN_NUMEL))
    assert topk["bytes_last"] == k * 8 * TRAIN_STEPS
    after = (64 + 16) + (64 + 64) + (4 + 64) + (64 + 64 + 4)           # rank 1: P + Q per matrix, biases
    assert psgd["bytes_last"] == 4 * (10 * TRAIN_NUMEL + (TRAIN_STEPS - 10) * after)
    assert none["wire_last"] == pytest.approx(4 * TRAIN_NUMEL * TRAIN_STEPS)   # 2 ranks: ring factor 1
    assert t["loss_same_on_ranks"] is True
    assert t["torch_vs_ours_wrapper"] == {"loss_equal": True, "bytes_equal": True}


# ------------------------------------------------------------------------ in-process
@pytest.mark.timeout(60)
def test_wire_bytes_formulas():
    from dtrain_lab.parallel.compression import CommState, wire_bytes
    from dtrain_lab.perfmodel import ring_bytes_sent

    assert wire_bytes("all_reduce", 1000, 4) == ring_bytes_sent(1000, 4) == 1500
    assert wire_bytes("all_gather", 8, 3) == pytest.approx(16)       # (p-1) chunks forwarded
    assert wire_bytes("all_gather", 8, 1) == 0 and wire_bytes("all_reduce", 8, 1) == 0
    assert wire_bytes("broadcast", 8, 2) == 8                        # a chain: each rank sends it once
    with pytest.raises(ValueError):
        wire_bytes("allgather", 8, 2)
    s = CommState()
    assert s.bytes_sent == s.baseline_bytes == s.steps == 0 and math.isnan(s.ratio())


@pytest.mark.timeout(60)
def test_bad_arguments_are_bilingual_lab_errors():
    from dtrain_lab import LabError
    from dtrain_lab.parallel.compression import CommState, PowerSGDState, TopKState, make_hook, topk_sparse_allreduce

    cases = [
        (lambda: TopKState(ratio=0), "compression_bad_ratio"),
        (lambda: TopKState(ratio=1.5), "compression_bad_ratio"),
        (lambda: TopKState(ratio=True), "compression_bad_ratio"),
        (lambda: TopKState(ratio="0.1"), "compression_bad_ratio"),
        (lambda: TopKState(index_dtype=torch.float32), "compression_bad_index_dtype"),
        (lambda: PowerSGDState(matrix_approximation_rank=0), "compression_bad_rank"),
        (lambda: PowerSGDState(matrix_approximation_rank=1.5), "compression_bad_rank"),
        (lambda: PowerSGDState(start_iter=-1), "compression_bad_start_iter"),
        (lambda: make_hook("gzip"), "compression_bad_method"),
        (lambda: topk_sparse_allreduce(torch.zeros(4), 0, CommState()), "compression_bad_k"),
        (lambda: topk_sparse_allreduce(torch.zeros(4), 5, CommState()), "compression_bad_k"),
    ]
    for fn, key in cases:
        with pytest.raises(LabError) as info:
            fn()
        e = info.value
        assert e.key == key
        assert e.message("en") in str(e) and e.message("zh") in str(e)
        assert any("\u4e00" <= ch <= "\u9fff" for ch in e.message("zh"))


@pytest.mark.timeout(60)
def test_powersgd_defaults_mirror_pytorch():
    import inspect

    from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import PowerSGDState as TorchState

    from dtrain_lab.parallel.compression import PowerSGDState

    theirs = inspect.signature(TorchState).parameters
    ours = inspect.signature(PowerSGDState).parameters
    rename = {"start_iter": "start_powerSGD_iter"}
    for name in ("matrix_approximation_rank", "start_iter", "min_compression_rate", "use_error_feedback",
                 "warm_start", "orthogonalization_epsilon", "random_seed"):
        assert ours[name].default == theirs[rename.get(name, name)].default, name
    assert ours["start_iter"].default == 1000      # the trap: 1000 plain steps before compressing


@pytest.mark.timeout(60)
def test_should_compress_and_orthogonalize_match_pytorch():
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as P

    from dtrain_lab.parallel.compression import PowerSGDState, orthogonalize_, should_compress

    for n in (1, 4, 16, 64):
        for m in (1, 4, 32):
            for r in (1, 2, 4):
                for rate in (0.5, 1, 2):
                    rr = min(n, m, r)
                    assert should_compress(n, m, rr, rate) == P._should_compress(n, m, rr, rate)[0]
    g = torch.Generator().manual_seed(0)
    for n, r in ((5, 1), (16, 2), (32, 3), (64, 4), (8, 8)):
        for eps in (0, 1e-8):
            a = torch.randn(n, r, generator=g)
            theirs = a.clone().unsqueeze(0)
            P._orthogonalize(theirs, eps)
            ours = orthogonalize_(a.clone(), eps)
            assert torch.equal(ours, theirs[0]), (n, r, eps)   # Gram-Schmidt (r ≤ 2) and QR alike
            assert torch.allclose(ours.T @ ours, torch.eye(r), atol=1e-5)
    st = PowerSGDState(matrix_approximation_rank=1)
    assert st.compressed_elements([torch.Size(s) for s in MLP_SHAPES]) == (NUMEL, powersgd_elements(1, 2))


@pytest.mark.timeout(60)
def test_topk_k_and_selection():
    from dtrain_lab.parallel.compression import TopKState, topk_select

    assert TopKState(ratio=0.05).k_for(NUMEL) == 87
    assert TopKState(ratio=1.0).k_for(10) == 10 and TopKState(ratio=1e-9).k_for(10) == 1
    assert TopKState(ratio=0.3).k_for(10) == 3                      # no float round-up to 4
    idx, vals = topk_select(torch.tensor([0.5, -3.0, 2.0, 1.0]), 2)
    assert sorted(idx.tolist()) == [1, 2] and sorted(vals.tolist()) == [-3.0, 2.0]


@pytest.mark.timeout(60)
def test_demo_arguments_and_ddp_hook_registration():
    from dtrain_lab.parallel.compression import CommState, allreduce_hook
    from dtrain_lab.parallel.ddp import DDP
    from dtrain_lab.demos.compression_run import parse
    from dtrain_lab.models import MLP

    assert parse([]) == (["none", "fp16", "topk", "topk_noef", "powersgd"], 200, {})
    assert parse(["none,topk", "50", "ratio=0.02", "rank=2", "ddp=torch"]) == \
        (["none", "topk"], 50, {"ratio": 0.02, "rank": 2, "ddp": "torch"})
    net = DDP(MLP(seed=0))                                            # a world of one
    net.register_comm_hook(CommState(), allreduce_hook)
    with pytest.raises(RuntimeError):
        net.register_comm_hook(CommState(), allreduce_hook)
    assert net.stats()["hook_calls"] == 0
