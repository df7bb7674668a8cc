"""dtrain_lab.parallel.zero: ZeRO stages 1, 2 (ShardedOptimizer) and 3 (ZeroStage3).

One launch per world size (2, 3) of ``dtrain_lab.demos.zero_run`` runs every multi-process check;
the references are independent and computed here (single_process: the demo reports its raw parameters,
not its verdict): single-process unsharded training on the concatenated batch with
``torch.optim``, PyTorch's ``ZeroRedundancyOptimizer``, ``torch.nn.utils.clip_grad_norm_``, and the
buffers that went through ``torch.distributed`` (seen by a ``CommDebugMode``). Net127 has 127
parameters (prime), so every shard boundary falls inside a tensor and the last shard is padded, at
both world sizes. ``zero_cases.Mixed`` adds a frozen layer, a branch and a gate used only in some
steps, and (stages 1/2) an embedding tied to the output layer, under an LR schedule; and a resume
from ``state_dict()`` that must equal the uninterrupted run bit for bit.

Tolerance: 1e-6 in fp32 (the gradients are summed in another order than in the single process). One
exception, in TinyTransformer: ``k_proj.bias``. Adding a constant to every key leaves the softmax
unchanged, so its true gradient is 0 and what backward computes is rounding noise; Adam divides by
the noise's own size, so two runs that round differently move it by up to ``lr`` per step.
"""
import copy
import math
import uuid

import pytest
import torch
import torch.nn as nn

from dtrain_lab.i18n import LabError
from dtrain_lab.perfmodel import zero_comm_volume, zero_memory
from conftest import job_metrics
from forkjob import fork_launch

WORLD_SIZES = [2, 3]
STEPS = 3
NUMEL = 127
TOL = 1e-6
LR = 1e-2


@pytest.fixture(scope="module")
def results():
    return {n: fork_launch("dtrain_lab.demos.zero_run", nproc=n, args=[STEPS], timeout=240, quiet=True,
                           env={"DTRAIN_TEST_TAG": uuid.uuid4().hex})
            for n in WORLD_SIZES}


# ---- the reference, computed here (not in the lesson's program): single process, unsharded, the
# concatenation of every rank's batch, torch.optim (and clip_grad_norm_), from the demo's seeds
OPTIMIZERS = {"Adam": (torch.optim.Adam, {"lr": LR}),
              "AdamW": (torch.optim.AdamW, {"lr": LR, "weight_decay": 0.1}),
              "SGD": (torch.optim.SGD, {"lr": LR * 10, "momentum": 0.9})}
_REFS: dict = {}


def single_process(n: int, what: str, opt: str, clip: float | None = None, **kw):
    """``(state_dict, grad norms before clipping)`` after STEPS steps of one process on ``n`` ranks' data."""
    from dtrain_lab.demos import zero_run as demo   # the model, seeds and loss only: the lesson's data

    key = (n, what, opt, clip, tuple(sorted(kw.items())))
    if key not in _REFS:
        torch.manual_seed(0)
        if what == "net":
            model = demo.Net127(seed=0)
            batches = [demo.net_batch(n * demo.PER_RANK_BATCH, seed=10 + s) for s in range(STEPS)]
            loss_fn = demo.net_loss
        else:
            from dtrain_lab.models import TinyTransformer
            model = TinyTransformer(vocab=11, d=8, n_heads=2, n_layers=2, max_len=8, seed=0)
            batches = [(demo.lm_batch(n * demo.PER_RANK_BATCH, seed=20 + s),) for s in range(STEPS)]
            loss_fn = demo.lm_loss
        cls, base_kw = OPTIMIZERS[opt] if opt in OPTIMIZERS else (getattr(torch.optim, opt), {})
        optimizer = cls(model.parameters(), **{**base_kw, **kw})
        norms = []
        for step in range(STEPS):
            optimizer.zero_grad()
            loss_fn(model, *batches[step]).backward()
            if clip is not None:
                norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), clip).item())
            optimizer.step()
        _REFS[key] = ({k: v.detach().clone() for k, v in model.state_dict().items()}, norms)
    return _REFS[key]


def diffs(params: dict, ref: dict) -> dict:
    """Largest absolute difference per tensor between the demo's raw parameters and the reference."""
    assert sorted(params) == sorted(ref)
    return {k: (torch.tensor(params[k]) - v.float()).abs().max().item() for k, v in ref.items()}


