"""What each exercise teaches, checked in the ranks' traces: the technique, not only the values.

A right answer can come from a shortcut: one ``all_gather`` of every K/V block instead of the ring,
an ``all_gather`` of the expert weights instead of two All-to-Alls, a dense all-reduce instead of a
sparse exchange. Private inputs prove that the ranks communicated; these checks say whether they
communicated *the way the exercise teaches*, and tell an honest learner what it wanted ("you gathered
every K/V block at once; the ring passes one block at a time").

Each check reads :attr:`Run.traces` (what every rank issued, recorded as the call started:
:mod:`dtrain_lab.grading.trace`) and returns problems. The trace is written by the rank, so a
submission that forges it is not caught here: these checks catch shortcuts written in ordinary code,
which is what a learner who skips the technique writes. What is proven from outside the rank, and
what is not, is in the instructor guide's table.

One check is not read from the trace: :func:`bytes_at_most` reads ``Run.wire_bytes``, the bytes the
ranks sent each other as the kernel counted them in the job's own network namespace (under the
sandbox only), so a dense exchange or moved weights are seen whichever call sent them.

Helpers: :func:`moves` (every message a rank sent or received, collectives and point-to-point, with
its element count), :func:`data_collectives`.
"""
from __future__ import annotations

import math

from dtrain_lab.grading.exercise import problem
from dtrain_lab.i18n import rendered

# calls that move a tensor's data between ranks (barrier and monitored_barrier do not)
DATA_COLLECTIVES = ("all_reduce", "broadcast", "all_gather", "all_gather_object", "all_gather_single",
                    "all_gather_into_tensor", "reduce_scatter", "reduce_scatter_single", "reduce_scatter_tensor",
                    "reduce", "gather", "scatter", "all_to_all", "all_to_all_single", "broadcast_object_list")
SENDS = ("send", "isend")
RECVS = ("recv", "irecv")


def numel(shape) -> int | None:
    return math.prod(shape) if isinstance(shape, list) else None


def point_to_point(calls: list[dict]) -> list[tuple[str, int, int | None]]:
    """``(direction, peer, elements)`` of every message a rank posted: ``"send"`` or ``"recv"``, from
    blocking and non-blocking calls and from the ops of each ``batch_isend_irecv``."""
    out = []
    for c in calls:
        op = c.get("op")
        if op in SENDS or op in RECVS:
            out.append(("send" if op in SENDS else "recv", c.get("peer"), numel(c.get("shape"))))
        elif op == "batch_isend_irecv":
            for o in c.get("ops") or []:
                direction = "send" if o[0] in SENDS else "recv"
                out.append((direction, o[1], numel(o[2]) if len(o) > 2 else None))
    return out


def data_collectives(calls: list[dict]) -> list[dict]:
    return [c for c in calls if c.get("op") in DATA_COLLECTIVES]


def _no_collective(rank: int, calls: list[dict], key: str) -> list:
    """For the point-to-point techniques (the ring, the pipeline): ``key`` names the first collective
    that moved data instead."""
    gathered = data_collectives(calls)
    return [problem(key, rank=rank, op=gathered[0]["op"])] if gathered else []


# ------------------------------------------------------------------ lab 13, exercise 1: the ring
def ring(block_elements):
    """Ring attention: K/V blocks travel from rank to rank, one block per step, to the next rank and
    from the previous one: ``p - 1`` steps of ``block_elements(run, rank)`` elements each way. No
    collective moves K/V (an all-gather of every block is what ring attention exists to avoid: each
    rank would hold the whole sequence's keys and values at once)."""
    def check(run):
        p = run.world_size
        for rank, calls in sorted(run.traces.items()):
            found = _no_collective(rank, calls, "pattern_ring_collective")
            if found:
                return found
            block = block_elements(run, rank)
            msgs = point_to_point(calls)
            right, left = (rank + 1) % p, (rank - 1) % p
            strangers = sorted({peer for d, peer, _ in msgs if peer != (right if d == "send" else left)},
                               key=str)
            if strangers:
                return [problem("pattern_ring_peers", rank=rank, peers=strangers, right=right, left=left)]
            for direction in ("send", "recv"):
                sizes = [n for d, _, n in msgs if d == direction]
                if any(n is None or n > block for n in sizes) or sum(n or 0 for n in sizes) != (p - 1) * block:
                    return [problem("pattern_ring_blocks", rank=rank, steps=p - 1, block=block,
                                    sent=sum(n or 0 for n in sizes), messages=len(sizes))]
        return []
    return check


def only(allowed: tuple, key: str, point_to_point_ok: bool = False):
    """No data moves by any call outside ``allowed`` (barriers are not data): the exercise's technique
    is those calls. ``key``: the message that names the call used instead and the one the exercise
    teaches."""
    def check(run):
        for rank, calls in sorted(run.traces.items()):
            for c in data_collectives(calls):
                if c["op"] not in allowed:
                    return [problem(key, rank=rank, op=c["op"])]
            if not point_to_point_ok and point_to_point(calls):
                return [problem(key, rank=rank, op="send/recv")]
        return []
    return check


