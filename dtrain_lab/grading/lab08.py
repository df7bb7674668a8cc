"""Lab 08 — the 1F1B pipeline schedule: write it, then run it on two ranks.

Two exercises, written by the learner in the lab notebook (``solutions/_source/lab_08_pipeline.md``):

1. ``schedule_1f1b(num_stages, num_microbatches)``: the order of forwards ``("F", mb)`` and backwards
   ``("B", mb)`` each stage runs under 1F1B (PipeDream-Flush: Narayanan et al., "Memory-Efficient
   Pipeline-Parallel DNN Training", ICML 2021; Narayanan et al., "Efficient Large-Scale Language
   Model Training on GPU Clusters Using Megatron-LM", SC 2021, §2.2.1). A pure function, graded on
   one rank over many ``(p, m)`` pairs, ``m < p`` and ``m`` not a multiple of ``p`` included;
2. ``run_stage(stage, actions, inputs, targets, loss_fn, act_shape)``: the executor of one stage.
   On 2 ranks (2 stages, 3 micro-batches) it receives activations and gradients from its
   neighbours (blocking ``dist.recv``), sends its own with ``dist.isend``, and runs forward and
   backward in the order of the learner's schedule. Three SGD steps are compared with unpipelined
   training of the whole model on the same micro-batches (gradient accumulation), in float64;
   SGD is written out (:func:`sgd_step`), the same in both.

The schedule is checked by rules written here, independently of any construction of it: every
micro-batch runs forward and backward exactly once per stage, forward first; a simulation of the
pipeline matches every receive with the send of the neighbour (messages between two ranks arrive in
the order they were sent; a send never waits, a receive does) and finds deadlocks; the peak number
of micro-batches alive on stage ``s`` (forward done, backward not yet) must be ``min(p − s, m)``;
last, the exact order, from the rule "run a forward while fewer than ``min(p − s, m)`` micro-batches
are alive, else a backward". (The tests check that this reference is the order in which PyTorch's
``torch.distributed.pipelining.Schedule1F1B`` runs its forwards and backwards.) GPipe (Huang et al.,
"GPipe", NeurIPS 2019) has the same bubble, ``(p − 1)/(m + p − 1)``, but keeps all ``m``
micro-batches alive on every stage.
"""
from __future__ import annotations

import re
from collections import deque

import torch
import torch.distributed as dist
import torch.nn.functional as F

from dtrain_lab.grading.registry import Exercise, problem, register

LAB = "lab_08"
T_F, T_B = 1, 2          # the simulation's durations: a backward costs about twice a forward

# ------------------------------------------------------------------ references and the simulation
# (p, m): the first is the case shown when GPipe's order comes in
CASES = [(4, 8), (2, 3), (3, 5), (4, 6), (4, 7), (2, 1), (3, 2), (4, 2), (5, 3), (8, 4), (1, 4), (1, 1)]


def case_name(p: int, m: int) -> str:
    return f"p={p}, m={m}"


def max_alive(p: int, m: int, s: int) -> int:
    """1F1B's bound: stage ``s`` keeps at most ``min(p − s, m)`` micro-batches alive."""
    return min(p - s, m)


def reference_1f1b(p: int, m: int) -> list[list[tuple[str, int]]]:
    """1F1B as a rule: stage ``s`` runs its next forward while fewer than ``min(p − s, m)``
    micro-batches are alive on it and forwards remain, otherwise its next backward."""
    out = []
    for s in range(p):
        acts, f, b = [], 0, 0
        while b < m:
            if f < m and f - b < max_alive(p, m, s):
                acts.append(("F", f))
                f += 1
            else:
                acts.append(("B", b))
                b += 1
        out.append(acts)
    return out


def gpipe(p: int, m: int) -> list[list[tuple[str, int]]]:
    """GPipe: every forward, then every backward, on every stage."""
    return [[("F", i) for i in range(m)] + [("B", i) for i in range(m)] for _ in range(p)]