def _real(rank: int, numel: int, shard: int) -> int:
    """Elements of a ``numel``-element flat buffer in ``rank``'s slice of ``shard``, padding excluded."""
    return len(range(rank * shard, min(numel, (rank + 1) * shard)))


def metrics(results, n):
    return job_metrics(results[n], n)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("n", WORLD_SIZES)
def test_job_ok(results, n):
    for rank, m in metrics(results, n).items():
        assert m["rank"] == rank and m["world_size"] == n
        assert m["numel"] == NUMEL and NUMEL % n
        assert m["shard_numel"] == math.ceil(NUMEL / n) and m["steps"] == STEPS


@pytest.mark.timeout(300)
@pytest.mark.parametrize("n", WORLD_SIZES)
def test_stage1_stage2_equal_single_process(results, n):
    shard = math.ceil(NUMEL / n)
    for m in metrics(results, n).values():
        for key, c in m["stage12"].items():
            name, stage = key.split("/")
            ref, _ = single_process(n, "net", name)
            assert max(diffs(c["params"], ref).values()) < TOL, (key, diffs(c["params"], ref))
            # optimizer state on this rank: one value per real element of its slice (none for padding)
            per_elem = {"Adam": 2, "AdamW": 2, "SGD": 1}[name]
            real = _real(m["rank"], NUMEL, shard)
            assert c["state_numel"] == per_elem * real, key
            sb = c["state_bytes"]
            assert sb["params"] == 4 * n * shard                        # full (padded) flat buffer
            assert sb["grads"] == (4 * n * shard if stage.startswith("1") else 4 * shard)
            assert sb["optimizer"] == 4 * per_elem * real               # fp32: no extra master copy
            # the paper's formulas (perfmodel) with Ψ = the padded count N·S; a slice with padding
            # holds less optimizer state than Ψ/N
            predicted = zero_memory(n * shard, int(stage[0]), n, precision="fp32", k=4 * per_elem)
            assert {k: sb[k] for k in ("params", "grads")} == pytest.approx(
                {k: predicted[k] for k in ("params", "grads")})
            assert sb["optimizer"] == pytest.approx(predicted["optimizer"] * real / shard)
            if stage == "2b":     # buckets of >= 40: (scale, l2.bias, l2.weight) = 50, (l1.*) = 77
                assert c["peak_grad_numel"] == 77
            else:                 # every full gradient alive at once before the reduction
                assert c["peak_grad_numel"] == NUMEL
    checks = [m["stage12"] for m in metrics(results, n).values()]
    for key in checks[0]:                                               # every rank holds the same model
        assert len({c[key]["checksum"] for c in checks}) == 1


