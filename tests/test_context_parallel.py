"""dtrain_lab.parallel.context: ring attention equals plain attention, forward and backward.

In-process: the layouts (which chunks, which positions), our zig-zag order against PyTorch's
``_HeadTailLoadBalancer`` for several sequence lengths and degrees, the causal work per rank
(contiguous: rank r does 2r+1 units, zig-zag: all equal), the online-softmax merge of any split of
the keys, ring attention on one process (world size 1 is plain code), and the errors.
Multi-process (one launch of ``dtrain_lab.demos.cp_run`` at 2 ranks, one at 4): every rank's output
rows and ``dq/dk/dv`` rows equal autograd through single-process attention on the whole sequence
(float64), causal and not, contiguous and zig-zag, and with grouped-query attention; the sends and bytes counted equal
``ring_comm_bytes``; zig-zag balances the query-key products exactly; PyTorch's context_parallel on
CPU raises NotImplementedError for the CPU flash kernel, and its load balancer's order is ours.
Precision (one launch of ``tests/workers/cp_precision_checks.py`` at 2 ranks, one at 3): with bf16
inputs the ring accumulates in float32, so every output and gradient element is within the rounding of
the result to bf16 of float64 attention (its own reference, in the worker); the old bf16 accumulation
(forced with ``_acc_dtype``) is several times outside that bound; dK/dV travel in float32.
"""
import uuid

import pytest
import torch

from dtrain_lab.i18n import LabError
from dtrain_lab.parallel.context import (attention_reference, block_attention, causal_work, chunk_ids,
                                         online_softmax_merge, ring_attention, ring_comm_bytes, shard_positions,
                                         shard_sequence, unshard_sequence, zigzag_order)
from conftest import job_metrics
from forkjob import fork_launch

TOL = 1e-12   # float64


def test_layouts():
    assert chunk_ids(1, 4, "contiguous") == [1] and chunk_ids(1, 4, "zigzag") == [1, 6]
    assert shard_positions(16, 1, 2, "zigzag").tolist() == [4, 5, 6, 7, 8, 9, 10, 11]
    assert shard_positions(16, 0, 2, "zigzag").tolist() == [0, 1, 2, 3, 12, 13, 14, 15]
    x = torch.arange(2 * 3 * 24).reshape(2, 3, 24).double()
    for layout in ("contiguous", "zigzag"):
        shards = [shard_sequence(x, r, 4, layout, dim=2) for r in range(4)]
        assert torch.equal(unshard_sequence(shards, layout, dim=2), x)


@pytest.mark.parametrize("seq,p", [(8, 2), (16, 2), (24, 3), (32, 4), (64, 8)])
def test_zigzag_is_torch_head_tail_order(seq, p):
    from torch.distributed.tensor.experimental._context_parallel import _HeadTailLoadBalancer

    theirs = _HeadTailLoadBalancer(seq, p, "cpu")._generate_indices().reshape(-1)
    assert torch.equal(zigzag_order(seq, p), theirs.long())


def test_causal_work_imbalance():
    s, p = 64, 4
    cont, zz = causal_work(s, p, "contiguous"), causal_work(s, p, "zigzag")
    assert sum(cont) == sum(zz) == s * (s + 1) // 2
    assert len(set(zz)) == 1
    n = s // p   # contiguous: rank r = r·n² (full blocks) + n(n+1)/2 (its diagonal)
    assert cont == [r * n * n + n * (n + 1) // 2 for r in range(p)]
    assert cont[-1] / cont[0] == pytest.approx(1 + 2 * (p - 1) * n / (n + 1))   # → 2p-1 for long shards


def test_online_softmax_merge_is_exact_for_any_split():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 5, 4, generator=g, dtype=torch.float64) for _ in range(3))
    k, v = torch.randn(2, 3, 11, 4, generator=g, dtype=torch.float64), torch.randn(2, 3, 11, 4, generator=g, dtype=torch.float64)
    ref = ((q @ k.transpose(-2, -1)) / 2).softmax(-1) @ v
    for cuts in ([0, 11], [0, 3, 11], [0, 1, 2, 7, 11]):
        o = torch.zeros_like(q)
        lse = torch.full(q.shape[:-1], float("-inf"), dtype=q.dtype)
        for a, b in reversed(list(zip(cuts, cuts[1:]))):    # any order of the blocks
            o, lse = online_softmax_merge(o, lse, *block_attention(q, k[..., a:b, :], v[..., a:b, :], 0.5, False))
        assert (o - ref).abs().max() < TOL


