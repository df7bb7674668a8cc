"""dtrain_lab.parallel.ddp.DDP equals PyTorch's DistributedDataParallel and single-process training.

One launch per world size (2, 3) runs every multi-process check (tests/workers/ddp_checks.py);
the in-process tests at the end cover the world of one, the models and the data sets.
"""
import pytest
import torch

from conftest import WORKERS, job_metrics
from dtrain_lab.models import MLP
from forkjob import fork_launch

WORLD_SIZES = [2, 3]
MLP_BYTES = 4 * (16 * 32 + 32 + 32 * 32 + 32 + 32 * 4 + 4)  # MLP(16, 32, 4, depth=2), float32
MLP_REVERSED = ["layers.4.bias", "layers.4.weight", "layers.2.bias", "layers.2.weight",
                "layers.0.bias", "layers.0.weight"]
# every case tests/workers/ddp_checks.py runs (its CASES), named here so that a case dropped there, or
# one that stops reporting, fails the test instead of shrinking it
CASES = ["accum", "accum_buckets", "classify", "frozen", "mlp", "mlp_buckets", "mlp_buckets_no_overlap",
         "mlp_no_overlap", "tied", "tied_buckets", "unused", "unused_accum", "unused_buckets"]


@pytest.fixture(scope="module")
def results():
    import uuid


    return {n: fork_launch(str(WORKERS / "ddp_checks.py"), nproc=n, timeout=240, quiet=True,
                           env={"DTRAIN_TEST_TAG": uuid.uuid4().hex})
            for n in WORLD_SIZES}


def metrics(results, n):
    return job_metrics(results[n], n)


@pytest.mark.timeout(400)
@pytest.mark.parametrize("n", WORLD_SIZES)
def test_job_ok(results, n):
    for rank, m in metrics(results, n).items():
        assert m["rank"] == rank and m["world_size"] == n


@pytest.mark.timeout(400)
@pytest.mark.parametrize("n", WORLD_SIZES)
def test_same_parameters_as_torch_ddp_and_single_process(results, n):
    for rank, m in metrics(results, n).items():
        assert sorted(m["cases"]) == CASES
        for name, c in m["cases"].items():
            for key in ("vs_torch", "vs_single", "torch_vs_single"):
                assert c[key]["close"], f"rank {rank} {name} {key}: max abs diff {c[key]['max_abs_diff']}"
                assert c[key]["max_abs_diff"] < 1e-5
            assert c["identical"] is True, f"rank {rank} {name}: replicas differ"
            assert c["sync_steps"] == 5


@pytest.mark.timeout(400)
@pytest.mark.parametrize("n", WORLD_SIZES)
def test_buckets_reverse_order_and_overlap(results, n):
    for m in metrics(results, n).values():
        c = m["cases"]
        # default 25 MB: one bucket, one all-reduce per step, parameters in reverse registration order
        assert c["mlp"]["bucket_params"] == [MLP_REVERSED]
        assert c["mlp"]["step_collectives"] == [1] * 5 and c["mlp"]["step_bytes"] == MLP_BYTES
        # a small cap: three buckets, last layer first
        assert c["mlp_buckets"]["bucket_params"] == [MLP_REVERSED[0:2], MLP_REVERSED[2:4], MLP_REVERSED[4:6]]
        assert c["mlp_buckets"]["step_collectives"] == [3] * 5 and c["mlp_buckets"]["step_bytes"] == MLP_BYTES
        # overlap: every bucket launched from a gradient hook while backward ran; without: none
        assert c["mlp"]["launched_in_backward"] == 1 and c["mlp_buckets"]["launched_in_backward"] == 3
        assert c["mlp_no_overlap"]["launched_in_backward"] == 0
        assert c["mlp_buckets_no_overlap"]["launched_in_backward"] == 0
        assert c["mlp_buckets_no_overlap"]["step_collectives"] == [3] * 5
        # classify: MLP(16, 32, 4, depth=2) with a cap below any parameter's size (ONE_PER_PARAM_MB): one
        # bucket per parameter tensor, each launched from its gradient hook
        per_param = len(list(MLP(16, 32, 4, depth=2).parameters()))
        assert per_param == len(MLP_REVERSED)
        assert c["classify"]["num_buckets"] == per_param and c["classify"]["launched_in_backward"] == per_param


@pytest.mark.timeout(400)
@pytest.mark.parametrize("n", WORLD_SIZES)
def test_no_sync_accumulation_communicates_once_per_step(results, n):
    for m in metrics(results, n).values():
        for name, per_step in (("accum", 1), ("accum_buckets", 3)):
            c = m["cases"][name]
            # 2 micro-batches per step, 5 steps: only the last micro-batch's backward communicates
            assert c["sync_steps"] == 5 and c["total_collectives"] == 5 * per_step