@pytest.mark.timeout(300)
@pytest.mark.parametrize("n", WORLD_SIZES)
def test_comm_bytes_are_what_was_sent(results, n):
    shard = math.ceil(NUMEL / n)
    full, per_call = 4 * n * shard, (n - 1) * shard * 4     # ring: (N-1)/N of the N·S·4-byte flat buffer
    for rank, m in metrics(results, n).items():
        mine = len(range(rank * shard, min(NUMEL, (rank + 1) * shard)))   # real elements this rank owns
        for key, c in m["stage12"].items():
            stage = key.split("/")[1]
            seen = c["traced"]              # what CommDebugMode saw this rank pass to torch.distributed
            assert sum(seen["calls"].values()) == sum(c["calls"].values()), key
            assert seen["bytes"].get("all_gather") == STEPS * 4 * shard          # its shard, every step
            if stage == "1":                # all-reduce 2(N-1)/N Ψ + all-gather (N-1)/N Ψ
                assert seen["bytes"]["all_reduce"] == STEPS * full
                assert c["comm_bytes"] == {"all_reduce": 2 * STEPS * per_call, "reduce_scatter": 0,
                                           "all_gather": STEPS * per_call, "reduce": 0}
            elif stage in ("1rs", "2"):     # reduce-scatter + all-gather: 2 (N-1)/N Ψ, like plain DP
                assert seen["bytes"]["reduce_scatter"] == STEPS * full
                assert c["comm_bytes"] == {"all_reduce": 0, "reduce_scatter": STEPS * per_call,
                                           "all_gather": STEPS * per_call, "reduce": 0}
                paper = zero_comm_volume(n * shard, int(stage[0]), n, bytes_per_elem=4)
                assert STEPS * paper["total"] == pytest.approx(sum(c["comm_bytes"].values()))
            else:                           # per-owner reduces: every gradient element but my own, once
                assert seen["bytes"]["reduce"] == STEPS * NUMEL * 4              # every piece passes by
                assert c["comm_bytes"] == {"all_reduce": 0, "reduce_scatter": 0,
                                           "all_gather": STEPS * per_call, "reduce": STEPS * (NUMEL - mine) * 4}
        s3 = m["stage3"]["net"]
        padded = sum(n * s for _, _, s in s3["units"])
        assert s3["traced"]["bytes"] == {"all_gather": 2 * STEPS * 4 * padded // n,
                                         "reduce_scatter": STEPS * 4 * padded}
        # all-gather in forward and again in backward, one reduce-scatter: 3 (N-1)/N Ψ per step
        assert s3["comm_bytes"] == {"all_reduce": 0, "reduce_scatter": STEPS * (n - 1) * padded * 4 // n,
                                    "all_gather": 2 * STEPS * (n - 1) * padded * 4 // n, "reduce": 0}
        assert STEPS * zero_comm_volume(padded, 3, n, bytes_per_elem=4)["total"] == pytest.approx(
            sum(s3["comm_bytes"].values()))


@pytest.mark.timeout(300)
@pytest.mark.parametrize("n", WORLD_SIZES)
def test_stage1_equals_zero_redundancy_optimizer(results, n):
    ms = metrics(results, n)
    for m in ms.values():
        c = m["zero_redundancy"]
        assert c["max_diff"] < TOL
        shard = math.ceil(NUMEL / n)
        assert c["our_state_numel"] == 2 * _real(m["rank"], NUMEL, shard)
    # PyTorch partitions whole parameters, so its shards are uneven; both add up to the model, no padding
    assert sum(m["zero_redundancy"]["their_state_numel"] for m in ms.values()) == 2 * NUMEL
    assert sum(m["zero_redundancy"]["our_state_numel"] for m in ms.values()) == 2 * NUMEL


@pytest.mark.timeout(300)
@pytest.mark.parametrize("n", WORLD_SIZES)
def test_clip_global_norm_right_per_shard_wrong(results, n):
    ms = metrics(results, n)
    for m in ms.values():
        c = m["clipping"]
        ref, ref_norms = single_process(n, "net", "SGD", clip=0.05, lr=0.5, momentum=0.0)
        for stage in (1, 2):
            right, wrong = c[f"right/{stage}"], c[f"wrong/{stage}"]
            assert right["norms"] == pytest.approx(ref_norms, rel=1e-6)
            assert max(diffs(right["params"], ref).values()) < TOL
            assert max(diffs(wrong["params"], ref).values()) > 1e-3   # the model it trains is another one
            assert wrong["norms"][0] < ref_norms[0]          # a shard's norm < the whole gradient's
    # at the first step (same model everywhere) the squared local norms add up to the squared global norm
    total = sum(m["clipping"]["wrong/1"]["norms"][0] ** 2 for m in ms.values())
    assert math.sqrt(total) == pytest.approx(single_process(n, "net", "SGD", clip=0.05, lr=0.5, momentum=0.0)[1][0],
                                             rel=1e-5)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("n", WORLD_SIZES)
def test_bf16_keeps_fp32_master_shard(results, n):
    shard = math.ceil(NUMEL / n)
    ms = metrics(results, n)
    for m in ms.values():
        b = m["bf16"]
        assert b["param_dtype"] == "torch.bfloat16" and b["master_dtype"] == "torch.float32"
        assert b["master_numel"] == shard and b["shard_is_cast_master"]
        # mixed precision, stage 2: params 2Ψ, grads 2Ψ/N, optimizer (fp32 master + m + v) 12Ψ/N;
        # the master slice includes the padding, m and v only the real elements
        real = _real(m["rank"], NUMEL, shard)
        assert b["state_bytes"] == {"params": 2 * n * shard, "grads": 2 * shard, "optimizer": 4 * shard + 8 * real}
        predicted = zero_memory(n * shard, 2, n, precision="mixed")
        assert {k: b["state_bytes"][k] for k in ("params", "grads")} == pytest.approx(
            {k: predicted[k] for k in ("params", "grads")})
        assert b["state_bytes"]["optimizer"] <= predicted["optimizer"]
    assert len({m["bf16"]["checksum"] for m in ms.values()}) == 1


@pytest.mark.timeout(300)
@pytest.mark.parametrize("n", WORLD_SIZES)
def test_parameters_without_gradient_are_left_alone_as_torch_optim_does(results, n):
    """Frozen layer, branch used on steps 0 and 2, gate on steps 0, 2 and 3 (of 4), tied embedding,
    StepLR: every stage and ZeroRedundancyOptimizer end where torch.optim ends."""
    ms = metrics(results, n)
    keys = {f"{o}/{s}/tied" for o in ("Adam", "AdamW") for s in ("1", "1rs", "2", "2b", "3", "zero_redundancy")}
    keys |= {f"{o}/3/untied" for o in ("Adam", "AdamW")}
    for m in ms.values():
        assert set(m["skips"]) == keys
        for key, c in m["skips"].items():
            assert c["max_diff"] < TOL, (key, c["max_diff"])
            assert c["frozen_unchanged"], key                    # bit for bit: no weight decay
            if "lr" in c:
                assert c["lr"] == pytest.approx(0.05 * 0.5 ** 2)   # StepLR(2, 0.5) after 4 steps, honoured
    # Adam's step count per parameter, over the pieces every rank holds: a step without a gradient
    # does not count (torch.optim skips the parameter); the frozen layer has no optimizer state at all
    for key in ms[0]["skips"]:
        if "zero_redundancy" in key:
            continue
        counts: dict[str, set] = {}
        for m in ms.values():
            for name, steps in m["skips"][key]["steps"].items():
                counts.setdefault(name, set()).update(steps)
        assert counts.pop("branch.weight") == {2} and counts.pop("branch.bias") == {2}, key
        assert counts.pop("gate") == {3}, key
        assert not any(k.startswith("frozen") for k in counts), key
        assert all(v == {4} for v in counts.values()), (key, counts)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("n", WORLD_SIZES)
def test_resume_from_state_dict_equals_uninterrupted(results, n):
    for m in metrics(results, n).values():
        assert m["resume"] == {"1": 0.0, "2": 0.0, "2b": 0.0, "3": 0.0, "2-bf16": 0.0}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("n", WORLD_SIZES)
def test_stage3_equals_single_process_and_shards_everything(results, n):
    for m in metrics(results, n).values():
        net = m["stage3"]["net"]
        ref, ref_norms = single_process(n, "net", "Adam", clip=0.5)
        assert max(diffs(net["params"], ref).values()) < TOL
        assert net["norms"] == pytest.approx(ref_norms, rel=1e-6)
        assert [u[:2] for u in net["units"]] == [["l1", 77], ["l2", 48], ["<root>", 2]]
        shards = sum(s for _, _, s in net["units"])
        real = sum(_real(m["rank"], k, s) for _, k, s in net["units"])
        assert all(s == math.ceil(k / n) for _, k, s in net["units"])
        assert net["state_numel"] == 2 * real
        assert net["state_bytes"] == {"params": 4 * shards, "grads": 4 * shards, "optimizer": 8 * real}
        assert net["params_storage_between_steps"] == 0            # no full parameter kept
        # the root's own parameters stay gathered during the whole forward, plus one child unit
        assert net["peak_gathered_numel"] == n * math.ceil(2 / n) + n * math.ceil(77 / n)

        tiny = m["stage3"]["tiny"]
        bad = {k: d for k, d in diffs(tiny["params"], single_process(n, "tiny", "Adam")[0]).items() if d >= TOL}
        assert set(bad) <= {"blocks.0.k_proj.bias", "blocks.1.k_proj.bias"}, bad   # see module docstring
        assert all(d <= LR * STEPS for d in bad.values())
        units = [u[0] for u in tiny["units"]]
        assert units == ["tok_emb", "pos_emb", "blocks.0", "blocks.1", "ln_f", "head"]
        block = n * math.ceil(872 / n)
        assert tiny["peak_gathered_numel"] == block and tiny["peak_gathered_units"] == 1
        assert tiny["peak_gathered_numel"] < tiny["numel"] / 2


# ------------------------------------------------------------------------- in-process, world of one
def _tiny():
    from dtrain_lab.models import TinyTransformer
    return TinyTransformer(vocab=11, d=8, n_heads=2, n_layers=2, max_len=8, seed=0)


def _loss(model, toks):
    out = model(toks[:, :-1])
    return nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), toks[:, 1:].reshape(-1))


