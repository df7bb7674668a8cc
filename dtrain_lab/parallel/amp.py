"""Mixed precision on any machine: number formats, autocast, loss scaling, measured.

The recipe is the one of P. Micikevicius, S. Narang, J. Alben, et al., "Mixed Precision Training",
ICLR 2018 (arXiv:1710.03740): keep an fp32 *master copy* of the weights (the optimizer updates it),
run the matrix products in a 16-bit format, keep reductions and losses in fp32, and — for fp16 —
multiply the loss by a *scale* so that small gradients do not flush to zero in fp16.

PyTorch's current API is device-generic: ``torch.autocast(device_type, dtype)`` (also spelled
``torch.amp.autocast``) and ``torch.amp.GradScaler(device_type)``. The ``torch.cuda.amp.*`` and
``torch.cpu.amp.*`` spellings are deprecated (they warn with a ``FutureWarning``).

``torch.amp.GradScaler`` in short (``torch/amp/grad_scaler.py``): ``scale(loss)`` multiplies by the
current scale (default ``init_scale=2**16``); ``step(opt)`` unscales the gradients, and if any is inf
or NaN **skips** ``opt.step()``; ``update()`` then multiplies the scale by ``backoff_factor`` (0.5) after
a skipped step, or by ``growth_factor`` (2.0) after ``growth_interval`` (2000) steps in a row without
inf/NaN. The helpers below run it on tiny models so that every one of these rules can be watched.

Whole training runs per precision (losses, step times) are drivers: :mod:`dtrain_lab.demos.amp_runs`.
"""
from __future__ import annotations

import contextlib
import math

import torch
import torch.nn.functional as F

from dtrain_lab.data import regression_dataset
from dtrain_lab.models import MLP

__all__ = ["FORMATS", "one_thread", "format_table", "autocast_dtypes", "grad_census", "underflow_table",
           "scaler_trace", "scaler_rule_violations"]

FORMATS = (torch.float32, torch.bfloat16, torch.float16)


@contextlib.contextmanager
def one_thread():
    """Run the block on one intra-op thread, then restore the setting. The models here are tiny:
    extra threads gain nothing, and on a busy machine their synchronisation can cost 10-30× the work."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


# ------------------------------------------------------------------------------------ formats
def format_table(dtypes=FORMATS) -> list[dict]:
    """Bits, range and precision of floating-point formats, from ``torch.finfo``.

    ``eps`` is the gap between 1 and the next number (relative precision); ``smallest_normal`` the
    smallest number with full precision; below it come the subnormals, down to
    ``smallest_subnormal = smallest_normal × eps``; half of that rounds to zero.
    """
    rows = []
    for dt in dtypes:
        fi = torch.finfo(dt)
        mantissa = round(-math.log2(fi.eps))
        rows.append({"dtype": str(dt).replace("torch.", ""), "bits": fi.bits, "exponent_bits": fi.bits - 1 - mantissa,
                     "mantissa_bits": mantissa, "max": fi.max, "smallest_normal": fi.smallest_normal,
                     "smallest_subnormal": fi.smallest_normal * fi.eps, "eps": fi.eps})
    return rows


# ------------------------------------------------------------------------------------ autocast
@one_thread()
def autocast_dtypes(device_type: str = "cpu", dtype: torch.dtype = torch.bfloat16) -> dict[str, str]:
    """The dtype each operation *produces* inside ``torch.autocast(device_type, dtype)`` from fp32
    inputs and an fp32 ``nn.Linear``, plus the dtypes of the weight and of its gradient afterwards."""
    torch.manual_seed(0)
    dev = "cuda" if device_type == "cuda" else "cpu"
    lin = torch.nn.Linear(8, 4).to(dev)
    x = torch.randn(2, 8, device=dev)
    target = torch.tensor([0, 1], device=dev)
    with torch.autocast(device_type, dtype=dtype):
        y = lin(x)
        results = {
            "linear": y,
            "matmul": x @ x.T,
            "relu": torch.relu(y),
            "softmax": torch.softmax(y, dim=-1),
            "log_softmax": torch.log_softmax(y, dim=-1),
            "layer_norm": F.layer_norm(y, (4,)),
            "exp": torch.exp(y),
            "sum": y.sum(),
            "mse_loss": F.mse_loss(y, torch.zeros_like(y)),
            "cross_entropy": F.cross_entropy(y, target),
        }
        loss = results["cross_entropy"]
    out = {name: str(t.dtype).replace("torch.", "") for name, t in results.items()}
    loss.backward()
    out["weight (parameter)"] = str(lin.weight.dtype).replace("torch.", "")
    out["weight.grad"] = str(lin.weight.grad.dtype).replace("torch.", "")
    return out


# ------------------------------------------------------------------------------------ gradients
def grad_census(grads) -> dict:
    """How many gradient elements are exactly zero, and how many are inf or NaN.

    ``grads``: a module (its parameters' ``.grad``), or an iterable of tensors."""
    if isinstance(grads, torch.nn.Module):
        grads = [p.grad for p in grads.parameters() if p.grad is not None]
    total = zeros = nonfinite = 0
    for g in grads:
        total += g.numel()
        zeros += int((g == 0).sum())
        nonfinite += int((~torch.isfinite(g)).sum())
    return {"total": total, "zeros": zeros, "nonfinite": nonfinite}


def _small_problem(seed: int = 0):
    data = regression_dataset(n=256, d_in=16, d_out=4, seed=seed)
    return MLP(16, 64, 4, depth=3, seed=seed), data.tensors


def _grads(model, x, y, weight: float, fp16: bool, scale: float) -> torch.Tensor:
    model.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.float16, enabled=fp16):
        loss = weight * F.mse_loss(model(x), y)
    (loss * scale).backward()
    return torch.cat([p.grad.reshape(-1) / scale for p in model.parameters()])


