"""Lab 02 — gradient buckets by hand: the contract of its three exercises (what a submission may import).

Three exercises, each a function the learner writes in the lab notebook
(``solutions/_source/lab_02_ddp.md``), following :mod:`dtrain_lab.parallel.ddp` and the PyTorch DDP paper
(Li et al., PVLDB 13(12), 2020, §3.2):

1. ``build_buckets(params, cap_bytes) -> list[list[int]]``: DDP's bucket assignment (a pure
   function, graded on one rank, on cases drawn for every grade);
2. ``sync_gradients(params, buckets, group=None)``: after backward, one all-reduce of one flat
   buffer per bucket, averaged and written back into ``param.grad`` (2 and 3 ranks);
3. ``attach_overlap(params, buckets, group=None) -> finish``: the same, but each bucket's all-reduce
   is launched asynchronously from ``register_post_accumulate_grad_hook`` while backward still runs;
   ``finish()`` waits and writes back (2 and 3 ranks).

The learner's file ends with a ``run()`` the grader calls in every rank. It hands the learner's
function to a driver here (:func:`bucket_cases`, :func:`train`, :func:`train_overlap`) that returns
what happened. Every rank trains on its own shard of the batch, private to it and drawn for every
grade (:func:`make_inputs`): the gradient of the global batch exists only after a real all-reduce.
The checks (``dtrain_lab.grading.checks.lab02``) run outside the sandbox.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from dtrain_lab.grading import contract

LAB = "lab_02"
CAP_BYTES = 300        # bucket cap of exercises 2 and 3: three buckets for the lab's model
GLOBAL_BATCH = 12      # divisible by 2 and 3: equal shards, so the average gradient is exact
STEPS = 3
LR = 0.1
D_IN, D_HIDDEN, D_OUT = 8, 16, 4
BUCKETS = [[5, 4, 3], [2], [1, 0]]   # exercises 2 and 3 are handed these buckets (CAP_BYTES on the lab's model)
DTYPES = {"float16": torch.float16, "float32": torch.float32, "float64": torch.float64}


def withhold_bucket_assignment(rt=None) -> None:
    """Exercise 1's ``setup`` (in the rank, before the submission is imported): PyTorch's own bucket
    assignment (``torch.distributed._compute_bucket_assignment_by_size``, which DDP calls to build its
    first buckets) is the answer to this exercise, so in the grader it raises, in the learner's
    language, instead; so does building a ``DistributedDataParallel``, which calls it. The course's
    DDP is hidden for the same reason (``Exercise.hide``)."""
    import torch._C._distributed_c10d as c10d
    import torch.distributed as dist

    from dtrain_lab.i18n import LabError

    def withheld(*args, **kwargs):
        raise LabError("lab02_torch_buckets_withheld")

    for module in (dist, c10d):
        if hasattr(module, "_compute_bucket_assignment_by_size"):
            module._compute_bucket_assignment_by_size = withheld


def lab_model():
    """``MLP(8, 16, 4, depth=2)``: six parameters of 512, 64, 1024, 64, 256 and 16 bytes."""
    from dtrain_lab.models import MLP

    return MLP(d_in=D_IN, d_hidden=D_HIDDEN, d_out=D_OUT, depth=2, seed=0)


PARAM_NAMES = [n for n, _ in lab_model().named_parameters()]
LAB_SIZES = [(p.numel(), "float32") for p in lab_model().parameters()]


# ------------------------------------------------------------------ private inputs
def _bucket_cases(g) -> list:
    """Exercise 1's cases, drawn afresh for every grade: ``[name, [(numel, dtype), ...], cap]``."""
    def sizes(n, lo, hi, dtype="float32"):
        return [[g.randint(lo, hi), dtype] for _ in range(n)]

    # reverse order: k + k land exactly on the cap, then more follow (a bucket closed only above the cap
    # differs); the last float64 parameter alone reaches the cap, counted at 4 bytes an element it does not
    k = g.randint(10, 30)
    exact = [[g.randint(1, 2 * k), "float32"], [2 * k, "float32"], [k, "float32"], [k, "float32"]]
    big = sizes(2, 2, 10) + [[g.randint(200, 900), "float32"]] + sizes(2, 2, 10)
    cap64 = g.choice([120, 150, 200])
    float64 = sizes(g.randint(2, 4), 5, 20, "float64") + [[g.randint(-(-cap64 // 8), (cap64 - 1) // 4), "float64"]]
    # reverse order: a float16 parameter below the cap opens a bucket, then a float32 one alone reaches the cap
    # and closes its own first (one stream of buckets whatever the dtype, or the buckets listed in closing
    # order, differ), then a random mix
    cap_mix = g.choice([64, 100, 160])
    mixed = ([[g.randint(5, 40), g.choice(list(DTYPES))] for _ in range(g.randint(2, 5))]
             + [[g.randint(-(-cap_mix // 4), -(-cap_mix // 4) + 10), "float32"], [g.randint(3, cap_mix // 2 - 1), "float16"]])
    return [
        ["lab model", [list(s) for s in LAB_SIZES], g.choice([200, 300, 400, 600, 1100])],
        ["everything in one bucket", [list(s) for s in LAB_SIZES], 1 << 30],
        ["a bucket per parameter", sizes(g.randint(3, 6), 1, 50), 1],
        ["exactly the cap", exact, 8 * k],
        ["a parameter larger than the cap", big, 100],
        ["float64 parameters", float64, cap64],
        ["mixed dtypes", mixed, cap_mix],
        ["no parameters", [], 100],
    ]


def make_inputs(seed: int, world: int) -> list[dict]:
    """Every rank's private inputs: exercise 1's cases, and this rank's shard of every step's batch."""
    job = contract.rng(seed, "lab02")
    w = torch.randn(D_IN, D_OUT, generator=contract.torch_generator(seed, "w")) / D_IN ** 0.5
    per = GLOBAL_BATCH // world if GLOBAL_BATCH % world == 0 else GLOBAL_BATCH
    out = []
    for r in range(world):
        g = contract.torch_generator(seed, "batch", r)
        x = torch.randn(STEPS, per, D_IN, generator=g)
        y = x @ w + 0.1 * torch.randn(STEPS, per, D_OUT, generator=g)
        out.append({"x": x, "y": y})
    out[0]["bucket_cases"] = _bucket_cases(job)
    return out


def case_params(sizes) -> list[torch.Tensor]:
    """Stand-in parameters of the given ``[(numel, dtype), ...]``."""
    return [torch.zeros(int(n), dtype=DTYPES[dt]) for n, dt in sizes]


# ------------------------------------------------------------------ 1. the bucket rule
def bucket_cases(build_buckets) -> dict:
    """Driver of exercise 1: ``{case name: build_buckets(params, cap)}`` for every case of this grade."""
    return {name: build_buckets(case_params(sizes), cap) for name, sizes, cap in contract.mine(make_inputs)["bucket_cases"]}


# ------------------------------------------------------------------ 2 and 3. training on this rank's shard
def _device():
    from dtrain_lab.jobs import runtime

    return runtime.current().device


def _batch(step: int):
    mine = contract.mine(make_inputs)
    return mine["x"][step], mine["y"][step]


def _record(params) -> list:
    return [None if p.grad is None else p.grad.detach().cpu().clone() for p in params]


def _sgd(params) -> None:
    with torch.no_grad():
        for p in params:
            if p.grad is not None:
                p -= LR * p.grad


def train(sync_gradients, steps: int = STEPS) -> dict:
    """Driver of exercise 2: train the lab's model on this rank's shard for ``steps`` SGD steps,
    calling ``sync_gradients(params, buckets)`` between backward and the step. Returns the gradients
    after each synchronisation and the final parameters."""
    model = lab_model().to(_device())
    params = list(model.parameters())
    grads = []
    for step in range(steps):
        x, y = _batch(step)
        model.zero_grad()
        F.mse_loss(model(x.to(_device())), y.to(_device())).backward()
        sync_gradients(params, [list(b) for b in BUCKETS])   # a copy: ours stays intact
        grads.append(_record(params))
        _sgd(params)
    return {"grads": grads, "params": [p.detach().cpu().clone() for p in params]}


def _allreduces_so_far() -> int | None:
    """All-reduces this rank has issued so far (the grader's trace counts them); ``None`` outside the grader."""
    from dtrain_lab.grading import trace

    return trace.count("all_reduce")


def train_overlap(attach_overlap, steps: int = STEPS) -> dict:
    """Driver of exercise 3: ``finish = attach_overlap(params, buckets)`` once, then each step
    forward, backward, ``finish()``, SGD. Also records, per step, how many all-reduces had been
    issued when backward reached the input: the training input requires a gradient only to observe
    that moment. On CPU the autograd engine runs in one thread and runs every ``AccumulateGrad`` node
    as soon as it is ready, so by then the gradients of the last layers (buckets 0 and 1) are
    complete and an overlapping implementation has launched them."""
    model = lab_model().to(_device())
    params = list(model.parameters())
    finish = attach_overlap(params, [list(b) for b in BUCKETS])
    grads, in_backward = [], []
    for step in range(steps):
        x, y = _batch(step)
        x = x.to(_device()).requires_grad_(True)
        seen: list = []
        x.register_hook(lambda g, seen=seen: seen.append(_allreduces_so_far()))
        before = _allreduces_so_far()
        model.zero_grad()
        F.mse_loss(model(x), y.to(_device())).backward()
        in_backward.append(None if before is None or not seen or seen[0] is None else seen[0] - before)
        finish()
        grads.append(_record(params))
        _sgd(params)
    return {"grads": grads, "params": [p.detach().cpu().clone() for p in params], "in_backward": in_backward}