@pytest.mark.parametrize("kind", ["stage1", "stage1rs", "stage2", "stage2b", "stage3"])
@pytest.mark.parametrize("opt_class", [torch.optim.Adam, torch.optim.SGD])
def test_world_of_one_equals_plain_optimizer(kind, opt_class):
    from dtrain_lab.parallel.zero import ShardedOptimizer, ZeroStage3
    torch.manual_seed(0)
    ref, model = _tiny(), _tiny()
    kw = {"lr": LR} if opt_class is torch.optim.Adam else {"lr": 0.1, "momentum": 0.9}
    opt = opt_class(ref.parameters(), **kw)
    if kind == "stage3":
        z = ZeroStage3(model, opt_class, **kw)
    else:
        z = ShardedOptimizer(model.parameters(), opt_class, stage=int(kind[5]), **kw,
                             grad_reduce="reduce_scatter" if kind == "stage1rs" else None,
                             reduce_in_backward=kind == "stage2b", bucket_numel=300)
    for _ in range(STEPS):
        toks = torch.randint(0, 11, (4, 8))
        opt.zero_grad()
        _loss(ref, toks).backward()
        opt.step()
        z.zero_grad()
        _loss(model, toks).backward()
        z.step()
    got = z.gather_full_state_dict() if kind == "stage3" else model.state_dict()
    for k, v in ref.state_dict().items():
        assert torch.equal(got[k], v), k
    assert z.comm_bytes == {"all_reduce": 0, "reduce_scatter": 0, "all_gather": 0, "reduce": 0}


