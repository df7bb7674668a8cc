"""Two (or more) "nodes" on one machine: :func:`run_local_nodes` starts ``nnodes`` torchrun agents
on this machine, each through :func:`dtrain_lab.launch` as if it were a node of its own, joined by a c10d rendezvous on a free
loopback port. This is exactly what happens on a cluster, minus the network:

* every agent is given the same ``--rdzv-endpoint`` and ``--rdzv-id``; the first one to bind the
  endpoint hosts the rendezvous store, the others connect to it;
* with c10d the node rank is *assigned* by the rendezvous, not taken from ``--node-rank`` (torchrun
  ignores it and says so): the agents are sorted by (host, pid) and numbered
  (``torch/distributed/elastic/rendezvous/dynamic_rendezvous.py``: ``for rank, node in
  enumerate(sorted(state.participants))``). A worker learns its node from ``GROUP_RANK``; its
  global rank is ``GROUP_RANK * LOCAL_WORLD_SIZE + LOCAL_RANK``.

  Consequence for :class:`~dtrain_lab.jobs.launch.LaunchResult`: each launch numbers its ranks
  ``node_rank * nproc + local_rank``, a guess that is wrong whenever the rendezvous gave the node
  another group rank. :class:`NodesResult` therefore rebuilds the job's ranks from what the workers
  themselves recorded (their ``RANK``), not from the requested ``node_rank``.
* if one node fails, the others are stopped at once (not left waiting in the rendezvous or in a
  collective until their time limit), and no process of any node survives.
"""
from __future__ import annotations

import dataclasses
import json
import signal
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import psutil

from dtrain_lab.sandbox import contain
from dtrain_lab.i18n import LabError, tr
from dtrain_lab.jobs.launch import launch
from dtrain_lab.jobs.outcome import native_abort
from dtrain_lab.jobs.result import gathered, load_reports


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (bind to port 0, read it, close)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((host, 0))
        return s.getsockname()[1]


@dataclass
class NodeInfo:
    """One simulated node: what was asked, what the rendezvous gave it, and its launch."""

    requested_rank: int                  # the node_rank passed to launch() (c10d ignores it)
    group_rank: int | None               # the node rank the rendezvous assigned (None: never started)
    ranks: list[int]                     # global ranks of its workers, from what they recorded
    result: Any                          # its dtrain_lab.jobs.launch.LaunchResult
    stopped: bool = False                # killed by run_local_nodes because another node had failed


@dataclass
class NodesResult:
    """The outcome of :func:`run_local_nodes`: every node's launch and the job's ranks merged."""

    target: str
    nnodes: int
    nproc: int
    endpoint: str
    rdzv_id: str
    ok: bool
    elapsed: float
    nodes: list[NodeInfo] = field(default_factory=list)
    ranks: list = field(default_factory=list)     # RankResult of every rank, in global-rank order
    stopped_by_peer: list[int] = field(default_factory=list)  # nodes killed because another had failed

    @property
    def metrics(self) -> dict[int, dict]:
        return {r.rank: r.metrics for r in self.ranks}

    def gathered(self, key: str) -> list:
        """``metrics[r][key]`` for every rank of the whole job, in global-rank order."""
        return gathered(self.ranks, key)

    def summary(self, lang: str | None = None) -> str:
        lines = [tr("cl_nodes_ok" if self.ok else "cl_nodes_failed", lang, nnodes=self.nnodes,
                    world=self.nnodes * self.nproc, endpoint=self.endpoint)]
        for n in self.nodes:
            lines.append(tr("cl_node_line", lang, node=n.requested_rank,
                            group="?" if n.group_rank is None else n.group_rank,
                            ranks=", ".join(map(str, n.ranks)) or "-"))
            lines.extend("    " + ln for ln in n.result.summary(lang, timing=False).splitlines())
        for i in self.stopped_by_peer:
            lines.append(tr("cl_node_stopped", lang, node=i))
        lines.append(f"  [{self.elapsed:.1f} s]")
        return "\n".join(lines)


def _node_inits(marker: str, node: int | None = None) -> list:
    """The launches' inits of node ``node`` (every node if None): this process's children that were
    started with the run's marker (every launch runs under an init, a child subreaper that holds the
    whole process tree of its node: :mod:`dtrain_lab.sandbox.contain`)."""
    found = []
    try:
        children = psutil.Process().children()
    except psutil.Error:
        return found
    for p in children:
        try:
            env = p.environ()
            if env.get("DTRAIN_NODES_ID") != marker:
                continue
            if node is not None and env.get("DTRAIN_SIM_NODE") != str(node):
                continue
            found.append(p)
        except (psutil.Error, OSError):
            continue
    return found