def _warmup_then_1f1b(p: int, m: int, warmup, cap: bool = True, backward_first: bool = False):
    """Warm-up forwards, then (F, B) pairs, then the remaining backwards, as a learner writes it:
    the slips the hints recognise are variants of it."""
    out = []
    for s in range(p):
        w = warmup(p, s)
        if cap:
            w = min(w, m)
        acts = [("F", i) for i in range(w)]
        for i in range(m - w):
            pair = [("F", w + i), ("B", i)]
            acts += pair[::-1] if backward_first else pair
        acts += [("B", i) for i in range(m - w, m)]
        out.append(acts)
    return out


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
                    chan, src, what = (acts[s - 1] if s > 0 else None), s - 1, ("激活", "activation")
                else:
                    chan, src, what = (grads[s] if s < p - 1 else None), s + 1, ("梯度", "gradient")
                ready = 0
                if chan is not None:
                    if not chan:
                        break                  # blocked in a receive
                    got, ready = chan[0]
                    if got != mb:
                        return {"ok": False, "times": times, "makespan": None, "why": problem(
                            f"stage {s} 的下一步是 {kind} {mb}，但 stage {src} 先发来的是微批次 {got} 的{what[0]}："
                            f"两个 rank 之间的消息按发送顺序到达，所以每个 stage 执行前向（以及反向）的微批次顺序必须相同。",
                            f"stage {s}'s next action is {kind} {mb}, but the first {what[1]} stage {src} sent is "
                            f"micro-batch {got}'s: messages between two ranks arrive in the order they were sent, so "
                            f"every stage must run its forwards (and its backwards) in the same micro-batch order.")}
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
    zh, en = [], []
    for s in range(p):
        if idx[s] < len(schedule[s]):
            kind, mb = schedule[s][idx[s]]
            if kind == "F":
                zh.append(f"stage {s} 在等 stage {s - 1} 发来微批次 {mb} 的激活")
                en.append(f"stage {s} waits for micro-batch {mb}'s activation from stage {s - 1}")
            else:
                zh.append(f"stage {s} 在等 stage {s + 1} 发来微批次 {mb} 的梯度")
                en.append(f"stage {s} waits for micro-batch {mb}'s gradient from stage {s + 1}")
    return {"ok": False, "times": times, "makespan": None, "why": problem(
        "死锁：" + "；".join(zh) + "。每个 stage 都在等别的 stage，谁也走不下去。",
        "deadlock: " + "; ".join(en) + ". Every waiting stage waits for another one: none can go on.")}


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
    sim = simulate(schedule, t_f, t_b)
    if not sim["ok"]:
        return sim["why"]["en"]
    width = max(len(str(mb)) for acts in schedule for _, mb in acts) + 1
    rows = []
    for s, (acts, times) in enumerate(zip(schedule, sim["times"])):
        cells = ["·" * width] * sim["makespan"]
        for (kind, mb), (start, end) in zip(acts, times):
            for t in range(start, end):
                cells[t] = f"{kind}{mb}".ljust(width)
        rows.append(f"stage {s} | " + " ".join(cells))
    return "\n".join(rows)


# ------------------------------------------------------------------ 1. the schedule
def schedule_cases(schedule_1f1b) -> dict:
    """Driver of exercise 1: ``{case: schedule_1f1b(p, m)}`` for every case; a case whose call
    raised holds ``{"error": message}``, so that the other cases still count."""
    out = {}
    for p, m in CASES:
        try:
            out[case_name(p, m)] = schedule_1f1b(p, m)
        except Exception as exc:  # noqa: BLE001 - reported as this case's problem
            out[case_name(p, m)] = {"error": f"{type(exc).__name__}: {exc}"}
    return out


def _normalise(value, p: int):
    """``[[(kind, mb), ...] per stage]`` or None if ``value`` is not shaped like a schedule."""
    if not isinstance(value, (list, tuple)) or len(value) != p:
        return None
    out = []
    for acts in value:
        if not isinstance(acts, (list, tuple)):
            return None
        row = []
        for a in acts:
            if not isinstance(a, (list, tuple)) or len(a) != 2 or a[0] not in ("F", "B") \
                    or isinstance(a[1], bool) or not isinstance(a[1], int):
                return None
            row.append((a[0], int(a[1])))
        out.append(row)
    return out


def _short(acts, n: int = 10) -> str:
    text = ", ".join(f"{k}{mb}" for k, mb in acts[:n])
    return text + (", …" if len(acts) > n else "")