def test_stage3_frees_full_parameters_between_steps_and_in_eval():
    from dtrain_lab.parallel.zero import ZeroStage3
    model = _tiny()
    z = ZeroStage3(model, torch.optim.Adam, lr=LR)
    toks = torch.randint(0, 11, (2, 8))
    with torch.no_grad():
        before = z.module(toks)
    assert all(u.flat.full.untyped_storage().size() == 0 for u in z.units)
    assert torch.allclose(before, _tiny()(toks), atol=1e-6)       # gathering gives back the same weights
    _loss(z.module, toks).backward()
    assert all(u.flat.full.untyped_storage().size() == 0 for u in z.units)
    assert all(p.grad is None for p in model.parameters())        # full gradients freed after reduce
    assert all(u.flat.grad is not None for u in z.units)


def test_bad_input_gives_clear_errors():
    from dtrain_lab.parallel.zero import ShardedOptimizer, ZeroStage3
    model = _tiny()
    with pytest.raises(LabError) as e:
        ShardedOptimizer(model.parameters(), torch.optim.Adam, stage=3)
    assert "ZeroStage3" in str(e.value)
    with pytest.raises(LabError):
        ShardedOptimizer([], torch.optim.Adam)
    with pytest.raises(LabError):
        ShardedOptimizer([{"lr": 0.1}], torch.optim.Adam)
    with pytest.raises(LabError):
        ShardedOptimizer(["weights"], torch.optim.Adam)
    w = nn.Parameter(torch.ones(3))
    with pytest.raises(LabError):
        ShardedOptimizer([w, w], torch.optim.Adam)
    with pytest.raises(LabError):
        ShardedOptimizer([{"params": [w]}, {"params": [w]}], torch.optim.Adam)
    with pytest.raises(LabError):
        ShardedOptimizer([w, nn.Parameter(torch.ones(2, dtype=torch.float64))], torch.optim.Adam)
    opt = ShardedOptimizer([w], torch.optim.Adam)
    with pytest.raises(LabError) as e:
        opt.add_param_group({"params": [nn.Parameter(torch.ones(2))]})
    assert "ShardedOptimizer" in str(e.value)
    from dtrain_lab.models import TiedMLP
    tied = TiedMLP(seed=0)
    with pytest.raises(LabError) as e:      # a tied weight in two units: leave it to the root
        ZeroStage3(tied, torch.optim.Adam, units=[tied.embed, tied.head])
    assert "units" in str(e.value)
    with pytest.raises(LabError) as e:
        ShardedOptimizer([w], torch.optim.Adam).load_state_dict({"zero": {"rank": 1, "world_size": 2}})
    with pytest.raises(LabError):
        ZeroStage3(model, torch.optim.Adam, units=[model])
    with pytest.raises(LabError):
        ShardedOptimizer(model.parameters(), torch.optim.Adam, stage=1, reduce_in_backward=True)
    with pytest.raises(LabError):
        ShardedOptimizer(model.parameters(), torch.optim.Adam, stage=2, grad_reduce="all_reduce")