@pytest.mark.parametrize("causal", [True, False])
def test_one_process_is_plain_attention(causal):
    g = torch.Generator().manual_seed(1)
    q, k, v, do = (torch.randn(2, 2, 12, 8, generator=g, dtype=torch.float64) for _ in range(4))
    a = [t.clone().requires_grad_() for t in (q, k, v)]
    b = [t.clone().requires_grad_() for t in (q, k, v)]
    stats = {}
    out = ring_attention(*a, causal=causal, stats=stats)
    ref = attention_reference(*b, causal=causal)
    out.backward(do)
    ref.backward(do)
    assert (out - ref).abs().max() < TOL
    assert all((x.grad - y.grad).abs().max() < TOL for x, y in zip(a, b))
    assert stats.get("sends", 0) == 0 and stats["qk_pairs"] == 4 * (78 if causal else 144)
    # PyTorch's SDPA agrees as well
    sdpa = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    assert (sdpa - ref.detach()).abs().max() < 1e-10


def test_grouped_query_attention():
    g = torch.Generator().manual_seed(2)
    q, do = (torch.randn(1, 4, 8, 8, generator=g, dtype=torch.float64) for _ in range(2))
    k, v = (torch.randn(1, 2, 8, 8, generator=g, dtype=torch.float64) for _ in range(2))
    a = [t.clone().requires_grad_() for t in (q, k, v)]
    b = [t.clone().requires_grad_() for t in (q, k, v)]
    ring_attention(*a).backward(do)
    ref = torch.nn.functional.scaled_dot_product_attention(*b, is_causal=True, enable_gqa=True)
    ref.backward(do)
    assert (attention_reference(*a).detach() - ref.detach()).abs().max() < TOL
    assert all((x.grad - y.grad).abs().max() < TOL for x, y in zip(a, b))


def test_comm_formula():
    f = ring_comm_bytes(1, 8, 1024, 64, 4, bytes_per_elem=2)
    assert f["block_bytes"] == 2 * 8 * 256 * 64 * 2
    assert (f["forward_sends"], f["backward_sends"]) == (3, 7)
    assert f["grad_block_bytes"] == 2 * f["block_bytes"]          # bf16 K/V, float32 dK/dV
    assert f["total_bytes"] == (3 + 3) * f["block_bytes"] + 4 * f["grad_block_bytes"]
    f64 = ring_comm_bytes(1, 8, 1024, 64, 4, bytes_per_elem=8)
    assert f64["grad_block_bytes"] == f64["block_bytes"] and f64["total_bytes"] == 10 * f64["block_bytes"]
    assert ring_comm_bytes(1, 8, 1024, 64, 1)["total_bytes"] == 0


def test_bad_input_is_a_clear_error():
    with pytest.raises(LabError) as e:
        shard_positions(10, 0, 3, "zigzag")
    assert "6" in str(e.value) and "10" in str(e.value)
    with pytest.raises(LabError):
        shard_positions(8, 0, 2, "stripes")
    with pytest.raises(LabError):
        ring_attention(torch.zeros(1, 2, 4, 8), torch.zeros(1, 2, 5, 8), torch.zeros(1, 2, 4, 8))


# ------------------------------------------------------------------------------------ multi-process
LAUNCHES = {2: "equal,torch", 4: "equal"}


@pytest.fixture(scope="module")
def results():

    return {n: fork_launch("dtrain_lab.demos.cp_run", nproc=n, args=[parts], timeout=300, quiet=True,
                           env={"DTRAIN_TEST_TAG": uuid.uuid4().hex})
            for n, parts in LAUNCHES.items()}


def metrics(results, n):
    return job_metrics(results[n], n, last=False)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("n", sorted(LAUNCHES))
