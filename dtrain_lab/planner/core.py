"""Plan a training job of any size on a laptop: memory per rank, communication per dimension, step time.

:func:`plan` takes a model (a preset of ``presets.toml`` or a :class:`ModelConfig`), a layout
(world size, dp × tp × pp × cp with ep borrowing dp × cp, a ZeRO stage, micro-batching, activation
checkpointing) and a machine (peak FLOP/s, HBM, NVLink and network bandwidths), and returns a
:class:`Plan` whose :meth:`Plan.to_dict` is what ``dtrain-lab plan --json`` prints.

Where each figure comes from:

* **Parameters per rank**: counted on the meta device from the block class the real runs use
  (:mod:`dtrain_lab.planner.dryrun`); embeddings and head (``vocab · d`` each, split over tp as
  Megatron's vocab-parallel layers) by formula.
* **Model states**: :func:`dtrain_lab.perfmodel.zero_memory` (ZeRO paper, section 5) for the dense
  parameters over the ``dp · cp`` ranks that hold them and the expert parameters over ``edp``.
* **Activations**: what autograd saves in one block for one micro-batch, measured under
  FakeTensorMode, times the block's layers, times the micro-batches in flight (1 without PP; 1F1B
  stage ``s`` holds ``min(pp − s, m)``). With activation checkpointing a block keeps its input, and
  the block being recomputed its full activations.
* **Communication** per step and rank: calls and payload bytes (what each call is given) of the
  implementations of this course, per dimension — formulas next to each line below, checked against
  real runs by ``tests/test_planner.py``; bytes on the wire from the ring formulas
  (:func:`dtrain_lab.comm.counted.wire_bytes`); seconds from the α-β model
  (:func:`dtrain_lab.perfmodel.collective_time`) on NVLink when a group fits in one node, else on the
  network.
* **Time**: a roofline per layer (``max(FLOPs / peak, bytes / HBM bandwidth)``), the exposed
  communication, and the 1F1B schedule ``(m + pp − 1)`` micro-batch slots (the bubble).
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field

import torch

from dtrain_lab.comm.counted import wire_bytes
from dtrain_lab.i18n import LabError, tr
from dtrain_lab.parallel.compose import ModelConfig, ParallelBlock, is_moe_layer
from dtrain_lab.parallel.dims import ParallelDims
from dtrain_lab.perfmodel import collective_time, zero_memory
from dtrain_lab.planner.dryrun import measure_blocks
from dtrain_lab.planner.presets import Hardware, ModelSpec, hardware_preset, model_preset
from dtrain_lab.planner.schedule import SPLITS, chunk_sizes, pp_warmup, sched_chunk_layers, stage_layers

__all__ = ["plan", "Plan", "stage_layers", "chunk_sizes", "PRECISIONS", "DIMS", "SPLITS"]

PRECISIONS = {"mixed": (2, 2, 2), "fp32": (4, 4, 4)}     # bytes of (params, grads, activations)
DIMS = ("tp", "cp", "ep", "pp", "dp", "edp")
_HEADER_BYTES = 80                                      # the pipeline executor's 10-int64 shape header


@dataclass
class Plan:
    model: dict
    hardware: dict
    layout: dict
    memory: dict
    comm: dict
    time: dict
    dry_run: dict | None
    assumptions: list = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"model": self.model, "hardware": self.hardware, "layout": self.layout, "memory": self.memory,
                "comm": self.comm, "time": self.time, "dry_run": self.dry_run, "assumptions": self.assumptions}


def _int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise LabError("dims_bad_factor", name=name, value=value)
    return value


def _layout(world_size, tp, pp, cp, ep, dp) -> ParallelDims:
    world_size = _int("world_size", world_size)
    for name, v in (("tp", tp), ("pp", pp), ("cp", cp), ("ep", ep)):
        _int(name, v)
    if dp is None:
        if world_size % (tp * pp * cp):
            raise LabError("plan_world_factor", world=world_size, tp=tp, pp=pp, cp=cp, rest=tp * pp * cp)
        dp = world_size // (tp * pp * cp)
    return ParallelDims(dp=dp, tp=tp, pp=pp, world_size=world_size, cp=cp, ep=ep)


def _full_params(cfg: ModelConfig) -> int:
    """Every parameter of the model, counted on the meta device (no process group: nothing split)."""
    per_kind = {}
    total = 2 * cfg.vocab * cfg.d_model + (cfg.d_model if cfg.vocab else 0)   # embedding, head, final norm
    for layer in range(cfg.n_layers):
        kind = is_moe_layer(cfg, layer)
        if kind not in per_kind:
            per_kind[kind] = sum(p.numel() for p in ParallelBlock(cfg, layer, device="meta").parameters())
        total += per_kind[kind]
    return total


def _balanced_counts(tokens: int, cfg: ModelConfig) -> list[int]:
    """Assignments per expert under balanced routing (as ``MoE._balanced``), capped by the capacity."""
    n, e = tokens * cfg.top_k, cfg.n_experts
    cap = n if cfg.capacity_factor is None else math.ceil(cfg.capacity_factor * n / e)
    return [min(len(range(ex, n, e)), cap) for ex in range(e)]


def _link(dims: ParallelDims, rank: int, dim: str, hw: Hardware) -> tuple[str, float, float]:
    grp = dims.group_of(rank, "dp_cp" if dim == "dp" else dim)
    inside = len({r // hw.gpus_per_node for r in grp}) == 1
    return ("nvlink", hw.nvlink_alpha_s, 1 / hw.nvlink_bytes_per_s) if inside else \
        ("network", hw.network_alpha_s, 1 / hw.network_bytes_per_s)


def _op(op: str, calls: int, payload: float, p: int, link: tuple, *, wire: float | None = None,
        whole_per_call: float | None = None) -> dict:
    """``calls`` of ``op`` handing over ``payload`` bytes in all, in a group of ``p`` ranks on ``link``:
    bytes on the wire (ring formulas unless given) and seconds (α-β, :func:`collective_time`)."""
    name, alpha, beta = link
    if calls == 0 or p == 1:
        return {"op": op, "calls": 0, "payload_bytes": 0, "wire_bytes": 0, "seconds": 0.0}
    each = payload / calls                       # α-β and the ring formulas are linear in the bytes
    whole = each if whole_per_call is None else whole_per_call
    seconds = calls * collective_time("send_recv" if op == "send" else op, whole, p, alpha, beta)
    return {"op": op, "calls": calls, "payload_bytes": payload,
            "wire_bytes": calls * wire_bytes(op, each, p) if wire is None else wire, "seconds": seconds}


def _dim(p: int, link: tuple, *ops: dict) -> dict:
    ops = [o for o in ops if o["calls"]]
    return {"calls": sum(o["calls"] for o in ops), "payload_bytes": sum(o["payload_bytes"] for o in ops),
            "wire_bytes": sum(o["wire_bytes"] for o in ops), "seconds": sum(o["seconds"] for o in ops),
            "group_size": p, "link": link[0], "ops": ops}


def plan(model: str | ModelConfig = "llama3-8b", *, world_size: int, tp: int = 1, pp: int = 1, cp: int = 1,
         ep: int = 1, dp: int | None = None, zero: int = 1, seq_len: int | None = None, micro_batch: int = 1,
         microbatches: int | None = None, act_ckpt: bool = False, precision: str = "mixed",
         hardware: str = "h100", nvlink_gbps: float | None = None, network_gbps: float | None = None,
         gpus_per_node: int | None = None, rank: int = 0, dry_run: bool = True, efficiency: float | None = None,
         virtual_stages: int = 1, stage_split: str = "even", grads_resident: bool = False) -> Plan:
    """The plan of one rank (``rank``, default 0) of the layout; see the module docstring.

    ``dp`` defaults to ``world_size / (tp · pp · cp)``; ``microbatches`` (per step and pipeline) to
    ``2·pp`` with pipelining, else 1; link bandwidths in GB/s (1e9 bytes/s, each direction) override the
    hardware preset's. ``dry_run=False`` skips the FakeTensorMode run (no activation figures).

    ``efficiency`` (0 < e ≤ 1): the fraction of peak FLOP/s the matmuls reach; the time block always holds
    the roofline at e = 1 (``step_s``, ``mfu``: a bound, the shortest step and highest MFU of this model)
    and, given an efficiency, ``time["estimate"]`` at e. ``virtual_stages`` v > 1: interleaved 1F1B with v
    model chunks per stage (Narayanan et al. 2021, section 2.2.2). ``stage_split="llama3"``: one layer fewer
    on the first and the last chunk (Dubey et al. 2024, section 3.3.2). ``grads_resident``: gradients
    allocated up front (DDP buckets, Megatron's grad buffers) instead of at the first backward."""
    spec = model_preset(model) if isinstance(model, str) else ModelSpec("custom", model, seq_len, "-")
    hw = hardware_preset(hardware)
    overrides = {"nvlink_bytes_per_s": nvlink_gbps and nvlink_gbps * 1e9,
                 "network_bytes_per_s": network_gbps and network_gbps * 1e9, "gpus_per_node": gpus_per_node}
    for name, value in overrides.items():
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise LabError("plan_bad_number", name=name, value=value)
            hw = Hardware(**{**hw.__dict__, name: type(getattr(hw, name))(value)})
    dims = _layout(world_size, tp, pp, cp, ep, dp)
    if isinstance(zero, bool) or zero not in (0, 1, 2, 3):
        raise LabError("zero_bad_stage", value=zero)
    if precision not in PRECISIONS:
        raise LabError("zero_bad_precision", value=precision, choices=", ".join(PRECISIONS))
    dims._check_rank(rank)
    if efficiency is not None and (isinstance(efficiency, bool) or not isinstance(efficiency, (int, float))
                                   or not 0 < efficiency <= 1):
        raise LabError("plan_bad_efficiency", value=efficiency)
    v = _int("virtual_stages", virtual_stages)
    if v > 1 and pp == 1:
        raise LabError("plan_virtual_needs_pp", v=v)
    if stage_split not in SPLITS:
        raise LabError("plan_bad_split", value=stage_split, choices=", ".join(SPLITS))
    sched = (v, stage_split)
    m = _int("microbatches", microbatches if microbatches is not None else (2 * pp if pp > 1 else 1))
    mb = _int("micro_batch", micro_batch)
    bp, bg, ba = PRECISIONS[precision]
    stage = dims.coordinate(rank)["pp"]
    layout = {"world_size": dims.world_size, "dp": dims.dp, "tp": tp, "pp": pp, "cp": cp, "ep": ep, "edp": dims.edp,
              "zero": zero, "micro_batch": mb, "microbatches": m, "act_ckpt": bool(act_ckpt),
              "precision": precision, "rank": rank, "stage": stage, "virtual_stages": v, "stage_split": stage_split,
              "grads_resident": bool(grads_resident), "efficiency": efficiency}
    hw_dict = dict(hw.__dict__)
    if spec.config is None:                       # a parameter count only (the ZeRO paper's 7.5B)
        return _states_only(spec, dims, zero, precision, layout, hw_dict)
    cfg = spec.config
    seq = _int("seq_len", seq_len if seq_len is not None else spec.seq_len)
    dims.check_model(n_layers=cfg.n_layers, n_heads=cfg.n_heads, n_kv_heads=cfg.n_kv_heads, seq_len=seq,
                     n_experts=cfg.n_experts)
    layout["seq_len"] = seq
    sizes = chunk_sizes(cfg.n_layers, pp, v, stage_split)
    if min(sizes) < 0 or any(not stage_layers(cfg.n_layers, pp, st, *sched) for st in range(pp)) \
            or (stage_split == "even" and min(sizes) < 1):
        raise LabError("plan_chunks_too_many", layers=cfg.n_layers, pp=pp, v=v, split=stage_split)
    tokens = mb * seq // cp                       # tokens of one micro-batch on this rank
    dtype = torch.bfloat16 if precision == "mixed" else torch.float32
    measured = copy.deepcopy(measure_blocks(cfg, dims, rank, (mb, seq // cp), dtype, run=dry_run))
    per_stage = [_stage_memory(cfg, dims, s, measured, tokens, m, zero, precision, act_ckpt, ba, sched,
                               grads_resident) for s in range(pp)]
    mem = dict(per_stage[stage])
    mem["per_stage"] = per_stage
    mem["capacity"] = hw.memory_bytes
    mem["fits"] = all(st["peak"] <= hw.memory_bytes for st in per_stage) if dry_run else None
    comm = _comm(cfg, dims, rank, stage, tokens, seq, mb, m, zero, act_ckpt, (bp, bg, ba), hw, measured, sched)
    args = (cfg, dims, rank, stage, tokens, seq, mb, m, act_ckpt, comm, hw, bp, ba, measured, sched)
    timing = _time(*args)                                     # the roofline: a bound
    timing["estimate"] = None if efficiency is None else _time(*args, efficiency=efficiency)
    model_dict = {"name": spec.name, "source": spec.source, "params": _full_params(cfg), "config": dict(cfg.__dict__)}
    return Plan(model_dict, hw_dict, layout, mem, comm, timing, measured,
                _assumptions(cfg, dims, hw, act_ckpt, precision, zero, sched, grads_resident))


def _states_only(spec: ModelSpec, dims, zero, precision, layout, hw_dict) -> Plan:
    n = dims.dp * dims.cp
    z = zero_memory(spec.params / (dims.tp * dims.pp), zero, n, precision=precision)
    mem = {"params": z["params"], "grads": z["grads"], "optimizer": z["optimizer"], "activations": None,
           "peak": None, "model_states": z["total"], "capacity": hw_dict["memory_bytes"], "fits": None}
    return Plan({"name": spec.name, "source": spec.source, "params": spec.params, "config": None}, hw_dict, layout,
                mem, {}, {}, None, [tr("plan_assume_states_only")])


def _collectives(measured, kind: str, name: str, act_ckpt: bool, formula: int) -> int:
    """Calls of collective ``name`` in one block pass, as the dry run counted them (else ``formula``)."""
    entry = (measured or {}).get(kind, {})
    counted = entry.get("collectives_ckpt" if act_ckpt else "collectives")
    return formula if counted is None else counted.get(name, 0)


def _stage_params(cfg, dims, s, measured, sched) -> tuple[list[int], list[int], int]:
    """This rank's dense parameters per block of stage ``s``, expert parameters per MoE block, and the
    rest (vocab-parallel embedding on the first stage, head and final norm on the last)."""
    kinds = ["moe" if is_moe_layer(cfg, layer) else "dense" for layer in stage_layers(cfg.n_layers, dims.pp, s, *sched)]
    vocab_shard = cfg.vocab * cfg.d_model // dims.tp
    rest = (vocab_shard if s == 0 else 0) + ((vocab_shard + cfg.d_model) if s == dims.pp - 1 and cfg.vocab else 0)
    return ([measured[k]["params"]["dense"] for k in kinds],
            [measured[k]["params"]["expert"] for k in kinds if k == "moe"], rest)


def _stage_memory(cfg, dims, s, measured, tokens, m, zero, precision, act_ckpt, ba, sched, resident) -> dict:
    kinds = ["moe" if is_moe_layer(cfg, layer) else "dense" for layer in stage_layers(cfg.n_layers, dims.pp, s, *sched)]
    last = s == dims.pp - 1
    blocks, experts, rest = _stage_params(cfg, dims, s, measured, sched)
    dense, expert = sum(blocks) + rest, sum(experts)
    zd = zero_memory(dense, zero, dims.dp * dims.cp, precision=precision)
    ze = zero_memory(expert, zero, dims.edp, precision=precision) if expert else {"params": 0, "grads": 0, "optimizer": 0}
    out = {"stage": s, "layers": len(kinds), "dense_params": dense, "expert_params": expert,
           "params": zd["params"] + ze["params"], "grads": zd["grads"] + ze["grads"],
           "optimizer": zd["optimizer"] + ze["optimizer"]}
    if measured[kinds[0]].get("activation_bytes") is None:
        out.update(activations=None, peak=None)
        return out
    # what one micro-batch leaves saved: the blocks, then the stage's end: the output the pipeline
    # executor keeps for the next stage's gradient, or the loss's inputs (MSE: output and target;
    # with a vocabulary: final norm input, head input and fp32 logits for the cross-entropy)
    act = tokens * cfg.d_model * ba
    if not last:
        end = act
    elif cfg.vocab:
        end = 2 * act + tokens * (cfg.vocab // dims.tp) * 4
    else:
        end = 2 * act
    v = sched[0]
    # chunk micro-batches in flight at the high-water mark (a chunk: 1/v of the stage's layers). 1F1B:
    # stage s runs pp − s − 1 warm-up forwards, then one more before its first backward: min(pp − s, m).
    # Interleaved (Megatron-LM's schedule): 2·(pp − s − 1) + (v − 1)·pp warm-up chunk forwards, plus one
    units = 1 if dims.pp == 1 else min(pp_warmup(dims.pp, s, v, m) + 1, m * v)
    chunk = len(sched_chunk_layers(cfg.n_layers, dims.pp, s, *sched))   # layers of the stage's last chunk

    def per_block(name: str, suffix: str) -> list[int]:
        vals = [measured[kind][name + suffix] for kind in kinds]
        if s == 0 and not cfg.vocab:                      # the first block's input is data: no gradient
            vals[0] = measured[kinds[0]][name + suffix + "_first"]
        return vals

    def held(n: int, suffix: str, peak: str = "peak_bytes") -> int:
        """Bytes of activations while ``n`` chunk micro-batches are in flight and the newest runs its
        high-water mark: n − 1 earlier ones whole (each saved tensor's storage once, plus the output each
        chunk keeps for the next stage; 1/v of the stage's blocks each), and the current one in its last
        block: the chunk's other blocks' saved tensors and that block's own peak (saved tensors, output and
        its gradient, temporaries, a gradient before it is added to .grad).
        ``peak="peak_bytes_kept"``: that block's peak without the attention-score temporaries."""
        if n == 0:
            return 0
        saved = per_block("saved_storage_bytes", suffix)
        mb_bytes = sum(saved) + (v - (1 if last else 0)) * act       # one micro-batch through all v chunks
        current = sum(saved[len(saved) - chunk:-1]) + per_block(peak, suffix)[-1] + (act if last else 0)
        return round((n - 1) * mb_bytes / v) + current

    out.update(in_flight=units / v, chunks_in_flight=units,
               activations_per_microbatch=sum(per_block("activation_bytes", "")) + end)
    suffix = "_ckpt" if act_ckpt else ""
    # The moments of the schedule, gradients allocated at the first backward (plain autograd's .grad,
    # zero_grad(set_to_none=True)) unless resident from the start (DDP buckets, Megatron's grad buffers):
    #  "first":  the first backward, `units` in flight, no gradients yet;
    #  "after":  the backwards after it, gradients resident, one chunk micro-batch fewer (cool-down);
    #  "steady": when forwards follow a backward (m·v > units: 1F1B steady state, or a later micro-batch of
    #            gradient accumulation), `units` in flight again, gradients resident.
    if resident:
        moments = {"resident": (units, True)}
    elif m * v > units:
        moments = {"steady": (units, True)}
    else:
        moments = {"first": (units, False), "after": (units - 1, True)}
    states = out["params"] + out["optimizer"]

    def at(n: int, with_grads: bool, kind: str, peak: str = "peak_bytes") -> int:
        return states + (out["grads"] if with_grads else 0) + held(n, kind, peak)

    out["moments"] = {name: at(n, g, suffix) for name, (n, g) in moments.items()}
    out["moments_in_flight"] = {name: n / v for name, (n, g) in moments.items()}
    name = max(out["moments"], key=out["moments"].get)
    n_peak, g_peak = moments[name]
    out.update(peak_moment=name, peak_in_flight=n_peak / v, peak_grads=out["grads"] if g_peak else 0,
               activations_no_ckpt=held(n_peak, ""), activations_ckpt=held(n_peak, "_ckpt"))
    out["activations"] = out["activations_ckpt"] if act_ckpt else out["activations_no_ckpt"]
    # the same high-water mark if attention were a fused kernel that never holds a chunk pair's scores
    out["activations_fused"] = held(n_peak, suffix, "peak_bytes_kept")
    out["peak"] = out["moments"][name]
    out["peak_fused"] = max(at(n, g, suffix, "peak_bytes_kept") for n, g in moments.values())
    return out


def _comm(cfg, dims, rank, s, tokens, seq, mb, m, zero, act_ckpt, nbytes, hw, measured, sched) -> dict:
    bp, bg, ba = nbytes
    layers = stage_layers(cfg.n_layers, dims.pp, s, *sched)
    n_moe = sum(is_moe_layer(cfg, layer) for layer in layers)
    n, r, d = len(layers), (2 if act_ckpt else 1), cfg.d_model
    first, last = s == 0, s == dims.pp - 1
    link = {dim: _link(dims, rank, dim, hw) for dim in ("tp", "cp", "ep", "pp", "dp", "edp")}
    out = {}
    # TP (lesson 07's f and g): per block and micro-batch 2 All-Reduces of (tokens, d) forward and 2
    # backward; with checkpointing the recomputation stops at the last tensor backward needs
    # (torch.utils.checkpoint's early stop), which re-runs the attention's g but not the MLP's: 5.
    # Counts come from the dry run (CommDebugMode) when there is one. A vocab-parallel embedding adds 1
    # forward, the head 1 backward and its cross-entropy 3 small ones forward (tokens fp32 each)
    per_block = {kind: _collectives(measured, kind, "allreduce_", act_ckpt, 4 + (1 if act_ckpt else 0))
                 for kind in ("dense", "moe")}
    calls = m * sum(per_block["moe" if is_moe_layer(cfg, x) else "dense"] for x in layers) if dims.tp > 1 else 0
    payload = calls * tokens * d * ba
    extra = []
    if cfg.vocab and dims.tp > 1:
        k = (1 if first else 0) + (1 if last else 0)
        calls, payload = calls + m * k, payload + m * k * tokens * d * ba
        if last:
            extra.append(_op("all_reduce", 3 * m, 3 * m * tokens * 4, dims.tp, link["tp"]))
    out["tp"] = _dim(dims.tp, link["tp"], _op("all_reduce", calls, payload, dims.tp, link["tp"]), *extra)
    # CP (ring attention): per block and micro-batch, forward cp−1 K/V blocks (again when recomputed),
    # backward cp−1 K/V blocks and cp dK/dV blocks; a block is 2 · mb · kv_heads/tp · seq/cp · head_dim
    block = 2 * mb * (cfg.n_kv_heads // dims.tp) * (seq // dims.cp) * cfg.head_dim * ba
    calls = m * n * ((dims.cp - 1) * r + 2 * dims.cp - 1) if dims.cp > 1 else 0
    out["cp"] = _dim(dims.cp, link["cp"], _op("send", calls, calls * block, dims.cp, link["cp"]))
    # EP (MoE, balanced routing): per MoE block and micro-batch 3 All-to-Alls forward (the E counts,
    # dispatch of the kept rows, combine of the received rows; again when recomputed) and 2 backward
    ops = []
    if n_moe and dims.ep > 1:
        counts = _balanced_counts(tokens, cfg)
        kept, grp = sum(counts), dims.group_of(rank, "ep")
        per = cfg.n_experts // dims.ep
        mine = sum(counts[grp.index(rank) * per:(grp.index(rank) + 1) * per])
        recv = dims.ep * mine                           # every rank of the group sends me the same counts
        rows = (kept + recv) * d * ba
        calls = m * n_moe * _collectives(measured, "moe", "alltoall_base_", act_ckpt, 3 * r + 2)
        payload = m * n_moe * (r * (cfg.n_experts * 8 + rows) + rows)
        wire = m * n_moe * (r * (cfg.n_experts * 8 * (dims.ep - 1) / dims.ep + rows - 2 * mine * d * ba)
                            + rows - 2 * mine * d * ba)
        ops.append(_op("all_to_all", calls, payload, dims.ep, link["ep"], wire=wire))
    out["ep"] = _dim(dims.ep, link["ep"], *ops)
    # PP (our executor): per micro-batch and chunk an activation forward (after a 10-int64 shape header)
    # unless the model's last chunk, a gradient backward unless its first; (tokens, d) each. Interleaved,
    # a micro-batch crosses every stage v times (the last stage's chunks send on to stage 0)
    act = tokens * d * ba
    v = sched[0]
    fwd, bwd = m * (v - (1 if last else 0)), m * (v - (1 if first else 0))
    calls = 2 * fwd + bwd
    payload = fwd * (_HEADER_BYTES + act) + bwd * act
    out["pp"] = _dim(dims.pp, link["pp"], _op("send", calls, payload, dims.pp, link["pp"]))
    # DP over dp × cp (dense) and edp (experts): one flat buffer per step (ZeRO 0: All-Reduce of the
    # gradients; 1 and 2: Reduce-Scatter of the gradients, All-Gather of the updated parameters),
    # ZeRO 3 per block and micro-batch: All-Gather forward (again when recomputed) and backward,
    # Reduce-Scatter of its gradients
    blocks, experts, rest = _stage_params(cfg, dims, s, measured, sched)
    for dim, p, units in (("dp", dims.dp * dims.cp, blocks + ([rest] if rest else [])), ("edp", dims.edp, experts)):
        numel = sum(units)
        ops = []
        if numel and p > 1:
            padded = math.ceil(numel / p) * p
            if zero == 0:
                ops.append(_op("all_reduce", 1, numel * bg, p, link[dim]))
            elif zero in (1, 2):
                ops += [_op("reduce_scatter", 1, padded * bg, p, link[dim]),
                        _op("all_gather", 1, padded // p * bp, p, link[dim], whole_per_call=padded * bp)]
            else:
                ag = [math.ceil(u / p) * bp for u in units]
                ops += [_op("all_gather", m * len(units) * (r + 1), m * (r + 1) * sum(ag), p, link[dim],
                            whole_per_call=sum(ag) * p / len(units)),
                        _op("reduce_scatter", m * len(units), m * sum(math.ceil(u / p) * p * bg for u in units),
                            p, link[dim])]
        out[dim] = _dim(p, link[dim], *ops)
    return out


def _time(cfg, dims, rank, s, tokens, seq, mb, m, act_ckpt, comm, hw, bp, ba, measured, sched,
          efficiency: float = 1.0) -> dict:
    """Roofline per block pass at ``efficiency`` of peak FLOP/s (1: the bound), exposed communication,
    and the (interleaved) 1F1B schedule."""
    flops_s = hw.peak_flops * efficiency
    h, kv, hd, d = cfg.n_heads // dims.tp, cfg.n_kv_heads // dims.tp, cfg.head_dim, cfg.d_model
    attn_params = (2 * h + 2 * kv) * hd * d
    pairs = mb * h * seq * (seq + 1) / 2 / dims.cp          # causal query-key pairs (zig-zag: balanced)
    attn_flops = 2 * tokens * attn_params + 4 * hd * pairs
    counts = _balanced_counts(tokens, cfg) if cfg.n_experts else []
    forward = backward = attn = model_flops = 0.0
    for layer in stage_layers(cfg.n_layers, dims.pp, s, *sched):
        kind = "moe" if is_moe_layer(cfg, layer) else "dense"
        p = measured[kind]["params"]["dense"] + measured[kind]["params"]["expert"]
        if kind == "moe":
            per = cfg.n_experts // dims.ep
            i = dims.group_of(rank, "ep").index(rank)
            rows = dims.ep * sum(counts[i * per:(i + 1) * per])
            flops = attn_flops + 2 * tokens * d * cfg.n_experts + 2 * rows * 3 * d * cfg.ffn_hidden
        else:
            flops = attn_flops + 2 * tokens * 3 * d * (cfg.ffn_hidden // dims.tp)
        acts = measured[kind].get("activation_bytes") or 0
        t_f = max(flops / flops_s, (p * bp + acts) / hw.hbm_bytes_per_s)
        t_b = max(2 * flops / flops_s, 2 * (p * bp + acts) / hw.hbm_bytes_per_s)
        forward += t_f * (2 if act_ckpt else 1)
        backward += t_b
        attn += 3 * 4 * hd * pairs / flops_s
        model_flops += 3 * flops                              # forward + backward; recomputation not counted
    compute = forward + backward                              # one micro-batch on this stage
    exposed = sum(comm[dim]["seconds"] for dim in ("tp", "ep", "pp")) / m \
        + max(0.0, comm["cp"]["seconds"] / m - attn)          # ring sends hide behind the attention
    slot = compute + exposed
    v = sched[0]
    slots = m + (dims.pp - 1) / v                             # interleaved: the bubble is (pp − 1)/v slots
    dp_s = comm["dp"]["seconds"] + comm["edp"]["seconds"]
    dp_exposed = max(0.0, dp_s - backward)                    # overlapped with the last backward
    step = slots * slot + dp_exposed
    tokens_step = dims.dp * m * mb * seq
    return {"efficiency": efficiency, "compute_s": m * compute, "exposed_comm_s": m * exposed + dp_exposed,
            "bubble": (dims.pp - 1) / v / slots, "step_s": step, "tokens_per_step": tokens_step,
            "tokens_per_s": tokens_step / step, "model_flops": m * model_flops,
            "mfu": m * model_flops / (step * hw.peak_flops)}


def _assumptions(cfg, dims, hw, act_ckpt, precision, zero, sched, resident) -> list[str]:
    v, split = sched
    keys = [("plan_assume_precision" if precision == "mixed" else "plan_assume_fp32", {}),
            ("plan_assume_activations", {}),
            ("plan_assume_schedule" if v == 1 else "plan_assume_interleaved",
             {"v": v, "split": tr({"even": "plan_split_even", "llama3": "plan_split_llama3"}[split])}),
            ("plan_assume_grads_resident" if resident else "plan_assume_grads_lazy", {}),
            ("plan_assume_overlap", {}), ("plan_assume_roofline", {"peak": hw.peak_flops / 1e12,
                                                                    "hbm": hw.hbm_bytes_per_s / 1e12}),
            ("plan_assume_links", {"gpn": hw.gpus_per_node, "nvlink": hw.nvlink_bytes_per_s / 1e9,
                                   "net": hw.network_bytes_per_s / 1e9, "a1": hw.nvlink_alpha_s * 1e6,
                                   "a2": hw.network_alpha_s * 1e6}),
            ("plan_assume_zero", {"stage": zero}), ("plan_assume_no_sp", {})]
    if cfg.vocab:
        keys.append(("plan_assume_vocab", {}))
    if cfg.n_experts:
        keys.append(("plan_assume_routing", {}))
    if act_ckpt:
        keys.append(("plan_assume_ckpt", {}))
    return [tr(k, **f) for k, f in keys]
