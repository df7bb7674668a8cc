"""Gradient accumulation (dtrain_lab.parallel.accum) and mixed precision (dtrain_lab.parallel.amp), as lesson 03 uses them.

One launch (world size 2) of dtrain_lab.demos.accum_equivalence checks accumulation under both DDPs
against a single-process large batch, no_sync's all-reduce count, the dtype DDP all-reduces under
autocast and a GradScaler skip on every rank; the rest runs in this process on tiny models.
"""
import warnings

import pytest
import torch
import torch.nn.functional as F

from dtrain_lab.demos import amp_runs
from dtrain_lab.parallel import accum, amp
from dtrain_lab.data import global_batch, regression_dataset
from dtrain_lab.models import MLP
from forkjob import fork_launch

MLP_NUMEL = 16 * 32 + 32 + 32 * 32 + 32 + 32 * 4 + 4  # MLP(16, 32, 4, depth=2)


# ------------------------------------------------------------------------------------ multi-process
@pytest.mark.timeout(300)
def test_accumulation_equals_large_batch_and_no_sync_saves_allreduces():
    micro, k, steps = 4, 4, 3
    r = fork_launch("dtrain_lab.demos.accum_equivalence", nproc=2, args=[micro, k, steps], timeout=200)
    assert r.ok, r.summary() + "\n" + "\n".join(x.output[-3000:] for x in r.ranks)
    for rank, m in r.metrics.items():
        assert m["global_batch"] == micro * k * 2 and m["numel"] == MLP_NUMEL
        for name in ("ours", "torch", "ours_every", "torch_every"):
            assert m[name]["max_abs_diff"] < 1e-6, (rank, name, m[name])
            assert m[name]["replicas_identical"], (rank, name)
        assert m["no_divide"]["max_abs_diff"] > 1e-3  # the bug changes the result
        # no_sync: one all-reduce per optimizer step (one bucket); without: one per micro-batch
        assert m["ours"]["allreduces"] == m["torch"]["allreduces"] == steps
        assert m["ours_every"]["allreduces"] == m["torch_every"]["allreduces"] == steps * k
        assert m["ours"]["allreduce_bytes"] == m["torch"]["allreduce_bytes"] == steps * 4 * MLP_NUMEL
        # autocast does not change what DDP all-reduces: fp32 gradients of fp32 parameters
        bf = m["torch_bf16"]
        assert bf["dtypes"] == {"torch.float32": steps} and bf["allreduce_bytes"] == steps * 4 * MLP_NUMEL
        assert bf["param_dtypes"] == bf["grad_dtypes"] == ["torch.float32"]
        assert 0 < bf["max_abs_diff"] < 1e-2
        # an inf on rank 1 only reaches every rank through the all-reduce: every rank skips the step
        assert m["scaler"]["skipped"] == [False, True, False]
        assert m["scaler"]["scales"] == [1024.0, 1024.0, 512.0, 512.0]


# ------------------------------------------------------------------------------------ accumulation
def _train(k: int, *, divide=True, optimizer="sgd", batchnorm=False, steps=3, batch=32) -> torch.Tensor:
    model = MLP(16, 32, 4, depth=2, seed=0)
    if batchnorm:
        model.layers.insert(1, torch.nn.BatchNorm1d(32))
    opt = (torch.optim.Adam(model.parameters(), lr=1e-2) if optimizer == "adam"
           else torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9))
    data = regression_dataset(n=256, seed=0)
    for step in range(steps):
        accum.accumulation_step(model, opt, accum.micro_batches(global_batch(data, step, batch), k), F.mse_loss,
                                divide=divide)
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def test_micro_batches_split_evenly_or_refuse():
    x, y = torch.arange(12.0).reshape(6, 2), torch.arange(6)
    parts = accum.micro_batches((x, y), 3)
    assert len(parts) == 3 and all(p[0].shape == (2, 2) and p[1].shape == (2,) for p in parts)
    assert torch.equal(torch.cat([p[1] for p in parts]), y)
    with pytest.raises(ValueError, match="micro-batches"):
        accum.micro_batches((x, y), 4)


def test_accumulation_in_one_process_equals_one_large_batch():
    ref = _train(1)
    torch.testing.assert_close(_train(4), ref)
    torch.testing.assert_close(_train(8), ref)


def test_forgetting_to_divide_matters_for_sgd_much_less_for_adam():
    sgd = (_train(4, divide=False) - _train(1)).abs().max().item()
    adam = (_train(4, divide=False, optimizer="adam") - _train(1, optimizer="adam")).abs().max().item()
    assert sgd > 1e-2 and adam < 1e-3  # Adam's update is nearly invariant to the gradient's scale


def test_batchnorm_breaks_the_equality():
    diff = (_train(4, batchnorm=True) - _train(1, batchnorm=True)).abs().max().item()
    assert diff > 1e-4  # batch statistics per micro-batch