def test_ring_equals_one_process_forward_and_backward(results, n):
    for rank, m in metrics(results, n).items():
        runs = m["equal"]
        assert sorted(runs) == ["contiguous_causal", "contiguous_full", "zigzag_causal", "zigzag_causal_gqa",
                                "zigzag_full"]
        for name, r in runs.items():
            assert r["out"] < TOL and max(r["grads"]) < TOL, (rank, name)
            assert r["grad_norm"] > 0.1                            # a gradient that is not all zeros
            f = r["formula"]
            assert r["sends"] == f["forward_sends"] + f["backward_sends"] == 3 * n - 2
            assert r["send_bytes"] == f["total_bytes"]
        assert runs["zigzag_causal_gqa"]["send_bytes"] * 2 == runs["zigzag_causal"]["send_bytes"]   # half the K/V heads


@pytest.mark.timeout(600)
@pytest.mark.parametrize("n", sorted(LAUNCHES))
def test_zigzag_balances_the_work(results, n):
    ms = metrics(results, n)
    seq, bh = 8 * n, 4
    cont = [ms[r]["equal"]["contiguous_causal"]["qk_pairs"] for r in range(n)]
    zz = [ms[r]["equal"]["zigzag_causal"]["qk_pairs"] for r in range(n)]
    assert cont == [bh * w for w in causal_work(seq, n, "contiguous")] and cont[0] < cont[-1]
    assert zz == [bh * w for w in causal_work(seq, n, "zigzag")] and len(set(zz)) == 1
    assert sum(cont) == sum(zz) == bh * seq * (seq + 1) // 2


@pytest.mark.timeout(600)
def test_torch_context_parallel_on_cpu(results):
    for m in metrics(results, 2).values():
        t = m["torch"]
        assert t["torch_order"] == t["our_order"]
        assert t["local_seq_inside"] == 8                          # buffers sharded in place: 16 / 2
        assert t["raised"]["type"] == "NotImplementedError"
        assert "_scaled_dot_product_flash_attention_for_cpu" in t["raised"]["message"]


# ------------------------------------------------------------------------------------ bf16 precision
PRECISION_WORLDS = (2, 3)
# A bf16 value has 8 significant bits: rounding x to bf16 errs by at most 2⁻⁸·|x|. The ring as shipped
# computes in float32 from the bf16 inputs (products exact, sums to ~1e-6) and rounds once, so each
# element's error is within 2⁻⁸ of the tensor's largest magnitude (5 % margin for the float32 part).
BF16_TOL = 2.0 ** -8 * 1.05


@pytest.fixture(scope="module")
def precision():
    from conftest import WORKERS

    return {n: fork_launch(str(WORKERS / "cp_precision_checks.py"), nproc=n, timeout=120, quiet=True,
                           env={"DTRAIN_TEST_TAG": uuid.uuid4().hex})
            for n in PRECISION_WORLDS}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("n", PRECISION_WORLDS)
def test_bf16_ring_accumulates_in_float32(precision, n):
    ms = job_metrics(precision[n], n)
    b, h, s, d = ms[0]["shape"]
    for case in ("zigzag_causal", "contiguous_full_no_overlap"):
        new = [ms[r]["precision"][case]["float32"] for r in range(n)]
        old = [ms[r]["precision"][case]["bfloat16"] for r in range(n)]
        for rank, m in enumerate(new):
            assert m["dtypes"] == ["torch.bfloat16"] * 4, (case, rank)   # cast back to the input dtype
            assert max(m["rel_err"].values()) <= BF16_TOL, (case, rank, m["rel_err"])
        # the old ring (merging and accumulating in bf16) is far outside: more than twice the bound
        assert max(e for m in old for e in m["rel_err"].values()) > 2 * BF16_TOL, (case, old)
        # bytes: K/V travel in bf16 (2 bytes), dK/dV in float32 (4); the old ring sent bf16 dK/dV
        assert all(m["sends"] == 3 * n - 2 for m in new + old)
        assert all(m["send_bytes"] == ring_comm_bytes(b, h, s * n, d, n, bytes_per_elem=2)["total_bytes"]
                   for m in new)
        assert all(m["send_bytes"] == ring_comm_bytes(b, h, s * n, d, n, 2, grad_bytes_per_elem=2)["total_bytes"]
                   for m in old)
