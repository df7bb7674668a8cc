"""What each process of a multi-node job sees, and one DDP step that must agree on every node.

Run on two machines (or two terminals of one machine, see ``dtrain_lab.jobs.cluster.run_local_nodes``)::

    # on every node, the same command (c10d rendezvous: the node rank is assigned, not given)
    torchrun --nnodes 2 --nproc-per-node 1 --rdzv-backend c10d \\
             --rdzv-endpoint HOST0:29400 --rdzv-id job1 -m dtrain_lab.demos.multinode_check

Each rank reports its global rank, local rank, group rank (which node), the world sizes, the
torchelastic variables torchrun set, an all-reduce, and the parameters after one DDP step compared
with the same step taken by one process on the whole (all ranks') batch.
"""
import os
import socket

import torch
import torch.distributed as dist

from dtrain_lab.jobs import runtime

ENV_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
            "ROLE_RANK", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID",
            "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "DTRAIN_SIM_NODE")
BATCH_PER_RANK = 4


def _model() -> torch.nn.Module:
    torch.manual_seed(0)  # the same initial weights on every rank (no broadcast needed, checked below)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))


def _batch(rank: int):
    g = torch.Generator().manual_seed(1000 + rank)
    return torch.randn(BATCH_PER_RANK, 6, generator=g), torch.randn(BATCH_PER_RANK, 2, generator=g)


def _flat(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def _runs_torchrun(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read()
    except OSError:
        return False
    return b"torch.distributed.run" in cmd or b"torchrun" in cmd


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def agent_pid() -> int:
    """The PID of the torchrun agent that started this worker: the oldest of this process's
    ancestors in a row that run torchrun. With torchrun's default start that is the parent; when
    torchrun forks its workers (``--start-method fork``, what ``dtrain_lab.launch`` does on a CPU
    machine) the forked processes keep the agent's command line, and the agent is further up.
    Linux (``/proc``); elsewhere the parent."""
    pid = os.getppid()
    try:
        while _runs_torchrun(parent := _parent(pid)):
            pid = parent
    except (OSError, ValueError, IndexError):
        return os.getppid()
    return pid


def main() -> None:
    rt = runtime.current()
    env = {k: os.environ.get(k) for k in ENV_VARS}

    # 1. an all-reduce: every rank contributes rank + 1
    x = torch.tensor([float(rt.rank + 1)], device=rt.device)
    dist.all_reduce(x)

    # 2. who is where: every rank's (host, group rank, local rank, pid, agent pid), gathered everywhere
    me = (socket.gethostname(), int(env["GROUP_RANK"] or -1), rt.local_rank, os.getpid(), agent_pid())
    everyone: list = [None] * rt.world_size
    dist.all_gather_object(everyone, me)

    # 3. one DDP step on this rank's batch
    model = _model().to(rt.device)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    xb, yb = _batch(rt.rank)
    torch.nn.functional.mse_loss(ddp(xb.to(rt.device)), yb.to(rt.device)).backward()
    opt.step()
    after = _flat(model).cpu()

    # the reference: one process, the same model, every rank's batch concatenated
    ref = _model()
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    batches = [_batch(r) for r in range(rt.world_size)]
    xs, ys = torch.cat([b[0] for b in batches]), torch.cat([b[1] for b in batches])
    torch.nn.functional.mse_loss(ref(xs), ys).backward()
    ref_opt.step()

    # the parameters of every rank, for a cross-rank comparison
    gathered = [torch.zeros_like(after) for _ in range(rt.world_size)]
    dist.all_gather(gathered, after.to(rt.device) if rt.backend == "nccl" else after)
    spread = max(float((g.cpu() - after).abs().max()) for g in gathered)

    print(f"rank {rt.rank}/{rt.world_size} local_rank {rt.local_rank} node(group_rank) {env['GROUP_RANK']}"
          f"/{env['GROUP_WORLD_SIZE']} master {env['MASTER_ADDR']}:{env['MASTER_PORT']} "
          f"all_reduce={x.item():g} ddp_vs_single={float((after - _flat(ref)).abs().max()):.2e}")
    runtime.report(rank=rt.rank, local_rank=rt.local_rank, world_size=rt.world_size,
                   local_world_size=rt.local_world_size, group_rank=me[1], env=env, backend=rt.backend,
                   all_reduce_sum=x.item(), everyone=[list(e) for e in everyone],
                   params_checksum=float(after.double().sum()), param_spread=spread,
                   ddp_vs_single=float((after - _flat(ref)).abs().max()))


if __name__ == "__main__":
    runtime.entrypoint(main)
