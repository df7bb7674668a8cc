"""Lab 08 — the 1F1B pipeline schedule: the contract (what a submission may import).

Two exercises, written by the learner in the lab notebook (``solutions/_source/lab_08_pipeline.md``):

1. ``schedule_1f1b(num_stages, num_microbatches)``: the order of forwards ``("F", mb)`` and backwards
   ``("B", mb)`` each stage runs under 1F1B (PipeDream-Flush: Narayanan et al., "Memory-Efficient
   Pipeline-Parallel DNN Training", ICML 2021; Narayanan et al., "Efficient Large-Scale Language
   Model Training on GPU Clusters Using Megatron-LM", SC 2021, §2.2.1). A pure function, graded on
   one rank over many ``(p, m)`` pairs drawn for every grade;
2. ``run_stage(stage, actions, inputs, targets, loss_fn, act_shape)``: the executor of one stage, on
   2 ranks (2 stages, 3 micro-batches). Only stage 0 has the inputs and only stage 1 the targets,
   both private to their rank and drawn for every grade: stage 1 computes nothing right without
   stage 0's activations, stage 0 learns nothing without stage 1's gradients. Each stage's starting
   weights are drawn for every grade too, and only its own rank gets them: a rank cannot run the
   other stage's layers (the whole model) without receiving their weights, which the trace shows.

Here are the tools the notebook uses to look at a schedule (:func:`simulate`, :func:`timeline`,
:func:`bubble`, :func:`peak_alive`, GPipe's order :func:`gpipe`) and the drivers; the 1F1B reference
and the checks are outside the sandbox (``dtrain_lab.grading.checks.lab08``).
"""
from __future__ import annotations

from collections import deque

import torch
import torch.nn.functional as F

from dtrain_lab.grading import contract
from dtrain_lab.grading.exercise import joined, problem

LAB = "lab_08"
T_F, T_B = 1, 2          # the simulation's durations: a backward costs about twice a forward


def case_name(p: int, m: int) -> str:
    return f"p={p}, m={m}"


def max_alive(p: int, m: int, s: int) -> int:
    """1F1B's bound: stage ``s`` keeps at most ``min(p − s, m)`` micro-batches alive."""
    return min(p - s, m)


def gpipe(p: int, m: int) -> list[list[tuple[str, int]]]:
    """GPipe: every forward, then every backward, on every stage."""
    return [[("F", i) for i in range(m)] + [("B", i) for i in range(m)] for _ in range(p)]


def simulate(schedule, t_f: int = T_F, t_b: int = T_B) -> dict:
    """Run a schedule on ``p`` simulated stages: stage ``s`` sends the output of each forward to
    ``s + 1`` and the input gradient of each backward to ``s − 1``; a send never waits (``isend``),
    a receive waits for its message; messages between two stages arrive in the order they were sent.

    Returns ``{"ok", "times", "makespan", "why"}``: ``times[s][i] = (start, end)`` of action ``i``;
    ``why`` (zh/en) says what went wrong (a deadlock, a message received for the wrong micro-batch).
    The schedule must already hold every forward and backward once per stage, forward first.
    """
    p = len(schedule)
    acts = [deque() for _ in range(p)]        # activations sent by s to s + 1: (mb, arrival time)
    grads = [deque() for _ in range(p)]       # gradients sent by s + 1 to s
    idx, clock = [0] * p, [0] * p
    times = [[] for _ in range(p)]
    progress = True
    while progress:
        progress = False
        for s in range(p):
            while idx[s] < len(schedule[s]):
                kind, mb = schedule[s][idx[s]]
                if kind == "F":
                    chan, src, key = (acts[s - 1] if s > 0 else None), s - 1, "lab08_order_activation"
                else:
                    chan, src, key = (grads[s] if s < p - 1 else None), s + 1, "lab08_order_gradient"
                ready = 0
                if chan is not None:
                    if not chan:
                        break                  # blocked in a receive
                    got, ready = chan[0]
                    if got != mb:
                        return {"ok": False, "times": times, "makespan": None,
                                "why": problem(key, s=s, kind=kind, mb=mb, src=src, got=got)}
                    chan.popleft()
                start = max(clock[s], ready)
                clock[s] = start + (t_f if kind == "F" else t_b)
                times[s].append((start, clock[s]))
                if kind == "F" and s < p - 1:
                    acts[s].append((mb, clock[s]))
                if kind == "B" and s > 0:
                    grads[s - 1].append((mb, clock[s]))
                idx[s] += 1
                progress = True
    if all(idx[s] == len(schedule[s]) for s in range(p)):
        return {"ok": True, "times": times, "makespan": max(clock), "why": None}
    waits = []
    for s in range(p):
        if idx[s] < len(schedule[s]):
            kind, mb = schedule[s][idx[s]]
            waits.append(problem("lab08_waits_activation", s=s, mb=mb, src=s - 1) if kind == "F"
                         else problem("lab08_waits_gradient", s=s, mb=mb, src=s + 1))
    return {"ok": False, "times": times, "makespan": None, "why": problem("lab08_deadlock", waits=joined(waits))}