# ------------------------------------------------------------------------------------ formats
def test_format_table_and_fp16_rounding():
    rows = {r["dtype"]: r for r in amp.format_table()}
    assert (rows["float32"]["exponent_bits"], rows["float32"]["mantissa_bits"]) == (8, 23)
    assert (rows["bfloat16"]["exponent_bits"], rows["bfloat16"]["mantissa_bits"]) == (8, 7)
    assert (rows["float16"]["exponent_bits"], rows["float16"]["mantissa_bits"]) == (5, 10)
    assert rows["float16"]["max"] == 65504 and rows["float16"]["smallest_subnormal"] == 2.0 ** -24
    assert rows["bfloat16"]["smallest_normal"] == rows["float32"]["smallest_normal"]
    half = torch.float16
    assert torch.tensor(2.0 ** -24, dtype=half).item() == 2.0 ** -24
    assert torch.tensor(2.0 ** -25, dtype=half).item() == 0.0      # halfway: rounds to even, zero
    assert torch.tensor(65519.0, dtype=half).item() == 65504.0
    assert torch.tensor(65520.0, dtype=half).item() == float("inf")
    assert (torch.tensor(256.0, dtype=torch.bfloat16) + 1).item() == 256.0


def test_cpu_autocast_dtypes():
    bf = amp.autocast_dtypes("cpu", torch.bfloat16)
    assert bf["linear"] == bf["matmul"] == "bfloat16"
    assert bf["mse_loss"] == bf["cross_entropy"] == "float32"
    assert bf["weight (parameter)"] == bf["weight.grad"] == "float32"
    fp = amp.autocast_dtypes("cpu", torch.float16)  # CPU autocast accepts float16 too in this torch
    assert fp["linear"] == "float16" and fp["weight.grad"] == "float32"


def test_grad_census():
    model = torch.nn.Linear(3, 1)
    model.weight.grad = torch.tensor([[0.0, float("inf"), 1.0]])
    model.bias.grad = torch.tensor([float("nan")])
    assert amp.grad_census(model) == {"total": 4, "zeros": 1, "nonfinite": 2}


# ------------------------------------------------------------------------------------ loss scaling
def test_fp16_underflow_and_scaling():
    small, tiny = amp.underflow_table(weights=(1.0, 1e-5))
    assert small["flushed_plain"] < 0.01 and small["rel_err_plain"] < 0.05
    assert tiny["flushed_plain"] > 0.5 and tiny["rel_err_plain"] > 0.5   # unscaled: most gradients lost
    assert tiny["flushed_scaled"] < 0.01 and tiny["rel_err_scaled"] < 0.05  # scaled by 2**16: kept


def test_grad_scaler_defaults_and_cpu_support():
    s = torch.amp.GradScaler("cpu")
    assert s.is_enabled()
    assert (s.get_scale(), s.get_growth_factor(), s.get_backoff_factor(), s.get_growth_interval()) == \
        (2.0 ** 16, 2.0, 0.5, 2000)


def test_scaler_trace_injected_inf_is_deterministic():
    rows = amp.scaler_trace(6, init_scale=1024.0, growth_interval=2, fp16=False, inject_inf_at=(2,))
    assert [r["scale"] for r in rows] == [1024, 1024, 2048, 1024, 1024, 2048]
    assert [r["stepped"] for r in rows] == [True, True, False, True, True, True]
    assert rows[2]["nonfinite"] == 1 and rows[3]["loss"] == rows[2]["loss"]  # skipped: same parameters
    assert amp.scaler_rule_violations(rows, growth_interval=2) == []


def test_scaler_trace_fp16_overflow_backs_off_and_grows():
    rows = amp.scaler_trace(12, init_scale=2.0 ** 24, growth_interval=3)
    assert rows[0]["nonfinite"] > 0 and not rows[0]["stepped"]
    assert any(r["next_scale"] > r["scale"] for r in rows)
    assert amp.scaler_rule_violations(rows, growth_interval=3) == []


def test_scaler_rule_violations_catches_a_wrong_trace():
    bad = [{"step": 0, "scale": 8.0, "nonfinite": 1, "stepped": True, "next_scale": 4.0},
           {"step": 1, "scale": 4.0, "nonfinite": 0, "stepped": True, "next_scale": 8.0}]
    assert len(amp.scaler_rule_violations(bad, growth_interval=3)) == 2


def test_losses_close_across_precisions():
    ref = amp_runs.train_losses("fp32", steps=20)
    for p in ("bf16", "fp16"):
        other = amp_runs.train_losses(p, steps=20)
        assert max(abs(a - b) for a, b in zip(ref, other)) < 0.05 * ref[0]
    with pytest.raises(ValueError):
        amp_runs.train_losses("fp8")


def test_old_cuda_amp_spellings_warn():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.amp.GradScaler()
        torch.cuda.amp.autocast()
        torch.cpu.amp.autocast()
    future = [str(w.message) for w in caught if issubclass(w.category, FutureWarning)]
    assert any("torch.amp.GradScaler('cuda'" in m for m in future)
    assert any("torch.amp.autocast('cuda'" in m for m in future)
    assert any("torch.amp.autocast('cpu'" in m for m in future)
