"""The planner's dry run: one rank of a large job, in this process, with nothing allocated.

* A **fake process group** (``init_process_group("fake", store=FakeStore(), rank, world_size)``,
  from ``torch.testing._internal.distributed.fake_pg``; torch 2.13 ships ``FakeProcessGroup`` in
  ``torch._C._distributed_c10d``) makes this process rank ``rank`` of ``world_size``: groups can be
  created and collectives called; they move nothing.
* The rank's blocks are built on the **meta device** (shapes, no storage) by the very class the real
  runs use, :class:`dtrain_lab.parallel.compose.ParallelBlock`: its parameter count per rank is
  exact, whatever the model size.
* One block of each kind (dense, MoE) runs forward and backward under **FakeTensorMode**: every
  tensor has a shape and a dtype but no data. A ``saved_tensors_hooks`` pair records what autograd
  keeps for backward — the block's activation bytes per micro-batch — and ``CommDebugMode`` counts
  the collectives the fake process group was asked for (TP's All-Reduces, EP's All-to-Alls). MoE
  blocks route with the data-independent balanced routing (``MoE.balanced``), the assumption a plan
  makes.

torchtitan estimates memory the same way (FakeTensorMode, a fake process group and its
``FSDPMemTracker``). torch's ``RuntimeEstimator`` needs CUDA, so time comes from our own model
(:mod:`dtrain_lab.planner.core`).
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import warnings
from pathlib import Path

import torch
import torch.distributed as dist

from dtrain_lab.sandbox import apart
from dtrain_lab.i18n import LabError
from dtrain_lab.parallel.compose import ModelConfig, ParallelBlock, is_moe_layer
from dtrain_lab.parallel.dims import ParallelDims
from dtrain_lab.parallel.expert import MoE
from dtrain_lab.planner.memtrack import PeakMemory

__all__ = ["fake_world", "measure_blocks"]


@contextlib.contextmanager
def fake_world(dims: ParallelDims, rank: int):
    """This process as ``rank`` of a fake ``dims.world_size``-rank job; yields ``{dim: group}`` for the
    groups of ``rank`` (only these are created: with a fake backend nobody else has to take part)."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        raise LabError("plan_in_job")
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=dims.world_size)
    try:
        yield {dim: dist.new_group(dims.group_of(rank, dim)) for dim in ("tp", "cp", "ep")}
    finally:
        dist.destroy_process_group()


def _key(t: torch.Tensor) -> tuple:
    # the identity of a tensor's data; a fake tensor has a storage object but no address
    return (t.untyped_storage()._cdata, t.storage_offset(), tuple(t.shape), tuple(t.stride()))


_MEASURED: dict = {}
_MAX_MEASURED = 64


def _position(dims: ParallelDims, rank: int) -> tuple:
    """What a block on ``rank`` depends on: its place in, and the size of, its tp, cp and ep groups
    (not its pipeline stage or data-parallel replica, which only choose which layers and which data)."""
    return tuple((dim, len(g), g.index(rank)) for dim in ("tp", "cp", "ep") for g in [dims.group_of(rank, dim)])


def measure_blocks(cfg: ModelConfig, dims: ParallelDims, rank: int, tokens: tuple[int, int], dtype,
                   run: bool = True) -> dict:
    """For ``rank``: parameters of one dense and one MoE block (``dense``/``expert`` numel), and (with
    ``run``) for each kind the activation bytes one micro-batch of ``tokens = (micro_batch, seq_len /
    cp)`` leaves saved for backward — plain (``activation_bytes``) and with the block checkpointed
    (``activation_bytes_ckpt``, ``torch.utils.checkpoint``) — and the collectives of one forward and
    backward (CommDebugMode's names; p2p is not among what it counts).

    Kept for the ranks at the same place in their tp, cp and ep groups (:func:`_position`), and for
    the same layout planned again (a widget, act_ckpt on and off): the dry run is done once for them.
    tests/test_planner.py compares every rank's plan with what that rank measured in a real run."""
    key = (cfg, dims, _position(dims, rank), tokens, dtype, run)
    if key not in _MEASURED:
        if len(_MEASURED) >= _MAX_MEASURED:
            _MEASURED.pop(next(iter(_MEASURED)))
        # the fake passes run in a forked child (sandbox.apart): a backward on fake tensors starts
        # autograd's device threads in a CUDA build of torch, after which no fork of this process (a
        # launched job's test rank, the grader's checks) could run a backward; the result is plain data
        _MEASURED[key] = _on_disk(key, lambda: apart.call(_measure_blocks, cfg, dims, rank, tokens, dtype, run,
                                                          seconds=600)) if run \
            else _measure_blocks(cfg, dims, rank, tokens, dtype, run)
    return _MEASURED[key]