@pytest.mark.timeout(400)
@pytest.mark.parametrize("n", WORLD_SIZES)
def test_tied_and_frozen_parameters(results, n):
    for m in metrics(results, n).values():
        tied, frozen = m["cases"]["tied"], m["cases"]["frozen"]
        assert tied["tied_once"] is True
        assert tied["num_params"] == 3                        # embed/head weight once + hidden w, b
        assert sum(len(b) for b in m["cases"]["tied_buckets"]["bucket_params"]) == 3
        assert frozen["num_params"] == 4                      # layers.0 skipped
        assert all("layers.0" not in p for b in frozen["bucket_params"] for p in b)
        assert frozen["step_bytes"] == MLP_BYTES - 4 * (16 * 32 + 32)
        assert frozen["frozen_moved"] is False


@pytest.mark.timeout(400)
@pytest.mark.parametrize("n", WORLD_SIZES)
def test_find_unused_parameters(results, n):
    for m in metrics(results, n).values():
        for name in ("unused", "unused_buckets", "unused_accum"):
            c = m["cases"][name]
            # step 2 skips the branch on every rank: its .grad stays untouched (None), as in PyTorch
            assert c["globally_unused"] == [[], [], ["branch.bias", "branch.weight"], [], []]
            # one all-reduce per bucket + the used-map all-reduce
            assert c["step_collectives"] == [c["num_buckets"] + 1] * 5
            assert c["launched_in_backward"] == c["num_buckets"]


@pytest.mark.timeout(400)
@pytest.mark.parametrize("n", WORLD_SIZES)
def test_unused_parameter_without_find_unused_is_a_clear_error(results, n):
    for rank, m in metrics(results, n).items():
        assert set(m["unused_error"]) == {"one_bucket", "many_buckets", "no_overlap"}
        for label, e in m["unused_error"].items():
            assert e["raised"] is True, label
            assert e["type"] == "DDPError" and e["is_runtime_error"] is True
            msg = e["message"]
            assert e["en"] in msg and e["zh"] in msg                      # both languages
            assert "branch.weight" in msg and "branch.bias" in msg
            assert "find_unused_parameters=True" in e["en"] and "find_unused_parameters=True" in e["zh"]
            assert "Expected to have finished reduction" in e["en"]
            assert "没有得到梯度" in e["zh"] and f"rank {rank}" in e["en"]
            assert e["stats_after_error"]["sync_steps"] == 0
            assert e["recovered_identical"] is True and e["recovered_sync_steps"] == 1


@pytest.mark.timeout(400)
@pytest.mark.parametrize("n", WORLD_SIZES)
def test_bucketing_issues_fewer_collectives_than_naive(results, n):
    for m in metrics(results, n).values():
        c = m["counts"]
        assert c["grads_equal"] is True
        assert c["naive"] == c["num_params"] == 6
        assert c["bucketed"] == 1 < c["naive"]
        assert c["bucketed_bytes"] == c["naive_bytes"] == MLP_BYTES   # same bytes, fewer messages
        assert c["one_per_param"] == 6                                # a tiny cap degrades to naive
        # what the wrappers count is what went through c10d (CommDebugMode's dispatch mode saw it)
        assert c["traced_step"]["counts"] == {"all_reduce": c["bucketed"]}
        assert c["traced_step"]["bytes"] == c["bucketed_bytes"]
        assert c["traced_naive"]["counts"] == {"all_reduce": c["naive"]}
        assert c["traced_naive"]["bytes"] == c["naive_bytes"]
        assert c["traced_tiny"]["counts"] == {"all_reduce": c["one_per_param"]} and c["traced_tiny"]["bytes"] == MLP_BYTES
        assert c["traced_init"] == {"all_gather": 1, "broadcast": 1} and c["init_collectives"] == 2


@pytest.mark.timeout(400)
@pytest.mark.parametrize("n", WORLD_SIZES)
def test_construction_broadcasts_rank0_and_groups(results, n):
    for rank, m in metrics(results, n).items():
        assert m["init"]["equal_to_rank0"] is True
        if rank:
            assert m["init"]["before_differs"] is True
        sub = m["subgroup"]
        assert sub["member"] is (rank >= n - 2)
        if sub["member"]:
            assert sub["vs_torch"]["close"] and sub["vs_single"]["close"] and sub["identical"]
        one = m["group_of_one"]
        assert one == {"distributed": False, "same_output": True, "hooks": 0, "collectives": 0,
                       "grad_present": True}


# ------------------------------------------------------------------------ in-process (world of one)
@pytest.mark.timeout(60)
def test_world_of_one_is_the_plain_module():
    from dtrain_lab.parallel.ddp import DDP, naive_allreduce_grads
    from dtrain_lab.models import MLP

    model = MLP(seed=0)
    net = DDP(model, bucket_cap_mb=0.001)
    x = torch.randn(5, 16)
    assert torch.equal(net(x), model(x))
    with net.no_sync():
        net(x).sum().backward()
    assert model.layers[0].weight.grad is not None
    s = net.stats()
    assert not net.distributed and s["num_buckets"] == 0 and s["total_collectives"] == 0
    assert naive_allreduce_grads(model) == {"collectives": 0, "bytes": 0}
    with pytest.raises(ValueError):
        DDP(model, bucket_cap_mb=0)