def _kill_marker(marker: str, node: int | None = None) -> bool:
    """SIGKILL every process of simulated node ``node`` (all nodes if None): each launch's init and
    its whole tree, without reaping the init (the launch, Popen.poll in another thread, must find its
    exit status, or it would report returncode 0 for a killed node).

    True if one of those inits was still running when this was called. Whether the kill is how the
    node ended is for the caller to read in the launch's result: a node whose agent lost the
    rendezvous store can end by itself at the same moment, with an error of its own."""
    inits = _node_inits(marker, node)
    running = any(_alive(p) for p in inits)
    for p in inits:
        contain.kill_tree(p.pid)   # the tree, then the init itself
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline and any(_alive(p) for p in inits):
        time.sleep(0.02)
    return running


def _wait_for_agent(marker: str, node: int, thread: threading.Thread, limit: float) -> None:
    """Until node ``node``'s init has started its torchrun agent (or its launch has ended, or
    ``limit`` seconds have passed)."""
    deadline = time.monotonic() + limit
    while thread.is_alive() and time.monotonic() < deadline:
        for p in _node_inits(marker, node):
            try:
                if p.children():
                    return
            except psutil.Error:
                pass
        time.sleep(0.02)


def _alive(p) -> bool:
    try:
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _node_ranks(job_dir: str) -> list[int]:
    """The global ranks whose workers started in this launch (``started.<RANK>.<attempt>`` markers
    written by the injected sitecustomize, named with the RANK torchrun gave the worker)."""
    ranks = set()
    for p in Path(job_dir).glob("started.*"):
        parts = p.name.split(".")
        if len(parts) >= 3 and parts[1].isdigit():
            ranks.add(int(parts[1]))
    return sorted(ranks)


def _failed_by_itself(result, ranks: list) -> bool:
    """A rank of this node recorded an exception (its error file) or died in a C++ abort. Not merely
    an exception-like last line of its stderr (``RankResult.exception``'s last resort): a rank
    killed while waiting may have printed one from a background thread as its peers went away."""
    return any(Path(result.log_dir).glob("error.*.json")) or any(native_abort(rr.stderr) for rr in ranks)