def test_state_dict_round_trip():
    from dtrain_lab.parallel.zero import ShardedOptimizer
    a, b = _tiny(), _tiny()
    oa = ShardedOptimizer(a.parameters(), torch.optim.Adam, stage=2, lr=LR)
    toks = torch.randint(0, 11, (4, 8), generator=torch.Generator().manual_seed(3))
    _loss(a, toks).backward()
    oa.step()
    ob = ShardedOptimizer(b.parameters(), torch.optim.Adam, stage=2, lr=LR)
    b.load_state_dict(a.state_dict())       # fp32: the master slice is the parameters themselves
    ob.load_state_dict(copy.deepcopy(oa.state_dict()))
    assert ob.state_dict()["state"].keys() == oa.state_dict()["state"].keys()
    for o, m in ((oa, a), (ob, b)):
        o.zero_grad()
        _loss(m, toks).backward()
        o.step()
    for (k, v), w in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(v, w), k


def _branchy():
    from dtrain_lab.demos.zero_cases import Mixed
    return Mixed(tied=True)


def test_world_of_one_param_groups_scheduler_and_skips_equal_torch_optim():
    """Two parameter groups (no weight decay on biases), a LambdaLR schedule, a frozen layer and
    parameters unused in some steps: ShardedOptimizer at world size 1 is torch.optim.AdamW exactly."""
    from dtrain_lab.demos.zero_cases import loss_fn
    from dtrain_lab.parallel.zero import ShardedOptimizer

    def groups(m):
        decay = [p for n, p in m.named_parameters() if not n.endswith("bias")]
        return [{"params": decay}, {"params": [p for n, p in m.named_parameters() if n.endswith("bias")],
                                    "weight_decay": 0.0}]

    ref, model = _branchy(), _branchy()
    opt_ref = torch.optim.AdamW(groups(ref), lr=0.05, weight_decay=0.1)
    opt = ShardedOptimizer(groups(model), torch.optim.AdamW, stage=2, lr=0.05, weight_decay=0.1)
    assert isinstance(opt, torch.optim.Optimizer)
    assert [g["weight_decay"] for g in opt.param_groups] == [0.1, 0.0] and opt.param_groups[0]["betas"] == (0.9, 0.999)
    scheds = [torch.optim.lr_scheduler.LambdaLR(o, lambda s: 1.0 / (1 + s)) for o in (opt_ref, opt)]
    g = torch.Generator().manual_seed(0)
    for step in range(5):
        x, y = torch.randint(0, 7, (3, 4), generator=g), torch.randint(0, 7, (3, 4), generator=g)
        for o, m, sch in ((opt_ref, ref, scheds[0]), (opt, model, scheds[1])):
            def closure(m=m, step=step, x=x, y=y):   # step(closure) as torch.optim takes it
                loss = loss_fn(m, step, x, y)
                loss.backward()
                return loss
            o.zero_grad()
            assert o.step(closure) is not None
            sch.step()
    assert opt.param_groups[0]["lr"] == opt_ref.param_groups[0]["lr"]
    for (k, v), w in zip(ref.state_dict().items(), model.state_dict().values()):
        assert torch.equal(v, w), k


def test_lr_set_on_either_side_is_honoured():
    """A scheduler on the ShardedOptimizer (its param_groups) or, by mistake, on the wrapped optimizer:
    the next step uses the new learning rate either way (the two sides are reconciled at each step)."""
    from dtrain_lab.parallel.zero import ShardedOptimizer

    for side in ("outer", "inner"):
        ref, model = _tiny(), _tiny()
        opt_ref = torch.optim.SGD(ref.parameters(), lr=0.1)
        opt = ShardedOptimizer(model.parameters(), torch.optim.SGD, stage=1, lr=0.1)
        sched = torch.optim.lr_scheduler.StepLR(opt if side == "outer" else opt.optimizer, step_size=1, gamma=0.5)
        sched_ref = torch.optim.lr_scheduler.StepLR(opt_ref, step_size=1, gamma=0.5)
        toks = torch.randint(0, 11, (4, 8), generator=torch.Generator().manual_seed(5))
        for _ in range(3):
            for o, m, sch in ((opt_ref, ref, sched_ref), (opt, model, sched)):
                o.zero_grad()
                _loss(m, toks).backward()
                o.step()
                sch.step()
        driven = opt if side == "outer" else opt.optimizer
        assert driven.param_groups[0]["lr"] == opt_ref.param_groups[0]["lr"] == 0.1 * 0.5 ** 3, side
        for (k, v), w in zip(ref.state_dict().items(), model.state_dict().values()):
            assert torch.equal(v, w), (side, k)