def peak_alive(actions) -> int:
    """The most micro-batches alive at once on a stage (forward done, backward not yet)."""
    alive = peak = 0
    for kind, _ in actions:
        alive += 1 if kind == "F" else -1
        peak = max(peak, alive)
    return peak


def bubble(schedule, t_f: int = T_F, t_b: int = T_B) -> float:
    """The fraction of stage-time spent idle in the simulated run."""
    sim = simulate(schedule, t_f, t_b)
    m = len(schedule[0]) // 2
    return 1 - m * (t_f + t_b) / sim["makespan"]


def timeline(schedule, t_f: int = T_F, t_b: int = T_B) -> str:
    """The simulated run as text: one row per stage, one column per time unit, ``·`` for idle."""
    from dtrain_lab.i18n import pick, tr

    sim = simulate(schedule, t_f, t_b)
    if not sim["ok"]:
        return pick(sim["why"])
    width = max(len(str(mb)) for acts in schedule for _, mb in acts) + 1
    rows = []
    for s, (acts, times) in enumerate(zip(schedule, sim["times"])):
        cells = ["·" * width] * sim["makespan"]
        for (kind, mb), (start, end) in zip(acts, times):
            for t in range(start, end):
                cells[t] = f"{kind}{mb}".ljust(width)
        rows.append(tr("lab08_timeline_row", stage=s) + " | " + " ".join(cells))
    return "\n".join(rows)


# ------------------------------------------------------------------ private inputs
M = 3                  # micro-batches per step
MICRO = 4              # samples per micro-batch
STEPS = 3
LR = 0.1
CUT = 4                # stage 0 = layers[:CUT], stage 1 = layers[CUT:]
D_IN, D_HIDDEN, D_OUT = 4, 8, 3
ACT_SHAPE = (MICRO, D_HIDDEN)


def _schedule_cases(g) -> list:
    """Exercise 1's ``(p, m)`` cases, drawn for every grade; the first is the case shown when GPipe's
    order comes in. Among them: m < p, m not a multiple of p, one stage, one micro-batch."""
    p = g.randint(3, 5)
    cases = [(p, g.randint(2 * p, 3 * p)), (2, g.choice([3, 5, 7])), (g.randint(3, 4), g.randint(5, 7)),
             (g.randint(3, 5), 1), (g.randint(4, 6), g.randint(2, 3)), (g.randint(6, 9), g.randint(3, 5)),
             (g.randint(3, 4), g.randint(9, 12)), (1, g.randint(2, 6)), (1, 1), (2, 1)]
    return [list(c) for c in dict.fromkeys(cases)]


def make_inputs(seed: int, world: int) -> list[dict]:
    """Stage 0's inputs and the last stage's targets for every step (private to each), and exercise 1's cases."""
    w = torch.randn(D_IN, D_OUT, generator=contract.torch_generator(seed, "w"), dtype=torch.float64) / 2
    gx = contract.torch_generator(seed, "x", 0)
    x = torch.randn(STEPS, M, MICRO, D_IN, generator=gx, dtype=torch.float64)
    y = x @ w + 0.1 * torch.randn(STEPS, M, MICRO, D_OUT, generator=contract.torch_generator(seed, "y", world - 1),
                                  dtype=torch.float64)
    out = [{} for _ in range(world)]
    out[0]["x"] = x
    out[world - 1]["y"] = y
    if world == 2:
        model = lab_model(seed=contract.rng(seed, "lab08-weights").randrange(2**31))
        for s in range(world):
            out[s]["weights"] = [p.detach().clone() for p in stage_layers(model, s, world).parameters()]
    out[0]["schedule_cases"] = _schedule_cases(contract.rng(seed, "lab08"))
    return out