def schedule_problem(value, p: int, m: int) -> dict | None:
    """The first thing wrong with ``value`` as the 1F1B schedule of ``p`` stages and ``m``
    micro-batches, or None. The rules come in the order a reader would check them."""
    name = case_name(p, m)
    zh, en = f"用例 {name}", f"case {name}"
    if isinstance(value, dict) and "error" in value:
        return problem(f"{zh}：schedule_1f1b 抛出了异常 {value['error']}。", f"{en}: schedule_1f1b raised {value['error']}.")
    sched = _normalise(value, p)
    if sched is None:
        return problem(
            f"{zh}：应返回 {p} 个列表（每个 stage 一个），每个元素是 (\"F\", mb) 或 (\"B\", mb)，mb 为整数；"
            f"你的结果是 {str(value)[:120]}。",
            f"{en}: return {p} lists (one per stage) of (\"F\", mb) or (\"B\", mb) with an integer mb; yours is "
            f"{str(value)[:120]}.")
    for s, acts in enumerate(sched):
        for kind in ("F", "B"):
            mbs = sorted(mb for k, mb in acts if k == kind)
            if mbs != list(range(m)):
                what = ("前向", "forward") if kind == "F" else ("反向", "backward")
                return problem(
                    f"{zh}：stage {s} 的{what[0]}应对微批次 0…{m - 1} 各做一次，你的是 {mbs}。",
                    f"{en}: stage {s} should run the {what[1]} of micro-batches 0…{m - 1} once each; yours runs "
                    f"{mbs}.")
        done = set()
        for kind, mb in acts:
            if kind == "F":
                done.add(mb)
            elif mb not in done:
                return problem(
                    f"{zh}：stage {s} 在微批次 {mb} 的前向之前就做了它的反向（{_short(acts)}）：反向要用前向保存的激活。",
                    f"{en}: stage {s} runs micro-batch {mb}'s backward before its forward ({_short(acts)}): a backward "
                    f"needs the activations its forward saved.")
    sim = simulate(sched)
    if not sim["ok"]:
        return problem(f"{zh}：{sim['why']['zh']}", f"{en}: {sim['why']['en']}")
    for s, acts in enumerate(sched):
        peak, want = peak_alive(acts), max_alive(p, m, s)
        if peak > want:
            return problem(
                f"{zh}：stage {s} 同时保留了 {peak} 个微批次的激活；1F1B 最多保留 {want} 个（min(p − s, m) = "
                f"min({p} − {s}, {m})）。",
                f"{en}: stage {s} keeps {peak} micro-batches alive; 1F1B keeps at most {want} "
                f"(min(p − s, m) = min({p} − {s}, {m})).")
        if peak < want:
            best = simulate(reference_1f1b(p, m))["makespan"]
            return problem(
                f"{zh}：stage {s} 最多只保留 {peak} 个微批次，比 1F1B 的 {want} 个少：省了内存，但流水线会空等。"
                f"模拟（前向 {T_F}、反向 {T_B} 个时间单位）用时 {sim['makespan']}，1F1B 只要 {best}。",
                f"{en}: stage {s} keeps at most {peak} micro-batches alive, fewer than 1F1B's {want}: it saves memory "
                f"but the pipeline stalls. Simulated (forward {T_F}, backward {T_B} time units) it takes "
                f"{sim['makespan']}, 1F1B {best}.")
    want = reference_1f1b(p, m)
    for s, (acts, ref) in enumerate(zip(sched, want)):
        if acts != ref:
            i = next(i for i, (a, b) in enumerate(zip(acts, ref)) if a != b)
            return problem(
                f"{zh}：stage {s} 的第 {i + 1} 个动作是 {acts[i][0]}{acts[i][1]}，1F1B 在这里做 {ref[i][0]}{ref[i][1]}"
                f"（1F1B：{_short(ref, 12)}）。",
                f"{en}: stage {s}'s action #{i + 1} is {acts[i][0]}{acts[i][1]}; 1F1B runs {ref[i][0]}{ref[i][1]} "
                f"there (1F1B: {_short(ref, 12)}).")
    return None


