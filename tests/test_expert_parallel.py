"""dtrain_lab.parallel.expert: top-k routing with a capacity, the load-balancing loss, and an MoE layer
whose experts are spread over ranks, equal to the same layer on one process.

In-process: routing against a per-assignment loop (first choices first, then token order; what does
not fit is dropped), the vectorised layer against a per-token loop (outputs and gradients), the
Switch loss (1 for uniform routing, more when skewed, differentiable), the All-to-All is the identity
on one rank, the byte formula, the errors. Multi-process (``dtrain_lab.demos.ep_run`` at 2 and 3
ranks, 12 experts): outputs, token gradients, expert and router gradients equal the one-process layer
(float64); splits are uneven and some assignments are dropped; CommDebugMode counts 5 All-to-Alls per
step; the bytes the backend was handed (profiler) equal ``moe_comm_bytes`` exactly.
"""
import math
import uuid

import pytest
import torch
import torch.nn.functional as F

from dtrain_lab.i18n import LabError
from dtrain_lab.parallel.expert import MoE, all_to_all, load_balancing_loss, moe_comm_bytes, route
from forkjob import fork_launch

TOL = 1e-12


def _loop_route(logits, k, cf):
    t, e = logits.shape
    probs = logits.softmax(-1)
    gate, expert = probs.topk(k, -1)
    if k > 1:
        gate = gate / gate.sum(-1, keepdim=True)
    cap = math.ceil(cf * t * k / e)
    used = [0] * e
    keep = torch.zeros(t, k, dtype=torch.bool)
    for j in range(k):
        for i in range(t):
            ex = int(expert[i, j])
            if used[ex] < cap:
                used[ex] += 1
                keep[i, j] = True
    return expert, gate, keep, cap


@pytest.mark.parametrize("k,cf", [(1, 1.0), (2, 1.0), (2, 1.25), (3, 0.5)])
def test_route_matches_a_loop(k, cf):
    logits = torch.randn(40, 6, generator=torch.Generator().manual_seed(k), dtype=torch.float64) * 2
    r = route(logits, k, cf)
    expert, gate, keep, cap = _loop_route(logits, k, cf)
    assert r.capacity == cap and torch.equal(r.expert, expert) and torch.equal(r.keep, keep)
    assert torch.allclose(r.gate, gate)
    assert r.counts(6).max() <= cap and r.dropped == int((~keep).sum())
    if cf <= 1.0:
        assert r.dropped > 0
    assert route(logits, k, None).dropped == 0


def test_load_balancing_loss():
    uniform = route(torch.zeros(8, 4), 1, None)          # every prob 1/4; topk picks expert 0 for all
    assert load_balancing_loss(uniform).item() == pytest.approx(1.0)   # f = (1,0,0,0), P = 1/4 each
    skew = torch.tensor([[5.0, 0, 0, 0]]).repeat(8, 1).requires_grad_()
    loss = load_balancing_loss(route(skew, 1, None))
    assert loss.item() > 3.5
    loss.backward()
    assert skew.grad.abs().sum() > 0                     # the router learns from it (through P)


def _loop_moe(moe, x):
    r = route(moe.router(x), moe.top_k, moe.capacity_factor)
    rows = []
    for i in range(x.shape[0]):
        acc = torch.zeros_like(x[i])
        for j in range(moe.top_k):
            if r.keep[i, j]:
                e = int(r.expert[i, j])
                acc = acc + r.gate[i, j] * ((F.silu(x[i] @ moe.w1[e]) * (x[i] @ moe.w3[e])) @ moe.w2[e])
        rows.append(acc)
    return torch.stack(rows), load_balancing_loss(r)


def test_one_process_layer_equals_per_token_loop():
    torch.manual_seed(0)
    a = MoE(8, 16, 6, top_k=2, capacity_factor=1.0, seed=3).double()
    b = MoE(8, 16, 6, top_k=2, capacity_factor=1.0, seed=3).double()
    x = torch.randn(2, 15, 8, dtype=torch.float64)
    xa, xb = x.clone().requires_grad_(), x.reshape(-1, 8).clone().requires_grad_()
    (ya, auxa), (yb, auxb) = a(xa), _loop_moe(b, xb)
    assert ya.shape == x.shape and (ya.reshape(-1, 8) - yb).abs().max() < TOL and abs(auxa - auxb) < TOL
    w = torch.randn(30, 8, dtype=torch.float64)
    ((ya.reshape(-1, 8) * w).sum() + auxa).backward()
    ((yb * w).sum() + auxb).backward()
    assert (xa.grad.reshape(-1, 8) - xb.grad).abs().max() < TOL
    for pa, pb in zip(a.parameters(), b.parameters()):
        assert (pa.grad - pb.grad).abs().max() < TOL
    assert a.last_stats["dropped"] > 0 and a.last_stats["sent"] == [a.last_stats["kept"]]


