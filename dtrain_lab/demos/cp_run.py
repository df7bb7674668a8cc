"""Lesson 13: ring attention (ours) against one process, and what PyTorch's context_parallel does on CPU.

    torchrun --standalone --nproc-per-node 2 -m dtrain_lab.demos.cp_run equal,torch
    torchrun --standalone --nproc-per-node 4 -m dtrain_lab.demos.cp_run equal,torch,ring

Parts (comma-separated first argument):

* ``equal`` — every rank draws the same full ``q, k, v`` (float64, ``(2, 2, S, 8)`` with
  ``S = 4·2p``) and the same upstream gradient, takes its shard (contiguous and zig-zag layouts),
  runs :func:`dtrain_lab.parallel.context.ring_attention` forward and backward, and reports the
  largest difference of its output rows and of its ``dq/dk/dv`` rows from plain attention on the whole
  sequence in one process (autograd), causal and not, and with grouped-query attention (2 query heads
  per K/V head, zig-zag, causal); also the sends, bytes and query-key products
  it counted, and the bytes :func:`~dtrain_lab.parallel.context.ring_comm_bytes` predicts.
* ``torch`` — the order of PyTorch's ``_HeadTailLoadBalancer`` (the load balancer
  ``context_parallel`` picks by default) against our zig-zag order, and what
  ``torch.distributed.tensor.experimental.context_parallel`` raises when causal SDPA runs inside it on
  CPU (type and first line of the message).
* ``ring`` — the bare ring that :func:`~dtrain_lab.parallel.context.ring_attention` runs inside (its
  ``_Ring``), with nothing around it: :func:`pass_around` hands a block to the right neighbour
  ``p − 1`` times with one ``batch_isend_irecv`` per step; each rank reports whose block it held at
  each step.
* ``overlap`` — wall time of a larger ring attention forward+backward with the K/V exchange posted
  before the compute and with it waited for first (not asserted: CPU timings under load).
"""
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

from dtrain_lab import caps
from dtrain_lab.jobs import runtime
from dtrain_lab.parallel.context import (attention_reference, ring_attention, ring_comm_bytes, shard_sequence,
                                         zigzag_order)


def _full(seq: int, dtype=torch.float64, seed: int = 0, heads: int = 2, kv_heads: int = 2):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(2, h, seq, 8, generator=g, dtype=dtype)
            for h in (heads, kv_heads, kv_heads, heads)]                   # q, k, v, dout


def part_equal() -> dict:
    rt = runtime.current()
    p, r = rt.world_size, rt.rank
    seq = 4 * 2 * p
    out = {}
    cases = [(layout, causal, 2) for layout in ("contiguous", "zigzag") for causal in (True, False)]
    for layout, causal, kv_heads in cases + [("zigzag", True, 1)]:      # the last: grouped-query, 2 q heads per K/V head
        q, k, v, dout = _full(seq, kv_heads=kv_heads)
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        ref = attention_reference(*leaves, causal=causal)
        ref.backward(dout)
        local = [shard_sequence(t, r, p, layout).requires_grad_() for t in (q, k, v)]
        stats: dict = {}
        o = ring_attention(*local, causal=causal, layout=layout, stats=stats)
        o.backward(shard_sequence(dout, r, p, layout))

        def diff(a, b, layout=layout):
            return (a - shard_sequence(b, r, p, layout)).abs().max().item()

        out[f"{layout}_{'causal' if causal else 'full'}" + ("_gqa" if kv_heads == 1 else "")] = {
            "out": diff(o.detach(), ref.detach()),
            "grads": [diff(a.grad, b.grad) for a, b in zip(local, leaves)],
            "grad_norm": max(b.grad.abs().max().item() for b in leaves),
            **stats, "formula": ring_comm_bytes(2, kv_heads, seq, 8, p, bytes_per_elem=8)}
    return out


def pass_around(block: torch.Tensor) -> list[torch.Tensor]:
    """The ring of ring attention, bare: every rank sends its block right and receives from the left,
    p − 1 times; returns the blocks it held, its own first (step s: the block of rank r − s)."""
    rank, p = dist.get_rank(), dist.get_world_size()
    held = [block]
    for _ in range(p - 1):
        recv = torch.empty_like(block)
        reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, held[-1], (rank + 1) % p),   # to the right
                                       dist.P2POp(dist.irecv, recv, (rank - 1) % p)])      # from the left
        # ring attention computes on held[-1] here, while the exchange is under way
        for req in reqs:
            req.wait()
        held.append(recv)
    return held


def part_ring() -> dict:
    rank = dist.get_rank()
    held = pass_around(torch.full((2, 3), float(rank)))      # a stand-in for this rank's K/V block
    return {"held": [int(b[0, 0]) for b in held]}


def part_torch() -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.experimental import context_parallel
    from torch.distributed.tensor.experimental._context_parallel import _HeadTailLoadBalancer

    rt = runtime.current()
    p = rt.world_size
    seq = 16
    theirs = _HeadTailLoadBalancer(seq, p, "cpu")._generate_indices().reshape(-1).tolist()
    mesh = init_device_mesh("cpu", (p,), mesh_dim_names=("cp",))
    q, k, v, _ = _full(seq, torch.float32)
    raised, inside = None, None
    try:
        with context_parallel(mesh, buffers=[q, k, v], buffer_seq_dims=[2, 2, 2]):
            inside = q.shape[2]                   # the buffers are sharded in place inside the context
            F.scaled_dot_product_attention(q, k, v, is_causal=True)
    except Exception as e:  # noqa: BLE001 - we report whatever it raises, that is the point
        raised = {"type": type(e).__name__, "message": str(e).splitlines()[0]}
    return {"torch_order": theirs, "our_order": zigzag_order(seq, p).tolist(), "raised": raised,
            "local_seq_inside": inside}


def part_overlap(repeats: int = 3) -> dict:
    rt = runtime.current()
    p, r = rt.world_size, rt.rank
    seq = 256 * p
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 4, seq, 64, generator=g) for _ in range(3))
    local = [shard_sequence(t, r, p, "zigzag") for t in (q, k, v)]
    times = {}
    for overlap in (True, False) * repeats:
        xs = [t.clone().requires_grad_() for t in local]
        dist.barrier()
        t0 = time.perf_counter()
        ring_attention(*xs, overlap=overlap).sum().backward()
        times.setdefault(str(overlap), []).append(time.perf_counter() - t0)
    return {k: min(v) for k, v in times.items()}


def main() -> None:
    parts = (sys.argv[1] if len(sys.argv) > 1 else "equal").split(",")
    if not caps.have("cuda"):
        torch.set_num_threads(1)   # ranks share the machine's cores
    rt = runtime.current()
    result = {"backend": rt.backend, "world_size": rt.world_size, "rank": rt.rank}
    if "equal" in parts:
        result["equal"] = part_equal()
    if "torch" in parts:
        result["torch"] = part_torch()
    if "ring" in parts:
        result["ring"] = part_ring()
    if "overlap" in parts:
        result["overlap"] = part_overlap()
    runtime.report(**result)


if __name__ == "__main__":
    runtime.entrypoint(main)
