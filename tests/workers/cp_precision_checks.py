"""Ring attention in bf16 against float64: launched by tests/test_context_parallel.py at 2 and 3 ranks.

Every rank draws the same full ``q, k, v`` and upstream gradient, rounds them to bf16, and computes
its own reference here (not in a lesson program): autograd through plain attention on the whole
sequence in float64, from the same bf16-rounded values. It then runs ``ring_attention`` on its bf16
shard twice: as shipped (accumulation in float32) and with the accumulation forced to bf16
(``_acc_dtype``, what the ring did before), and reports, for the output and ``dq, dk, dv``, the largest
error divided by the largest magnitude of the reference; also the bytes the ring sent.
"""
import torch

from dtrain_lab.jobs import runtime
from dtrain_lab.parallel.context import attention_reference, ring_attention, shard_sequence

CASES = {"zigzag_causal": ("zigzag", True, True), "contiguous_full_no_overlap": ("contiguous", False, False)}
SHAPE = (1, 2, 16, 32)   # (batch, heads, seq per rank, head_dim)


def main() -> None:
    torch.set_num_threads(1)
    rt = runtime.current()
    p, r = rt.world_size, rt.rank
    b, h, n, d = SHAPE
    g = torch.Generator().manual_seed(7)
    q, k, v, dout = (torch.randn(b, h, n * p, d, generator=g).bfloat16() for _ in range(4))
    out = {}
    for name, (layout, causal, overlap) in CASES.items():
        leaves = [t.double().requires_grad_() for t in (q, k, v)]
        ref = attention_reference(*leaves, causal=causal)
        ref.backward(dout.double())
        refs = [ref.detach()] + [t.grad for t in leaves]
        case = {}
        for acc in ("float32", "bfloat16"):
            local = [shard_sequence(t, r, p, layout).requires_grad_() for t in (q, k, v)]
            stats: dict = {}
            o = ring_attention(*local, causal=causal, layout=layout, overlap=overlap, stats=stats,
                               _acc_dtype=None if acc == "float32" else torch.bfloat16)
            o.backward(shard_sequence(dout, r, p, layout))
            mine = [o.detach()] + [t.grad for t in local]
            case[acc] = {"dtypes": [str(t.dtype) for t in mine], "send_bytes": stats["send_bytes"],
                         "sends": stats["sends"],
                         "rel_err": {key: ((x.double() - shard_sequence(y, r, p, layout)).abs().max()
                                           / shard_sequence(y, r, p, layout).abs().max()).item()
                                     for key, x, y in zip(("out", "dq", "dk", "dv"), mine, refs)}}
        out[name] = case
    runtime.report(precision=out, shape=list(SHAPE), last=True)


if __name__ == "__main__":
    runtime.entrypoint(main)
