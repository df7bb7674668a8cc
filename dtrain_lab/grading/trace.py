"""Record every rank's sequence of collectives, so the grader can compare them (and explain a failure).

A deadlock-prone program does not deadlock every time: with gloo, small blocking sends are buffered
and mismatched collectives can happen to line up. The grader therefore does not rely on luck: each
rank appends one line per collective to its own trace file as the call *starts* (so a trace survives
a hang, a crash or ``os._exit``), and after the run the ranks' sequences are compared. Two ranks
that issued different collectives in the same position is a bug, whether or not this run hung.

Wrapping ``torch.distributed`` functions is done here, in the grader's harness only, because it is
the one place that must see calls made by code it does not control. The trace is written by the
rank itself, so a submission could forge it: the grader uses it to explain and to catch honest
mistakes that did not hang this time, never as proof that communication happened (private inputs
prove that). (To *time* collectives in your
own code, don't patch them: use the profiler or explicit timers.)
"""
from __future__ import annotations

import functools
import json
import os
import threading

import torch.distributed as dist

TRACED = ("all_reduce", "broadcast", "all_gather", "all_gather_object", "all_gather_single",
          "all_gather_into_tensor", "reduce_scatter", "reduce_scatter_single", "reduce_scatter_tensor",
          "reduce", "gather", "scatter", "barrier", "monitored_barrier", "send", "recv",
          "all_to_all", "all_to_all_single", "broadcast_object_list", "batch_isend_irecv")
P2P = ("send", "recv", "isend", "irecv")
POINT_TO_POINT = P2P + ("batch_isend_irecv",)   # every traced call that is not a collective
# isend/irecv are traced too: P2POp checks that its op *is* torch.distributed.distributed_c10d's
# isend/irecv, so those module globals are replaced by the same wrappers as torch.distributed's; a
# traced call torch makes inside another (send's isend, a batch's ops) is not recorded again

_installed = False
_fd: int | None = None
_counts: dict[str, int] = {}


# where a call's *input* (what this rank contributes) is, when it is not its first argument
_INPUT_ARG = {"all_gather": (1, "tensor"), "all_gather_into_tensor": (1, "input_tensor"),
              "all_to_all_single": (1, "input"), "all_to_all": (1, "input_tensor_list"),
              "reduce_scatter": (1, "input_list"), "reduce_scatter_tensor": (1, "input"),
              "scatter": (1, "scatter_list")}


def _numel(x) -> int | None:
    if hasattr(x, "numel"):
        return int(x.numel())
    if isinstance(x, (list, tuple)) and all(hasattr(t, "numel") for t in x):
        return sum(int(t.numel()) for t in x)
    return None


def _describe(name: str, args, kwargs) -> dict:
    entry: dict = {"op": name}
    t = args[0] if args else kwargs.get("tensor")
    if hasattr(t, "shape"):
        entry["shape"] = list(t.shape)
        entry["dtype"] = str(t.dtype).replace("torch.", "")
    # "sent": the elements this rank puts into the call (None: an object, or nothing, as a scatter's
    # non-source rank); what a check compares with what the technique needs to move
    where = _INPUT_ARG.get(name)
    given = (args[where[0]] if len(args) > where[0] else kwargs.get(where[1])) if where else t
    sent = _numel(given)
    if sent is not None:
        entry["sent"] = sent
    if "dtype" not in entry and hasattr(given, "dtype"):
        entry["dtype"] = str(given.dtype).replace("torch.", "")
    elif "dtype" not in entry and isinstance(given, (list, tuple)) and given and hasattr(given[0], "dtype"):
        entry["dtype"] = str(given[0].dtype).replace("torch.", "")
    if name in P2P:
        peer = args[1] if len(args) > 1 else kwargs.get("dst", kwargs.get("src"))
        entry["peer"] = peer
    if name == "batch_isend_irecv" and args:
        entry["ops"] = [(op.op.__name__, op.peer, list(op.tensor.shape)) for op in args[0]]
    if name in ("broadcast",):
        entry["src"] = args[1] if len(args) > 1 else kwargs.get("src")
    group = kwargs.get("group")
    if group is not None and group is not dist.GroupMember.WORLD:
        try:
            entry["group"] = sorted(dist.get_process_group_ranks(group))
        except Exception:  # noqa: BLE001
            entry["group"] = "?"
    return entry