# ------------------------------------------------------------------ lab 13, exercise 2: All-to-All
def all_to_all(run):
    """Dispatch and combine: the token rows travel by two All-to-Alls (there and back), and nothing
    else moves floating-point data: no rank ever sees another rank's expert weights (an all-gather of
    the weights computes the same rows without any dispatch). Counts may be exchanged any way."""
    for rank, calls in sorted(run.traces.items()):
        for c in data_collectives(calls) + [{"op": "send/recv", "dtype": "float64"} for _ in point_to_point(calls)]:
            if c["op"] not in ("all_to_all", "all_to_all_single") and not str(c.get("dtype", "float")).startswith(
                    ("int", "uint", "bool")):
                return [problem("pattern_a2a_other", rank=rank, op=c["op"])]
        rows = [c for c in calls if c.get("op") in ("all_to_all", "all_to_all_single")
                and str(c.get("dtype", "float")).startswith(("float", "bfloat", "complex"))]
        if len(rows) < 2:
            return [problem("pattern_a2a_two", rank=rank, n=len(rows))]
    return []


# ------------------------------------------------------------------ lab 04: a sparse exchange
def sparse(max_k: int):
    """Top-k compression: each rank sends its k values and their k indices, never a dense vector.
    No all-reduce (summing indices is meaningless, and a dense all-reduce is what compression
    replaces), and no call carries more than ``max_k`` elements of this rank."""
    def check(run):
        for rank, calls in sorted(run.traces.items()):
            for c in data_collectives(calls):
                if c["op"] == "all_reduce":
                    return [problem("pattern_sparse_allreduce", rank=rank, n=c.get("sent", "?"))]
                if c.get("sent") is None or c["sent"] > max_k:
                    return [problem("pattern_sparse_dense", rank=rank, op=c["op"], n=c.get("sent", "?"), k=max_k)]
            for _, _, n in point_to_point(calls):
                if n is None or n > max_k:
                    return [problem("pattern_sparse_dense", rank=rank, op="send/recv", n=n, k=max_k)]
        return []
    return check


# ------------------------------------------------------------------ lab 10: two levels
def two_levels(nodes):
    """The hierarchical all-reduce: data moves inside a node (on that node's group) and between the
    nodes' leaders (on the leaders' group, by an all-reduce the leaders alone issue), never on the
    whole world or any other group (a flat all-gather and a local sum gives the same sum)."""
    def check(run):
        node_list = [sorted(n) for n in nodes(run.world_size)]
        leaders = sorted(n[0] for n in node_list)
        for rank, calls in sorted(run.traces.items()):
            mine = next(n for n in node_list if rank in n)
            for c in data_collectives(calls):
                group = c.get("group")
                if group not in (mine, leaders):
                    return [problem("pattern_hier_group", rank=rank, op=c["op"],
                                    group="world" if group is None else group, node=mine, leaders=leaders)]
            if point_to_point(calls):
                return [problem("pattern_hier_group", rank=rank, op="send/recv", group="-", node=mine,
                                leaders=leaders)]
            crossing = [c for c in data_collectives(calls) if c.get("group") == leaders and c["group"] != mine]
            if rank in leaders and len(node_list) > 1 and not crossing:
                return [problem("pattern_hier_no_cross", rank=rank, leaders=leaders)]
            if rank not in leaders and crossing:
                return [problem("pattern_hier_group", rank=rank, op=crossing[0]["op"], group=leaders, node=mine,
                                leaders=leaders)]
        return []
    return check


# ------------------------------------------------------------------ lab 08: stages exchange activations
def pipeline(microbatches: int, act_elements: int):
    """Pipeline parallelism: each stage sends every micro-batch's activations to the next stage and
    receives its gradient back (``microbatches`` of each, ``act_elements`` elements each); no
    collective moves data (broadcasting the inputs and running the whole model on every rank gives
    the same losses without any pipeline)."""
    def check(run):
        p = run.world_size
        for rank, calls in sorted(run.traces.items()):
            found = _no_collective(rank, calls, "pattern_pipe_collective")
            if found:
                return found
            msgs = point_to_point(calls)
            want = []
            if rank < p - 1:
                want += [("send", rank + 1), ("recv", rank + 1)]
            if rank > 0:
                want += [("recv", rank - 1), ("send", rank - 1)]
            for direction, peer in want:
                sizes = [n for d, q, n in msgs if d == direction and q == peer]
                if len(sizes) != microbatches or any(n != act_elements for n in sizes):
                    way = rendered("pattern_send" if direction == "send" else "pattern_recv")
                    return [problem("pattern_pipe_messages", rank=rank, direction=way, peer=peer,
                                    n=len(sizes), want=microbatches, elements=act_elements)]
        return []
    return check


def bytes_at_most(budget: int, key: str, **fields):
    """The ranks sent each other at most ``budget`` bytes (``Run.wire_bytes``: the kernel's loopback
    counters of the job's own network namespace, read by the supervisor after every rank ended; TCP
    headers, the rendezvous and gloo's handshakes included). Else the catalogue message ``key`` with
    ``got`` and ``budget`` in KiB and ``fields``. Without a sandbox there is no count (None) and
    nothing to check; NCCL on one GPU node moves its bytes over shared memory or NVLink, which are
    not counted, so a count is only ever too low, never too high: an honest job cannot fail here by
    the transport it ran on."""
    def check(run):
        got = getattr(run, "wire_bytes", None)
        if got is None or got <= budget:
            return []
        return [problem(key, got=got >> 10, budget=budget >> 10, **fields)]
    return check