@pytest.mark.timeout(60)
def test_ddp_error_is_bilingual():
    from dtrain_lab import get_lang
    from dtrain_lab.parallel.ddp import DDPError

    e = DDPError("ddp_unused_params", rank=0, count=1, names="w", buckets=[0])
    lines = str(e).split("\n")
    assert len(lines) == 2 and isinstance(e, RuntimeError)
    assert lines[0] == e.message(get_lang())
    assert {lines[0], lines[1]} == {e.message("en"), e.message("zh")}


@pytest.mark.timeout(60)
def test_params_reached_finds_unused_branch():
    from dtrain_lab.parallel.ddp import params_reached
    from dtrain_lab.models import BranchMLP

    m = BranchMLP(seed=0)
    names = [n for n, _ in m.named_parameters()]
    index = {id(p): i for i, p in enumerate(m.parameters())}
    x = torch.randn(2, 16)
    assert {names[i] for i in params_reached(m(x, use_branch=True), index)} == set(names)
    assert {names[i] for i in params_reached((m(x, use_branch=False),), index)} == \
        {"trunk.weight", "trunk.bias", "head.weight", "head.bias"}


@pytest.mark.timeout(60)
def test_models_are_deterministic_and_shaped():
    from dtrain_lab.models import MLP, BranchMLP, FrozenMLP, TiedMLP, TinyTransformer, count_params

    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    a, b = MLP(seed=7), MLP(seed=7)
    assert torch.equal(torch.rand(1), before)                 # a seeded build leaves the global RNG alone
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    assert not torch.equal(MLP(seed=8).layers[0].weight, a.layers[0].weight)
    assert a(torch.randn(3, 16)).shape == (3, 4) and len(list(a.parameters())) == 6

    t = TiedMLP(vocab=16, d_hidden=32, seed=0)
    assert t.head.weight is t.embed.weight and len(list(t.parameters())) == 3
    assert t(torch.randint(0, 16, (5, 3))).shape == (5, 3, 16)

    f = FrozenMLP(seed=0)
    assert [p.requires_grad for p in f.parameters()] == [False, False, True, True, True, True]
    assert count_params(f, trainable_only=True) == count_params(f) - (16 * 32 + 32)

    br = BranchMLP(seed=0)
    assert br(torch.randn(2, 16), use_branch=False).shape == (2, 4)

    tr = TinyTransformer(vocab=32, d=32, n_heads=2, n_layers=2, max_len=16, seed=0)
    tokens = torch.randint(0, 32, (2, 10))
    logits = tr(tokens)
    assert logits.shape == (2, 10, 32)
    changed = tokens.clone()
    changed[:, -1] = (changed[:, -1] + 1) % 32                # causal: the past ignores the future
    assert torch.allclose(tr(changed)[:, :-1], logits[:, :-1], atol=1e-6)
    with pytest.raises(ValueError):
        tr(torch.zeros(1, 17, dtype=torch.long))


@pytest.mark.timeout(60)
def test_datasets_are_deterministic_and_shard():
    from dtrain_lab.data import classification_dataset, global_batch, regression_dataset, shard, token_dataset

    r1, r2 = regression_dataset(32, 16, 4, seed=0), regression_dataset(32, 16, 4, seed=0)
    assert all(torch.equal(a, b) for a, b in zip(r1.tensors, r2.tensors))
    assert not torch.equal(r1.tensors[0], regression_dataset(32, 16, 4, seed=1).tensors[0])
    x, y = classification_dataset(40, 16, 4, seed=0).tensors
    assert x.shape == (40, 16) and y.dtype == torch.long and set(y.tolist()) <= {0, 1, 2, 3}
    tok, tgt = token_dataset(20, seq_len=5, vocab=16, seed=0).tensors
    assert tok.shape == tgt.shape == (20, 5) and torch.equal(tok[:, 1:], tgt[:, :-1])
    batch = global_batch(r1, step=3, batch_size=12)
    parts = [shard(batch, r, 3) for r in range(3)]
    assert torch.equal(torch.cat([p[0] for p in parts]), batch[0])
    with pytest.raises(ValueError):
        shard(batch, 0, 5)


@pytest.mark.timeout(400)
@pytest.mark.parametrize("n", WORLD_SIZES)
def test_buffers_broadcast_only_after_a_synchronised_training_forward(results, n):
    for m in metrics(results, n).values():
        counts = dict((label, c) for label, c in m["buffers"]["log"])
        assert counts["first train"] >= 1 and counts["second train"] >= 1 and counts["eval after train"] >= 1
        assert counts["eval after eval"] == 0 and counts["train after eval"] == 0