def install(path: str) -> None:
    """Append a JSON line to ``path`` at the start of every collective this process issues."""
    global _installed, _fd
    if _installed:
        return
    _installed = True
    fd = _fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    inside = threading.local()

    def wrap(name, fn):
        @functools.wraps(fn)
        def traced(*args, **kwargs):
            if getattr(inside, "on", False):   # a call torch makes inside a traced one (send -> isend,
                return fn(*args, **kwargs)     # a batch's ops, all_gather_object -> all_gather): recorded once
            _counts[name] = _counts.get(name, 0) + 1
            os.write(fd, (json.dumps(_describe(name, args, kwargs)) + "\n").encode())
            inside.on = True
            try:
                return fn(*args, **kwargs)
            finally:
                inside.on = False

        traced.__dtrain_traced__ = True
        return traced

    from torch.distributed import distributed_c10d as c10d

    for name in TRACED + ("isend", "irecv"):
        fn = getattr(dist, name, None)
        if fn is not None and not getattr(fn, "__dtrain_traced__", False):
            traced = wrap(name, fn)
            setattr(dist, name, traced)
            if name in ("isend", "irecv") and getattr(c10d, name, None) is fn:
                setattr(c10d, name, traced)   # what P2POp and batch_isend_irecv compare ops with


def mark(name: str) -> None:
    """Put a mark (``{"op": name, "mark": true}``) between the collectives of this rank's trace: a
    contract function notes where, among its collectives, something happened (a file written, read).
    Nothing happens without a trace."""
    if _fd is not None:
        os.write(_fd, (json.dumps({"op": name, "mark": True}) + "\n").encode())


def calls(entries: list[dict]) -> list[dict]:
    """The collectives of a parsed trace, without its marks."""
    return [e for e in entries if not e.get("mark")]


def collectives_by_group(entries: list[dict], members: tuple[int, ...]) -> dict:
    """How many collectives (not point-to-point) ``entries`` hold on each group that has all of
    ``members``: ``{"world" or (rank, ...): count}``. The k-th collective of a group on one rank
    pairs with the k-th of that group on every other member."""
    out: dict = {}
    for e in calls(entries):
        if e["op"] in POINT_TO_POINT:
            continue
        group = e.get("group")
        if group is None:
            key = "world"
        elif isinstance(group, list) and all(m in group for m in members):
            key = tuple(group)
        else:
            continue
        out[key] = out.get(key, 0) + 1
    return out


def p2p_count(entries: list[dict], op: str, peer: int) -> int:
    """How many blocking ``op`` ("send" or "recv") calls with ``peer`` ``entries`` hold."""
    return sum(1 for e in calls(entries) if e["op"] == op and e.get("peer") == peer)


def count(op: str) -> int | None:
    """How many ``op`` calls this process has issued since the trace was installed (``None`` without one)."""
    return _counts.get(op, 0) if _installed else None


def _int(v) -> bool:
    return type(v) is int and -(1 << 31) <= v < (1 << 31)


# what a trace entry may hold, and of which type; anything else of a line is dropped
_FIELDS = {
    "op": lambda v: isinstance(v, str) and 0 < len(v) <= 64,
    "mark": lambda v: v is True,
    "shape": lambda v: isinstance(v, list) and len(v) <= 16 and all(_int(d) and d >= 0 for d in v),
    "dtype": lambda v: isinstance(v, str) and len(v) <= 32,
    "peer": _int,
    "sent": lambda v: type(v) is int and 0 <= v < (1 << 62),
    "src": _int,
    "group": lambda v: v == "?" or (isinstance(v, list) and len(v) <= 4096 and all(_int(r) for r in v)),
    "ops": lambda v: isinstance(v, list) and len(v) <= 4096 and all(
        isinstance(o, list) and len(o) in (2, 3) and isinstance(o[0], str) and len(o[0]) <= 16 and _int(o[1])
        and (len(o) == 2 or _FIELDS["shape"](o[2])) for o in v),
}


def parse(text: str) -> list[dict]:
    """The calls of a trace file's text. The rank wrote it: a line that is not a JSON object (cut off,
    or forged) is skipped, and of a line only the known fields of the right types are kept, so that a
    check can trust the types of what it reads (not that the calls happened)."""
    out = []
    for line in text.splitlines():
        try:
            item = json.loads(line)
        except ValueError:
            continue
        if not isinstance(item, dict) or not _FIELDS["op"](item.get("op")):
            continue
        out.append({k: v for k, v in item.items() if k in _FIELDS and _FIELDS[k](v)})
    return out


def read(path: str) -> list[dict]:
    try:
        with open(path, errors="replace") as f:
            return parse(f.read())
    except OSError:
        return []


def first_mismatch(traces: dict[int, list[dict]]) -> tuple[int, dict[int, dict | None]] | None:
    """The first position where the ranks' world-group collectives differ (p2p calls excluded:
    they pair up by peer, not by position), or None if every rank issued the same sequence."""
    def collective_seq(seq):
        return [{k: v for k, v in e.items() if k in ("op", "shape", "dtype", "src")}
                for e in calls(seq) if e["op"] not in POINT_TO_POINT and "group" not in e]

    seqs = {r: collective_seq(t) for r, t in traces.items()}
    longest = max((len(s) for s in seqs.values()), default=0)
    for i in range(longest):
        items = {r: (s[i] if i < len(s) else None) for r, s in seqs.items()}
        if len({json.dumps(v, sort_keys=True) for v in items.values()}) > 1:
            return i, items
    return None