# ------------------------------------------------------------------ 1. the schedule
def schedule_cases(schedule_1f1b) -> dict:
    """Driver of exercise 1: ``{case: schedule_1f1b(p, m)}`` for every case of this grade; a case
    whose call raised holds ``{"error": message}``, so that the other cases still count."""
    out = {}
    for p, m in contract.mine(make_inputs)["schedule_cases"]:
        try:
            out[case_name(p, m)] = schedule_1f1b(p, m)
        except Exception as exc:  # noqa: BLE001 - reported as this case's problem
            out[case_name(p, m)] = {"error": f"{type(exc).__name__}: {exc}"[:200]}
    return out


# ------------------------------------------------------------------ 2. run it: one stage per rank
def lab_model(seed: int = 0):
    """``MLP(4, 8, 3, depth=3)`` in float64: Linear, ReLU, Linear, ReLU | Linear, ReLU, Linear.
    A grade draws the weights from its own seed (:func:`make_inputs`) and gives each rank only its
    stage's share (:func:`load_weights`)."""
    from dtrain_lab.models import MLP

    return MLP(d_in=D_IN, d_hidden=D_HIDDEN, d_out=D_OUT, depth=3, seed=seed).double()


@torch.no_grad()
def load_weights(stage, weights) -> None:
    """Copy a stage's private starting weights (``make_inputs(...)[s]["weights"]``) into its layers."""
    params = list(stage.parameters())
    if len(params) != len(weights):
        raise ValueError(f"{len(weights)} weights for {len(params)} parameters")
    for p, w in zip(params, weights):
        p.copy_(w)


def stage_layers(model, s: int, p: int = 2) -> torch.nn.Sequential:
    if p != 2:
        from dtrain_lab.i18n import LabError

        raise LabError("lab08_two_stages", p=p)
    layers = list(model.layers)
    return torch.nn.Sequential(*(layers[:CUT] if s == 0 else layers[CUT:]))


def loss_fn(out, target):
    """The mean-squared error of one micro-batch, divided by ``M``: the gradients the micro-batches
    accumulate add up to the gradient of the whole batch's mean loss."""
    return F.mse_loss(out, target) / M


@torch.no_grad()
def sgd_step(params) -> None:
    """Plain SGD, ``p ← p − lr · grad``, by hand: the first ``torch.optim`` step imports
    ``torch._dynamo`` (hundreds of modules, seconds on a loaded machine), inside the time limit."""
    for p in params:
        if p.grad is not None:
            p.sub_(p.grad, alpha=LR)


class _Counted(torch.nn.Module):
    """The stage as the learner sees it; counts the micro-batches alive on it: +1 at every forward,
    −1 when the backward reaches the forward's output (a hook on the output tensor)."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner
        self.alive = self.peak = self.forwards = 0

    def forward(self, x):
        out = self.inner(x)
        self.forwards += 1
        self.alive += 1
        self.peak = max(self.peak, self.alive)
        if out.requires_grad:
            out.register_hook(self._done)
        return out

    def _done(self, grad):
        self.alive -= 1
        return grad


def train(schedule_1f1b, run_stage) -> dict:
    """Driver of exercise 2 (rank = stage): ``STEPS`` SGD steps; in each, ``run_stage`` runs this
    stage's actions of ``schedule_1f1b(world, M)`` on the step's micro-batches (the inputs on stage 0,
    the targets on the last stage, each stage's starting weights on its own rank: each only there),
    then the driver steps the optimizer. Returns the parameters after every step, the losses and the
    peak number of micro-batches alive."""
    rank, world = contract.rank_and_world()
    mine = contract.mine(make_inputs)
    stage = _Counted(stage_layers(lab_model(), rank, world))
    load_weights(stage, mine["weights"])
    actions = schedule_1f1b(world, M)[rank]
    record = []
    for step in range(STEPS):
        xs = list(mine["x"][step]) if "x" in mine else None
        ys = list(mine["y"][step]) if "y" in mine else None
        stage.zero_grad()
        stage.alive = stage.peak = stage.forwards = 0
        losses = run_stage(stage, list(actions), xs, ys, loss_fn, ACT_SHAPE)
        sgd_step(stage.parameters())
        try:
            losses = [float(v) for v in (losses or [])]
        except (TypeError, ValueError, RuntimeError):
            losses = repr(losses)[:80]
        record.append({"params": [p.detach().clone() for p in stage.parameters()], "losses": losses,
                       "peak": stage.peak, "forwards": stage.forwards})
    return {"actions": [list(a) for a in actions], "steps": record}
