"""What each process of a multi-node job sees, and one DDP step that must agree on every node.

Run on two machines (or two terminals of one machine, see ``dtrain_lab.jobs.cluster.run_local_nodes``)::

    # on every node, the same command (c10d rendezvous: the node rank is assigned, not given)
    torchrun --nnodes 2 --nproc-per-node 1 --rdzv-backend c10d \\
             --rdzv-endpoint HOST0:29400 --rdzv-id job1 -m dtrain_lab.demos.multinode_check

Each rank reports its global rank, local rank, group rank (which node), the world sizes, the
torchelastic variables torchrun set, an all-reduce, and the parameters after one DDP step compared
with the same step taken by one process on the whole (all ranks') batch.

Two failures, for a scheduler's handling of them (the SLURM job of lesson 12, ``tests/test_slurm_job.py``):

* ``--fail-once RANK``: in the job's first attempt (``TORCHELASTIC_RESTART_COUNT`` 0), global rank
  ``RANK`` kills itself (SIGKILL) after the all-reduce. Within ``--max-restarts`` torchrun restarts
  every worker and the job ends well; with ``--max-restarts 0`` the job fails.
* ``--kill-agent NODE``: the worker of node (group rank) ``NODE`` with local rank 0 kills its torchrun
  agent (SIGKILL), then exits: the scheduler's task on that node is gone, not just a worker.
"""
import argparse
import base64
import datetime
import gc
import os
import pickle
import signal
import socket
import sys

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


def _rdzv_endpoint(pid: int) -> tuple[str, int] | None:
    """``--rdzv-endpoint HOST[:PORT]`` of the torchrun whose command line process ``pid`` runs (a
    worker forked by torchrun keeps its agent's command line), or None (Linux ``/proc``)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().decode(errors="replace").split("\0")
    except OSError:
        return None
    if "torch.distributed.run" not in argv and not any(a.endswith("torchrun") for a in argv):
        return None
    for i, a in enumerate(argv):
        for flag in ("--rdzv-endpoint", "--rdzv_endpoint"):
            if a == flag and i + 1 < len(argv):
                value = argv[i + 1]
            elif a.startswith(flag + "="):
                value = a[len(flag) + 1:]
            else:
                continue
            host, sep, port = value.rpartition(":")
            return (host.strip("[]"), int(port)) if sep else (value, 29400)   # torchrun's default port
    return None


def _node_in_memory():
    """Torch's own ``_NodeDesc`` of this worker's agent, when the worker was forked from that agent
    (``--start-method fork``): the agent's rendezvous handler is in this process's memory too."""
    try:
        from torch.distributed.elastic.rendezvous.dynamic_rendezvous import DynamicRendezvousHandler
    except ImportError:
        return None
    found = [o._this_node for o in gc.get_objects() if type(o) is DynamicRendezvousHandler]   # (no isinstance: ABCs warn)
    return found[0] if len(found) == 1 else None


def _node_in_store():
    """Torch's own ``_NodeDesc`` of this worker's agent, read from the c10d rendezvous's state in its
    store (``c10d_rendezvous_backend.py``: key ``torch.rendezvous.<run id>``, a base64 pickle): the
    participant numbered ``GROUP_RANK``. The store's address is on the agent's command line."""
    run_id, group_rank = os.environ.get("TORCHELASTIC_RUN_ID"), os.environ.get("GROUP_RANK")
    endpoint = _rdzv_endpoint(os.getppid())
    if not (run_id and group_rank and endpoint):
        return None
    try:
        store = dist.TCPStore(*endpoint, is_master=False, timeout=datetime.timedelta(seconds=10))
        state = pickle.loads(base64.b64decode(store.get("torch.rendezvous." + run_id)))
    except Exception:  # noqa: BLE001 - not a c10d rendezvous, or its store has gone
        return None
    found = [node for node, rank in state.participants.items() if rank == int(group_rank)]
    return found[0] if len(found) == 1 else None


def rendezvous_node() -> tuple[str, int, int] | None:
    """How torch's c10d rendezvous knows the torchrun agent that started this worker: its node
    descriptor ``(address, pid, local id)`` (``dynamic_rendezvous.py``: ``_NodeDesc``; the pid is
    that of the agent process, which created the rendezvous handler). The rendezvous sorts these
    tuples and numbers them: the n-th smallest becomes ``GROUP_RANK`` n. Read from torch's state, not
    guessed: in the rendezvous's store, else (no endpoint on the command line) in the worker's memory
    when it was forked from the agent.
    None without a c10d rendezvous."""
    node = _node_in_store() or _node_in_memory()
    return None if node is None else (node.addr, node.pid, node.local_id)


def _args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="dtrain_lab.demos.multinode_check")
    ap.add_argument("--fail-once", type=int, metavar="RANK", help="this global rank kills itself in attempt 0")
    ap.add_argument("--kill-agent", type=int, metavar="NODE", help="this node's local rank 0 kills its agent")
    return ap.parse_args(argv)


def main() -> None:
    args = _args(sys.argv[1:])
    rt = runtime.current()
    env = {k: os.environ.get(k) for k in ENV_VARS}

    # 1. an all-reduce: every rank contributes rank + 1
    x = torch.tensor([float(rt.rank + 1)], device=rt.device)
    dist.all_reduce(x)
    attempt = int(env["TORCHELASTIC_RESTART_COUNT"] or 0)
    if args.fail_once == rt.rank and attempt == 0:
        print(f"rank {rt.rank}: killing myself (attempt {attempt})", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    if args.kill_agent is not None and int(env["GROUP_RANK"] or -1) == args.kill_agent and rt.local_rank == 0:
        print(f"rank {rt.rank}: killing the torchrun agent of node {args.kill_agent}", flush=True)
        os.kill(os.getppid(), signal.SIGKILL)
        os._exit(1)

    # 2. who is where: every rank's (host, group rank, local rank, pid, agent pid, agent's rendezvous
    #    key), gathered everywhere; the key is what the rendezvous sorted to number the nodes
    node = rendezvous_node()
    me = (socket.gethostname(), int(env["GROUP_RANK"] or -1), rt.local_rank, os.getpid(),
          None if node is None else node[1], None if node is None else list(node))
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
          f"attempt {attempt} all_reduce={x.item():g} ddp_vs_single={float((after - _flat(ref)).abs().max()):.2e}")
    runtime.report(rank=rt.rank, local_rank=rt.local_rank, world_size=rt.world_size,
                   local_world_size=rt.local_world_size, group_rank=me[1], env=env, backend=rt.backend,
                   all_reduce_sum=x.item(), everyone=[list(e) for e in everyone],
                   params_checksum=float(after.double().sum()), param_spread=spread,
                   ddp_vs_single=float((after - _flat(ref)).abs().max()))


if __name__ == "__main__":
    runtime.entrypoint(main)