def _remap(result, nproc: int, requested_rank: int) -> tuple[int | None, list[int], list]:
    """Rank results of one node launch renumbered with the ranks its workers really had."""
    true_ranks = _node_ranks(result.log_dir)
    guessed_base = requested_rank * nproc
    true_base = (min(true_ranks) // nproc) * nproc if true_ranks else guessed_base
    group_rank = true_base // nproc if true_ranks else None
    out = []
    first = min((rr.rank for rr in result.ranks), default=guessed_base)
    for rr in result.ranks:
        rank = true_base + (rr.rank - first)      # launch() already renumbers; older results did not
        new = dataclasses.replace(rr, rank=rank, metrics={}, reports=[])
        load_reports(new, result.log_dir)
        err = sorted(Path(result.log_dir).glob(f"error.{rank}.*.json"))
        if err:
            try:
                info = json.loads(err[0].read_text())
                new.exception = f"{info.get('type')}: {info.get('message')}"
                new.traceback = info.get("traceback")
            except (OSError, ValueError):
                pass
        out.append(new)
    return group_rank, true_ranks, out


def run_local_nodes(target: str, nnodes: int = 2, nproc: int = 1, args: Sequence[Any] = (),
                    timeout: float = 60.0, startup_timeout: float = 90.0,
                    env: Mapping[str, Any] | None = None, backend: str | None = None,
                    quiet: bool = True, rdzv_id: str | None = None, port: int | None = None,
                    node_env: Sequence[Mapping[str, Any]] | None = None,
                    start_order: Sequence[int] | None = None, stagger: float = 0.0) -> NodesResult:
    """Run ``target`` as a job of ``nnodes`` simulated nodes of ``nproc`` processes each.

    Every node is one :func:`dtrain_lab.launch` call (one torchrun agent) in its own thread, with
    ``nnodes``, its ``node_rank``, the same ``rdzv_endpoint=127.0.0.1:<free port>`` and ``rdzv_id``.
    ``timeout``/``startup_timeout`` are those of each launch; ``node_env`` adds variables to one
    node (e.g. to make only node 1 fail). When a node ends in failure, the other nodes' processes
    are killed at once. Each node's processes carry ``DTRAIN_SIM_NODE=<i>`` in their environment.
    ``start_order`` (e.g. ``[1, 0]``) and ``stagger`` (seconds from one node's agent process to the
    next node's start) choose which agent starts first: with c10d the earlier agent (lower pid,
    unless pids wrap around) becomes group rank 0, whatever its ``node_rank``.
    """
    if not isinstance(nnodes, int) or isinstance(nnodes, bool) or nnodes < 1:
        raise LabError("cl_bad_int", field="nnodes", value=nnodes, lo=1)
    if not isinstance(nproc, int) or isinstance(nproc, bool) or nproc < 1:
        raise LabError("cl_bad_int", field="nproc", value=nproc, lo=1)
    port = port or free_port()
    endpoint = f"127.0.0.1:{port}"
    rdzv_id = rdzv_id or f"sim-{uuid.uuid4().hex[:8]}"
    marker = uuid.uuid4().hex
    results: dict[int, Any] = {}
    errors: dict[int, BaseException] = {}
    done = threading.Event()
    lock = threading.Lock()

    def one(i: int) -> None:
        node_vars = dict(env or {})
        if node_env is not None and i < len(node_env):
            node_vars.update(node_env[i])
        node_vars.update({"DTRAIN_NODES_ID": marker, "DTRAIN_SIM_NODE": str(i)})
        try:
            r = launch(target, nproc=nproc, args=args, timeout=timeout, startup_timeout=startup_timeout,
                       env=node_vars, backend=backend, quiet=quiet, nnodes=nnodes, node_rank=i,
                       rdzv_endpoint=endpoint, rdzv_id=rdzv_id,
                       # every "node" names itself 127.0.0.1: the rendezvous sorts the agents by
                       # (address, pid), and the workers' MASTER_ADDR is the address of group rank 0
                       torchrun_args=["--local-addr", "127.0.0.1"])
            with lock:
                results[i] = r
        except BaseException as exc:  # noqa: BLE001 - reported to the caller below
            with lock:
                errors[i] = exc
        finally:
            done.set()

    t0 = time.monotonic()
    threads = [threading.Thread(target=one, args=(i,), daemon=True, name=f"sim-node-{i}") for i in range(nnodes)]
    order = list(range(nnodes)) if start_order is None else [int(i) for i in start_order]
    if sorted(order) != list(range(nnodes)):
        raise LabError("cl_bad_int", field="start_order", value=start_order, lo=0)
    for k, i in enumerate(order):
        if k and stagger > 0:
            # from the moment the previous node's agent exists (its pid is its place in the
            # rendezvous's order): a launch's own start-up can take longer than the stagger on a
            # loaded machine, or the first time a process launches, and the agents would then start
            # together, in either order
            _wait_for_agent(marker, order[k - 1], threads[order[k - 1]], min(startup_timeout, 30.0))
            time.sleep(stagger)
        threads[i].start()
    killed: list[int] = []         # nodes whose running agent this runner killed
    tried: set[int] = set()
    # a node's launch gives up by itself after startup_timeout + timeout; this is the outer guard
    deadline = t0 + startup_timeout + timeout + 30.0
    try:
        while any(t.is_alive() for t in threads):
            done.wait(0.2)
            done.clear()
            with lock:
                failed = bool(errors) or any(not r.ok for r in results.values())
            if failed or time.monotonic() > deadline:
                for i, t in enumerate(threads):
                    if t.is_alive() and i not in tried:
                        tried.add(i)
                        # a node whose agent had already ended by itself (e.g. it lost the
                        # rendezvous store when the failed node's agent, its host, exited) was
                        # not stopped by us: its result tells its own end
                        if _kill_marker(marker, i):
                            killed.append(i)
    except KeyboardInterrupt:
        _kill_marker(marker)
        raise
    finally:
        for t in threads:
            t.join(timeout=30)
        _kill_marker(marker)  # nothing of any node survives, whatever happened
    if errors:
        raise next(iter(errors.values()))

    nodes, all_ranks, stopped = [], [], []
    for i in range(nnodes):
        group_rank, true_ranks, ranks = _remap(results[i], nproc, i)
        # stopped by its peer: killed while running, and ended by that kill (SIGKILL: its own end
        # would have been an exit code), before any of its ranks had failed by itself. The launches
        # return in no particular order: the node whose rank failed first may still be in its agent's
        # shutdown when another node's failure is seen
        if i in killed and results[i].returncode == -signal.SIGKILL and not _failed_by_itself(results[i], ranks):
            stopped.append(i)
        nodes.append(NodeInfo(requested_rank=i, group_rank=group_rank, ranks=true_ranks, result=results[i],
                              stopped=i in stopped))
        all_ranks.extend(ranks)
    all_ranks.sort(key=lambda r: r.rank)
    complete = sorted(r.rank for r in all_ranks) == list(range(nnodes * nproc))
    ok = not killed and complete and all(n.result.ok for n in nodes)
    return NodesResult(target=str(target), nnodes=nnodes, nproc=nproc, endpoint=endpoint, rdzv_id=rdzv_id,
                       ok=ok, elapsed=time.monotonic() - t0, nodes=nodes, ranks=all_ranks,
                       stopped_by_peer=sorted(stopped))
