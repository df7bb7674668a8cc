"""The pipeline schedule's shape, as the planner models it: how the layers are cut into stages and
model chunks, and how many forwards each stage runs before its first backward (1F1B, and
Megatron-LM's interleaved 1F1B with ``v`` chunks per stage)."""
from __future__ import annotations

__all__ = ["SPLITS", "chunk_sizes", "stage_layers", "pp_warmup", "sched_chunk_layers"]

SPLITS = ("even", "llama3")


def chunk_sizes(n_layers: int, pp: int, virtual: int = 1, split: str = "even") -> list[int]:
    """Layers of each of the ``pp · virtual`` model chunks, in pipeline order (chunk ``c · pp + s`` runs on
    stage ``s``). ``"even"``: as ``pipeline.split_sequential`` cuts, the first chunks one more.
    ``"llama3"``: Llama 3's split (Dubey et al. 2024, section 3.3.2): ``n_layers + 2`` spread evenly, then one
    layer fewer on the first and on the last chunk, which carry the embedding and the output head and loss."""
    n = pp * virtual
    total = n_layers + (2 if split == "llama3" else 0)
    base, extra = divmod(total, n)
    sizes = [base + (1 if i < extra else 0) for i in range(n)]
    if split == "llama3":
        sizes[0] -= 1
        sizes[-1] -= 1
    return sizes


def stage_layers(n_layers: int, pp: int, stage: int, virtual: int = 1, split: str = "even") -> list[int]:
    """Layer ids of ``stage``: its chunks ``stage``, ``pp + stage``, … (one chunk without interleaving;
    ``"even"``: as ``pipeline.split_sequential`` cuts, the first stages one more)."""
    sizes = chunk_sizes(n_layers, pp, virtual, split)
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    return [x for c in range(stage, pp * virtual, pp) for x in range(starts[c], starts[c] + sizes[c])]


def pp_warmup(pp: int, s: int, v: int = 1, m: int | None = None) -> int:
    """Forwards stage ``s`` runs before its first backward, in chunk micro-batches (Megatron-LM's
    ``forward_backward_pipelining_with(out)_interleaving``): pp − s − 1, interleaved 2(pp − s − 1) + (v − 1)·pp.
    Megatron-LM's interleaved schedule runs every forward first when the micro-batches are exactly
    ``pp`` (``num_microbatches == pipeline_parallel_size``: ``all_warmup_microbatches``): then ``m · v``
    on every stage. Callers cap the result at ``m · v``."""
    if v > 1 and m == pp:
        return m * v
    return pp - s - 1 if v == 1 else 2 * (pp - s - 1) + (v - 1) * pp


def sched_chunk_layers(n_layers: int, pp: int, s: int, v: int = 1, split: str = "even") -> list[int]:
    """Layer ids of stage ``s``'s last chunk (``(v − 1)·pp + s``); with an empty chunk, the last non-empty one."""
    sizes = chunk_sizes(n_layers, pp, v, split)
    for c in range((v - 1) * pp + s, -1, -pp):
        if sizes[c]:
            return list(range(sum(sizes[:c]), sum(sizes[:c]) + sizes[c]))
    return []