SLIPS = [
    (gpipe, problem(
        "这是 GPipe 的顺序（先做完所有前向，再做所有反向）：气泡和 1F1B 一样都是 (p − 1)/(m + p − 1)，但每个 stage "
        "在第一次反向之前保留了全部 m 个微批次的激活。1F1B 让 stage s 只做 min(p − s − 1, m) 次预热前向，"
        "然后一次前向、一次反向交替，最后做完剩下的反向。",
        "this is GPipe's order (every forward, then every backward): the same bubble as 1F1B, (p − 1)/(m + p − 1), "
        "but every stage keeps all m micro-batches' activations until its first backward. In 1F1B stage s runs only "
        "min(p − s − 1, m) warm-up forwards, then alternates one forward and one backward, then runs the remaining "
        "backwards.")),
    (lambda p, m: _warmup_then_1f1b(p, m, lambda p, s: p - s), problem(
        "你的预热是 p − s 次前向，多了一次：最后一个 stage（s = p − 1）每做完一次前向就能立刻做它的反向（预热 0 次），"
        "stage s 的预热次数是它后面 stage 的个数 p − s − 1。结果仍然正确，但每个 stage 多保留了一个微批次的激活。",
        "your warm-up is p − s forwards, one too many: the last stage (s = p − 1) can run each backward right after its "
        "forward (no warm-up), and stage s needs as many warm-up forwards as there are stages after it, p − s − 1. "
        "The result is still right, but every stage keeps one more micro-batch alive than it needs.")),
    (lambda p, m: _warmup_then_1f1b(p, m, lambda p, s: p - s - 1, cap=False), problem(
        "微批次比 stage 少（m < p）时，p − s − 1 可能大于 m：预热次数是 min(p − s − 1, m)，否则就会调度并不存在的微批次。",
        "with fewer micro-batches than stages (m < p), p − s − 1 can exceed m: the warm-up is min(p − s − 1, m), "
        "otherwise you schedule micro-batches that do not exist.")),
    (lambda p, m: _warmup_then_1f1b(p, m, lambda p, s: p - s - 1, backward_first=True), problem(
        "稳定阶段里要先做前向、再做反向：最后一个 stage 的预热是 0 次，先做反向的话，它一开始就要做 B0，而 F0 还没做。",
        "in the steady phase run the forward first, then the backward: the last stage has no warm-up, so with the "
        "backward first it would start with B0 before F0.")),
    (lambda p, m: _warmup_then_1f1b(p, m, lambda p, s: s), problem(
        "你的预热次数随 s 增大，应该随 s 减小：stage 0 离损失最远，第一个梯度要经过它后面的 p − 1 个 stage 才回来，"
        "所以它预热最多（p − 1 次）；最后一个 stage 不预热。反过来，相邻的两个 stage 会互相等待对方的消息。",
        "your warm-up grows with s; it must shrink: stage 0 is farthest from the loss, its first gradient comes back "
        "through the p − 1 stages after it, so it warms up the most (p − 1 forwards), and the last stage not at all. "
        "The other way round, neighbouring stages wait for each other's messages.")),
]


def _check_schedule(rt, result, module):
    """Every case against the rules of :func:`schedule_problem`; the first two wrong cases are
    shown, with the explanation of the first slip recognised."""
    if not isinstance(result, dict):
        return [problem("run() 应返回 schedule_cases(schedule_1f1b) 的结果（一个 dict）。",
                        "run() should return schedule_cases(schedule_1f1b) (a dict).")]
    wrong, hint = [], None
    for p, m in CASES:
        value = result.get(case_name(p, m))
        found = schedule_problem(value, p, m)
        if found is None:
            continue
        wrong.append(found)
        if hint is None:
            got = _normalise(value, p)
            hint = next((h for rule, h in SLIPS if got == rule(p, m)), None)
    out = wrong[:2]
    if len(wrong) > 2:
        out.append(problem(f"另有 {len(wrong) - 2} 个用例也不对。", f"{len(wrong) - 2} more case(s) are wrong too."))
    return out + ([hint] if hint else [])


register(Exercise(
    id="lab08.schedule", lab=LAB, entry="run", filename="lab08_schedule.py", timeout=20,
    title={"en": "1 · The 1F1B schedule", "zh": "1 · 1F1B 调度"},
    checks=[_check_schedule], world_sizes=(1,)))