@one_thread()
def underflow_table(weights=(1.0, 1e-2, 1e-3, 1e-4, 1e-5), scale: float = 2.0 ** 16, seed: int = 0) -> list[dict]:
    """Gradients of ``weight × MSE`` on an MLP, in fp32 and under fp16 autocast (CPU), unscaled and
    with the loss multiplied by ``scale`` (then divided back, as ``GradScaler`` does).

    Per weight: the largest fp32 gradient; the fraction of gradient elements that are non-zero in fp32
    but exactly zero in fp16 (flushed), and the relative error ``‖g16 − g32‖ / ‖g32‖``, without and with
    scaling. A small ``weight`` stands for small gradients: a loss term with a small weight, or a model
    late in training."""
    model, (x, y) = _small_problem(seed)
    rows = []
    for w in weights:
        ref = _grads(model, x, y, w, fp16=False, scale=1.0)
        nonzero = ref != 0
        row = {"weight": w, "max_grad": ref.abs().max().item()}
        for tag, s in (("plain", 1.0), ("scaled", scale)):
            g = _grads(model, x, y, w, fp16=True, scale=s)
            row[f"flushed_{tag}"] = ((g == 0) & nonzero).sum().item() / nonzero.sum().item()
            row[f"rel_err_{tag}"] = ((g - ref).norm() / ref.norm()).item()
        rows.append(row)
    return rows


# ------------------------------------------------------------------------------------ GradScaler
@one_thread()
def scaler_trace(steps: int = 8, *, init_scale: float = 2.0 ** 16, growth_interval: int = 2000,
                 fp16: bool = True, inject_inf_at=(), lr: float = 0.05, seed: int = 0) -> list[dict]:
    """Train the small MLP for ``steps`` SGD steps with ``torch.amp.GradScaler("cpu", init_scale=...,
    growth_interval=...)`` (defaults for the other factors), under fp16 autocast if ``fp16``. At the
    steps in ``inject_inf_at`` an ``inf`` is written into one gradient element after backward, as an
    overflow would.

    One row per step: the ``scale`` used, ``nonfinite`` gradient elements seen before ``step``,
    ``stepped`` (did any parameter change), ``next_scale`` after ``update()``."""
    model, (x, y) = _small_problem(seed)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    scaler = torch.amp.GradScaler("cpu", init_scale=init_scale, growth_interval=growth_interval)
    rows = []
    for step in range(steps):
        before = [p.detach().clone() for p in model.parameters()]
        scale = scaler.get_scale()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.float16, enabled=fp16):
            loss = F.mse_loss(model(x), y)
        scaler.scale(loss).backward()
        if step in inject_inf_at:
            with torch.no_grad():
                next(model.parameters()).grad.view(-1)[0] = float("inf")
        census = grad_census(model)
        scaler.step(opt)
        scaler.update()
        stepped = any(not torch.equal(b, p) for b, p in zip(before, model.parameters()))
        rows.append({"step": step, "scale": scale, "nonfinite": census["nonfinite"], "stepped": stepped,
                     "next_scale": scaler.get_scale(), "loss": loss.item()})
    return rows


def scaler_rule_violations(rows: list[dict], *, growth_interval: int, growth_factor: float = 2.0,
                           backoff_factor: float = 0.5) -> list[str]:
    """Check a :func:`scaler_trace` against GradScaler's rules; returns the steps that break one.

    inf/NaN found → the step is skipped and the scale is multiplied by ``backoff_factor``; otherwise
    the step is taken, and the scale is multiplied by ``growth_factor`` exactly when this is the
    ``growth_interval``-th step in a row without inf/NaN (the count restarts after each change)."""
    bad = []
    run = 0
    for r in rows:
        if r["nonfinite"]:
            run = 0
            ok = not r["stepped"] and r["next_scale"] == r["scale"] * backoff_factor
        else:
            run += 1
            grow = run == growth_interval
            if grow:
                run = 0
            ok = r["stepped"] and r["next_scale"] == r["scale"] * (growth_factor if grow else 1.0)
        if not ok:
            bad.append(f"step {r['step']}: {r}")
    return bad