def test_all_to_all_on_one_rank_and_formula():
    x = torch.randn(5, 3)
    assert all_to_all(x, [5], [5]) is x
    f = moe_comm_bytes(kept=100, d=16, ep=4, n_experts=8, bytes_per_elem=2)
    assert f["calls"] == 5 and f["payload_bytes"] == 4 * 100 * 16 * 2 + 64
    assert f["wire_bytes"] == pytest.approx(4 * 75 * 16 * 2 + 48)
    assert moe_comm_bytes(100, 16, 1, 8)["payload_bytes"] == 0


def test_bad_input_is_a_clear_error():
    with pytest.raises(LabError):
        route(torch.zeros(4, 3), 4, 1.0)
    with pytest.raises(LabError) as e:
        MoE(8, 16, 6, top_k=0)
    assert "top_k = 0" in str(e.value)


# ------------------------------------------------------------------------------------ multi-process
@pytest.fixture(scope="module")
def results():

    return {n: fork_launch("dtrain_lab.demos.ep_run", nproc=n, timeout=300, quiet=True,
                           env={"DTRAIN_TEST_TAG": uuid.uuid4().hex}) for n in (2, 3)}


@pytest.mark.timeout(600)
@pytest.mark.parametrize("n", [2, 3])
def test_expert_parallel_equals_one_process(results, n):
    r = results[n]
    assert r.ok, r.summary() + "\n" + "\n".join(x.output[-3000:] for x in r.ranks)
    ms = r.metrics
    assert sorted(ms) == list(range(n))
    for rank, m in ms.items():
        for key in ("out", "aux", "x", "w1", "w2", "w3", "router"):
            assert m[key] < TOL, (rank, key, m[key])
        assert m["grad_scale"] > 0.1
        assert len(m["sent"]) == n and sum(m["sent"]) == m["kept"]
        assert m["debug_counts"] == {"alltoall_base_": 5}
        assert m["comm"]["all_to_all"]["calls"] == m["formula"]["calls"] == 5
        assert m["comm"]["all_to_all"]["bytes"] == m["formula"]["payload_bytes"]
    # what rank s sent to rank d is what d received from s
    for s in range(n):
        for d in range(n):
            assert ms[s]["sent"][d] == ms[d]["received"][s]
    assert sum(m["dropped"] for m in ms.values()) > 0
    assert any(len(set(m["sent"])) > 1 for m in ms.values())          # uneven splits


@pytest.mark.timeout(600)
def test_top_k_argument(results):
    """``ep_run --top-k 1`` (lesson 13, exercise 4): top-1 routing, still equal to one process, the
    capacity ⌈T·k/E⌉ halved, fewer bytes than top-2, and the byte formula still exact."""
    r = fork_launch("dtrain_lab.demos.ep_run", nproc=2, args=["--top-k", "1"], timeout=300, quiet=True,
                    env={"DTRAIN_TEST_TAG": uuid.uuid4().hex})
    assert r.ok, r.summary() + "\n" + "\n".join(x.output[-3000:] for x in r.ranks)
    for rank, m in r.metrics.items():
        top2 = results[2].metrics[rank]
        assert (m["top_k"], top2["top_k"]) == (1, 2)
        for key in ("out", "aux", "x", "w1", "w2", "w3", "router"):
            assert m[key] < TOL, (rank, key, m[key])
        assert (m["capacity"], top2["capacity"]) == (2, 4)                    # ⌈1.0 · 24 · k / 12⌉
        assert m["comm"]["all_to_all"]["calls"] == m["formula"]["calls"] == 5
        assert m["comm"]["all_to_all"]["bytes"] == m["formula"]["payload_bytes"] < top2["comm"]["all_to_all"]["bytes"]