# ------------------------------------------------------------------ 2. run it: one stage per rank
M = 3                  # micro-batches per step
MICRO = 4              # samples per micro-batch
STEPS = 3
LR = 0.1
RTOL, ATOL = 1e-9, 1e-12
CUT = 4                # stage 0 = layers[:CUT], stage 1 = layers[CUT:]


def lab_model():
    """``MLP(4, 8, 3, depth=3)`` in float64: Linear, ReLU, Linear, ReLU | Linear, ReLU, Linear."""
    from dtrain_lab.models import MLP

    return MLP(d_in=4, d_hidden=8, d_out=3, depth=3, seed=0).double()


ACT_SHAPE = (MICRO, 8)


def stage_layers(model, s: int, p: int = 2) -> torch.nn.Sequential:
    if p != 2:
        raise ValueError(f"the lab's model is cut into 2 stages, not {p} / 本实验的模型只切成 2 个 stage，不是 {p} 个")
    layers = list(model.layers)
    return torch.nn.Sequential(*(layers[:CUT] if s == 0 else layers[CUT:]))


def micro_batches(step: int):
    from dtrain_lab.data import global_batch, regression_dataset

    x, y = global_batch(regression_dataset(n=48, d_in=4, d_out=3, seed=8), step, M * MICRO)
    return list(x.double().chunk(M)), list(y.double().chunk(M))


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
    stage's actions of ``schedule_1f1b(world, M)`` on the step's micro-batches, then the driver
    steps the optimizer. Returns the parameters after every step, the losses and the peak number
    of micro-batches alive on the stage."""
    rank, world = dist.get_rank(), dist.get_world_size()
    stage = _Counted(stage_layers(lab_model(), rank, world))
    actions = schedule_1f1b(world, M)[rank]
    record = []
    for step in range(STEPS):
        xs, ys = micro_batches(step)
        stage.zero_grad()
        stage.alive = stage.peak = stage.forwards = 0
        losses = run_stage(stage, list(actions), xs if rank == 0 else None, ys if rank == world - 1 else None,
                           loss_fn, ACT_SHAPE)
        sgd_step(stage.parameters())
        try:
            losses = [float(v) for v in (losses or [])]
        except (TypeError, ValueError, RuntimeError):
            losses = repr(losses)[:80]
        record.append({"params": [p.detach().clone() for p in stage.parameters()], "losses": losses,
                       "peak": stage.peak, "forwards": stage.forwards})
    return {"actions": [tuple(a) for a in actions], "steps": record}


def reference_training(steps: int = STEPS, stage_zero_frozen: bool = False) -> dict:
    """The whole model on one process: for each step, forward and backward every micro-batch
    (gradient accumulation), then SGD. ``{"params": [per stage, per step], "losses": [per step]}``.
    ``stage_zero_frozen`` leaves stage 0 untouched (the hint for a gradient never sent back)."""
    model = lab_model()
    stages = [stage_layers(model, 0), stage_layers(model, 1)]
    out = {"params": [[], []], "losses": []}
    for step in range(steps):
        xs, ys = micro_batches(step)
        model.zero_grad()
        losses = []
        for x, y in zip(xs, ys):
            loss = loss_fn(model(x), y)
            loss.backward()
            losses.append(loss.item())
        if stage_zero_frozen:
            for p in stages[0].parameters():
                p.grad = None
        sgd_step(model.parameters())
        out["losses"].append(losses)
        for s in range(2):
            out["params"][s].append([p.detach().clone() for p in stages[s].parameters()])
    return out


def _close(a, b) -> bool:
    return all(isinstance(x, torch.Tensor) and x.shape == y.shape
               and bool(torch.allclose(x.double(), y, rtol=RTOL, atol=ATOL)) for x, y in zip(a, b)) \
        and len(a) == len(b)


def _check_run(rt, result, module):
    if not isinstance(result, dict) or not isinstance(result.get("steps"), list):
        return [problem("run() 应返回驱动函数的结果，请不要修改 run()。",
                        "run() should return the driver's result; do not change run().")]
    rank, world = rt.rank, rt.world_size
    got_sched = [result["actions"] if s == rank else reference_1f1b(world, M)[s] for s in range(world)]
    if result["actions"] != reference_1f1b(world, M)[rank]:
        found = schedule_problem(got_sched, world, M)
        return [problem("你复制过来的 schedule_1f1b 还不对，先完成练习 1。" + (found["zh"] if found else ""),
                        "the schedule_1f1b you copied is not right yet: finish exercise 1 first. "
                        + (found["en"] if found else ""))]
    steps = result["steps"]
    ref = reference_training()
    frozen = reference_training(stage_zero_frozen=True)
    for step, rec in enumerate(steps):
        n = step + 1
        if rec["forwards"] != M:
            return [problem(f"第 {n} 步里 stage {rank} 的前向调用了 {rec['forwards']} 次，应为 {M} 次（每个微批次一次）。",
                            f"in step {n} stage {rank}'s forward ran {rec['forwards']} times; it should run {M} times "
                            f"(once per micro-batch).")]
        want_peak = max_alive(world, M, rank)
        if rec["peak"] > want_peak:
            return [problem(
                f"第 {n} 步里 stage {rank} 同时保留了 {rec['peak']} 个微批次的激活，1F1B 最多 {want_peak} 个："
                f"请严格按 actions 的顺序执行，每个动作只做它自己的那一个微批次。",
                f"in step {n} stage {rank} kept {rec['peak']} micro-batches alive; 1F1B keeps at most {want_peak}: "
                f"run the actions in their order, each on its own micro-batch only.")]
        if rank == world - 1 and rec["losses"] != [] and not (
                isinstance(rec["losses"], list) and len(rec["losses"]) == M
                and all(abs(a - b) <= ATOL + RTOL * abs(b) for a, b in zip(rec["losses"], ref["losses"][step]))):
            return [problem(
                f"第 {n} 步里最后一个 stage 的损失（按微批次顺序）应为 {[round(v, 8) for v in ref['losses'][step]]}，"
                f"你返回的是 {rec['losses']}：检查收到的激活是否属于同一个微批次。",
                f"in step {n} the last stage's losses (in micro-batch order) should be "
                f"{[round(v, 8) for v in ref['losses'][step]]}; yours are {rec['losses']}: check that the activation "
                f"you received belongs to the same micro-batch.")]
        if _close(rec["params"], ref["params"][rank][step]):
            continue
        if rank == 0 and _close(rec["params"], frozen["params"][0][step]):
            return [problem(
                f"第 {n} 步之后 stage 0 的参数一点也没变：它没有得到梯度。stage 1 在每次反向之后要把本 stage 输入的梯度"
                f"（收到的激活的 .grad：收到后先 requires_grad_()）发回 stage 0，stage 0 再用 output.backward(grad)。",
                f"after step {n} stage 0's parameters did not change: it got no gradient. After each backward stage 1 "
                f"must send the gradient of its input back to stage 0 (the .grad of the activation it received: call "
                f"requires_grad_() on it first), and stage 0 runs output.backward(grad).")]
        return [problem(
            f"第 {n} 步之后 stage {rank} 的参数和单进程梯度累加训练（整个模型，同样的 {M} 个微批次）不同。"
            f"反向 B mb 必须沿着前向 F mb 的计算图：按微批次编号保存每次前向的输入和输出（比如字典 stash[mb]），"
            f"并用收到的、属于同一个微批次的梯度。",
            f"after step {n} stage {rank}'s parameters differ from single-process training with gradient accumulation "
            f"(the whole model, the same {M} micro-batches). The backward B mb must go through the graph of the forward "
            f"F mb: keep each forward's input and output by micro-batch (a dict stash[mb], say), and use the gradient "
            f"received for that same micro-batch.")]
    if len(steps) != STEPS:
        return [problem("驱动函数没有跑完所有的步数，请不要修改 run()。", "the driver did not run every step; do not change run().")]
    return []


def _no_blocking_send(traces):
    """A blocking send in 1F1B's steady phase meets the neighbour's blocking send: at the same moment
    stage s sends an activation forward and stage s + 1 sends a gradient back."""
    senders = [r for r, calls in sorted(traces.items()) if any(c["op"] == "send" for c in calls)]
    if not senders:
        return []
    return [problem(
        f"rank {senders} 用了阻塞的 dist.send。在 1F1B 的稳定阶段，stage 0 发送微批次 1 的激活时，stage 1 正在发送微批次 0 "
        f"的梯度：两边都在 send，都可能在等对方接收，这就是死锁（实验 10 的练习 6）。这次如果跑完了，是传输层把消息缓存了下来；"
        f"换一种消息大小或传输方式就会卡住。"
        f"用 dist.isend 发送，把返回的 Work 留着，最后逐个 wait()。",
        f"rank(s) {senders} used the blocking dist.send. In 1F1B's steady phase stage 0 sends micro-batch 1's "
        f"activation while stage 1 sends micro-batch 0's gradient: both are sending, and each can wait for the other "
        f"to receive, a deadlock (lab 10, exercise 6). If this run got through, the transport buffered the messages; "
        f"with other sizes or another transport it hangs. Send with dist.isend, keep the returned Work objects, and "
        f"wait() on each at the end.")]


def _explain_run(outcome: str, feedback: str, source: str) -> list:
    low = feedback.lower()
    waits = re.findall(r"^\s*rank \d+: (\w+) \(", feedback, flags=re.M)
    if outcome == "hang" and waits and all(w == "send" for w in waits):
        return [problem(
            "每个 rank 都卡在阻塞的 dist.send 里：在 1F1B 的稳定阶段，stage 0 发送微批次 1 的激活时，stage 1 正在发送微批次 0 "
            "的梯度，双方都在等对方接收（实验 10 的练习 6）。用 dist.isend 发送，把返回的 Work 留着，最后逐个 wait()；"
            "PyTorch 的 Schedule1F1B 则把这次发送和随后的接收放进同一个 batch_isend_irecv。",
            "every rank waits in a blocking dist.send: in 1F1B's steady phase stage 0 sends micro-batch 1's activation "
            "while stage 1 sends micro-batch 0's gradient, and each waits for the other to receive (lab 10, exercise "
            "6). Send with dist.isend, keep the returned Work objects and wait() on each at the end; PyTorch's "
            "Schedule1F1B posts such a send together with the next receive in one batch_isend_irecv.")]
    if outcome == "hang":
        return [problem(
            "有 stage 在等一条永远不会来的消息。每个动作要做的通信：stage > 0 的 F 先接收一个激活，stage < 最后 的 F 发送输出；"
            "stage < 最后 的 B 先接收一个梯度，stage > 0 的 B 发送输入的梯度。收发的次数和顺序两边必须一一对应。",
            "a stage waits for a message that never comes. Each action's messages: F on a stage > 0 first receives an "
            "activation, F on a stage before the last sends its output; B on a stage before the last first receives a "
            "gradient, B on a stage > 0 sends its input's gradient. Both neighbours must agree on how many and in which "
            "order.")]
    if outcome == "crash" and any(s in low for s in ("nonetype", "does not require grad", "grad can be implicitly")):
        return [problem(
            "收到的激活是一个新张量，不在任何计算图里：先 x.requires_grad_()，这样反向之后 x.grad 才是要发回前一个 stage 的梯度；"
            "中间 stage 的反向用 output.backward(grad)，只有最后一个 stage 用 loss.backward()。",
            "the activation you receive is a fresh tensor in no graph: call x.requires_grad_() first, so that after the "
            "backward x.grad holds the gradient to send back to the previous stage; a stage other than the last runs "
            "output.backward(grad), only the last one runs loss.backward().")]
    if outcome == "crash" and any(s in low for s in ("size", "shape", "dtype")):
        return [problem(
            "收发的两个张量必须形状和类型都一样：接收缓冲区用 torch.empty(act_shape, dtype=torch.float64)。",
            "a send and its receive need tensors of the same shape and dtype: receive into "
            "torch.empty(act_shape, dtype=torch.float64).")]
    return []


register(Exercise(
    id="lab08.run_1f1b", lab=LAB, entry="run", filename="lab08_run_1f1b.py", timeout=15,
    title={"en": "2 · Run 1F1B on two ranks", "zh": "2 · 在两个 rank 上运行 1F1B"},
    checks=[_check_run], trace_checks=[_no_blocking_send], explain=_explain_run, world_sizes=(2,)))
