"""Lesson 12: where a DDP step's time goes, which rank is the straggler, and a profiler trace.

    torchrun --standalone --nproc-per-node 2 -m dtrain_lab.demos.monitor_run --slow-rank 1 --delay 0.05

Every rank trains the same tiny MLP with PyTorch DDP for ``--steps`` steps on its own batches of
``--batch`` samples. A :class:`dtrain_lab.jobs.monitor.StepTimer` splits each step into data / compute /
comm / optimizer; the gradients are averaged by :func:`dtrain_lab.jobs.monitor.timed_allreduce_hook`
(a blocking all-reduce per bucket, so communication can be timed apart from backward). Rank
``--slow-rank`` sleeps ``--delay`` seconds inside its compute phase: a slower GPU, a busier host.
The summaries are gathered to rank 0, which names the straggler. Then every rank traces
``--trace-steps`` steps with ``torch.profiler`` into ``--trace-dir/rank<r>.json`` and counts the
collective events in its trace.

Each rank reports its summary, its own wall-clock time of the timed loop (an independent clock for
the split), the number of hook calls, a parameter checksum (the replicas must agree), memory, and
the trace facts; rank 0 also reports the gathered rows (one summary per rank: render them with
``monitor.RankTable(rows).table(lang)``) and the straggler.
"""
import argparse
import os
import tempfile
import time

import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from dtrain_lab.jobs import monitor, runtime


def _model() -> torch.nn.Module:
    torch.manual_seed(0)   # the same initial weights on every rank
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--slow-rank", type=int, default=-1)
    ap.add_argument("--delay", type=float, default=0.0)
    ap.add_argument("--trace-dir", default="")
    ap.add_argument("--trace-steps", type=int, default=2)
    ap.add_argument("--progress", action="store_true")
    a = ap.parse_args()
    torch.set_num_threads(1)   # tiny model: extra threads only add synchronisation
    rt = runtime.current()
    dev = rt.device
    model = _model().to(dev)
    ddp = DistributedDataParallel(model)
    timer = monitor.StepTimer(dev)
    ddp.register_comm_hook(timer, monitor.timed_allreduce_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(100 + rt.rank)
    slow = rt.rank == a.slow_rank

    def batch():
        x = torch.randn(a.batch, 16, generator=gen)
        return x.to(dev), (x[:, :4] * 2.0).to(dev)

    total = a.warmup + a.steps
    steps = monitor.progress(range(total), desc="train", rank=rt.rank) if a.progress else range(total)
    t_loop = 0.0
    for step in steps:
        if step == a.warmup:
            t_loop = time.perf_counter()      # an independent clock around the measured steps
        timer.start_step()
        with timer.phase("data"):
            x, y = batch()
        with timer.phase("compute"):
            loss = F.mse_loss(ddp(x), y)
            if slow and a.delay > 0:
                time.sleep(a.delay)           # the straggler: slower hardware, a busy host, ...
            loss.backward()                   # the hook times each bucket's all-reduce as comm
        with timer.phase("optimizer"):
            opt.step()
            opt.zero_grad(set_to_none=True)
        timer.end_step(samples=a.batch, tokens=a.batch * 16)
    loop_s = time.perf_counter() - t_loop
    hook_calls = getattr(timer, "_hook_calls", 0)
    summary = timer.summary(skip=a.warmup)
    table = monitor.gather_summaries(summary)
    checksum = float(torch.cat([p.detach().reshape(-1) for p in model.parameters()]).double().sum())

    # a profiler trace of a few more steps (no timer: a step outside start/end is not timed)
    trace_dir = a.trace_dir or tempfile.mkdtemp(prefix="dtrain_trace_")
    path = os.path.join(trace_dir, f"rank{rt.rank}.json")

    def traced(i):
        x, y = batch()
        F.mse_loss(ddp(x), y).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    monitor.profile_step(traced, path, steps=a.trace_steps, warmup=0, device=dev)
    facts = monitor.trace_facts(path)
    mem = monitor.memory_stats(dev, list(model.parameters()))
    print(f"rank {rt.rank}: " + monitor.format_split(summary), flush=True)   # the learner's language
    out = dict(rank=rt.rank, slow=slow, summary=summary, loop_s=loop_s, hook_calls=hook_calls,
               steps=a.steps, warmup=a.warmup, batch=a.batch, checksum=checksum, memory=mem,
               trace=path, trace_facts=facts, trace_steps=a.trace_steps)
    if table is not None:
        # data, not text: a reader renders monitor.RankTable(rows).table(lang) in its own language
        out.update(slowest=table.slowest, rows=table.rows)
        print(table.table(), flush=True)
    runtime.report(**out)


if __name__ == "__main__":
    runtime.entrypoint(main)