# ------------------------------------------------------------------ the dry runs kept on disk
def cache_dir() -> Path:
    """Where dry runs are kept between processes: ``$DTRAIN_CACHE_DIR``, else ``~/.cache/dtrain_lab``
    (``$XDG_CACHE_HOME`` if set)."""
    root = os.environ.get("DTRAIN_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "dtrain_lab")
    return Path(root) / "dryrun"


_CODE_VERSION: str | None = None


def _code_version() -> str:
    """torch's version and the source of every module a dry run's result depends on: a cached result is
    used only by exactly the code that measured it."""
    global _CODE_VERSION
    if _CODE_VERSION is None:
        here = Path(__file__).resolve().parent
        h = hashlib.sha256(torch.__version__.encode())
        for path in sorted([*here.glob("*.py"), *(here.parent / "parallel").rglob("*.py")]):
            h.update(path.name.encode() + b"\0" + path.read_bytes())
        _CODE_VERSION = h.hexdigest()[:16]
    return _CODE_VERSION


def _on_disk(key: tuple, measure):
    """``measure()``, kept on disk under a hash of ``key`` and the code: the fake passes of a large
    layout take seconds, and a lesson, its other language and the tests ask for the same ones. Another
    process measuring the same key is waited for (a lock file), not repeated. Plain JSON only; any
    problem with the folder (read-only, full) only means measuring again."""
    import fcntl

    name = hashlib.sha256((repr(key) + _code_version()).encode()).hexdigest()[:32]
    folder = cache_dir()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        lock = open(folder / f"{name}.lock", "w")  # noqa: SIM115 - closed below
    except OSError:
        return measure()
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        path = folder / f"{name}.json"
        with contextlib.suppress(OSError, ValueError):
            return json.loads(path.read_text())
        value = measure()
        with contextlib.suppress(OSError, TypeError, ValueError):
            text = json.dumps(value)
            if json.loads(text) == value:             # only what JSON gives back unchanged
                tmp = folder / f"{name}.{os.getpid()}.tmp"
                tmp.write_text(text)
                os.replace(tmp, path)
        return value
    finally:
        lock.close()


def _measure_blocks(cfg: ModelConfig, dims: ParallelDims, rank: int, tokens: tuple[int, int], dtype,
                    run: bool) -> dict:
    kinds = {}
    for layer in range(cfg.n_layers):
        kinds.setdefault("moe" if is_moe_layer(cfg, layer) else "dense", layer)
    out = {}
    with fake_world(dims, rank) as g:
        for kind, layer in kinds.items():
            block = ParallelBlock(cfg, layer, tp=g["tp"], cp=g["cp"], ep=g["ep"], device="meta")
            expert_ids = {id(p) for m in block.modules() if isinstance(m, MoE) for p in (m.w1, m.w3, m.w2)}
            params = {"dense": sum(p.numel() for p in block.parameters() if id(p) not in expert_ids),
                      "expert": sum(p.numel() for p in block.parameters() if id(p) in expert_ids)}
            out[kind] = {"params": params}
            if not run:
                continue
            # the first block of a model without embedding gets data that needs no gradient: it saves less
            inputs = (True, False) if layer == 0 and not cfg.vocab else (True,)
            for ckpt in (False, True):
                for input_grad in inputs:
                    block = ParallelBlock(cfg, layer, tp=g["tp"], cp=g["cp"], ep=g["ep"], device="meta")
                    for m in block.modules():     # a fresh meta block for each pass
                        if isinstance(m, MoE):
                            m.balanced = True
                    out[kind].update(_fake_pass(block, cfg, tokens, dtype, ckpt, input_grad))
    return out


def _fake_pass(block, cfg: ModelConfig, tokens, dtype, ckpt: bool, input_grad: bool = True) -> dict:
    """One forward and backward of ``block`` on fake tensors: the bytes autograd saved (each tensor
    once, parameters excluded) and the collectives CommDebugMode counted."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed.tensor.debug import CommDebugMode
    from torch.utils.checkpoint import checkpoint

    saved: dict = {}
    block = block.to(dtype)                                     # still on the meta device
    with FakeTensorMode(allow_non_fake_inputs=True):
        block = block.to_empty(device="cpu")
        own = {p.untyped_storage()._cdata for p in block.parameters()}   # parameters and their views
        x = torch.empty(tokens[0], tokens[1], cfg.d_model, dtype=dtype, requires_grad=input_grad)

        storages: dict = {}

        def pack(t):
            st = t.untyped_storage()
            if st._cdata not in own:
                saved[_key(t)] = t.numel() * t.element_size()     # a view is counted by its own bytes
                storages[st._cdata] = st.nbytes()                 # memory: each storage once
            return t

        # the attention scores of a chunk pair, (..., n, n) with n = seq/(2·cp) (zig-zag chunks), and the
        # causal mask of a diagonal pair: temporaries of this course's unfused ring, which a fused
        # (flash) kernel keeps only as tiles; left out of peak_bytes_kept (ambiguous, so never left
        # out, when a chunk is as long as a head)
        chunk, head_dim = tokens[1] // 2, cfg.d_model // cfg.n_heads

        def scores(t) -> bool:
            return chunk != head_dim and t.dim() >= 2 and t.shape[-1] == t.shape[-2] == chunk

        transient = 0
        for _ in range(2):            # the second pass finds last pass's gradients and accumulates into them
            saved.clear()
            storages.clear()
            with CommDebugMode() as cdm, PeakMemory(block, exclude=scores) as mem:
                with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                    y = checkpoint(block, x, use_reentrant=False) if ckpt else block(x)
                saved_end = mem.now           # what the forward left alive: gradients, saved tensors, y
                with warnings.catch_warnings():   # CommDebugMode's module hooks, when x needs no gradient
                    warnings.filterwarnings("ignore", message="Full backward hook is firing")
                    y.backward(torch.empty_like(y))
                del y
            transient = max(transient, mem.peak - saved_end)
            peak = mem.peak - mem.start                       # the block's own high-water mark
            peak_kept = mem.peak_kept - mem.start             # the same without the score temporaries
    counts = {str(k).split(".")[-1]: v for k, v in cdm.get_comm_counts().items()}
    suffix = ("_ckpt" if ckpt else "") + ("" if input_grad else "_first")
    # transient: the most the block holds beyond what the forward left alive (the largest temporary
    # of its forward or backward, the output's gradient, a new gradient before it is added to .grad)
    return {"activation_bytes" + suffix: sum(saved.values()), "collectives" + suffix: counts,
            "transient_bytes" + suffix: max(0, transient), "saved_storage_bytes" + suffix: sum(storages.values()),
            "peak_bytes" + suffix: peak, "peak_bytes_kept" + suffix: peak_kept}
