"""Wrong: skips the exchange of counts and assumes every rank receives what it sends (splits do not match)."""
import torch
import torch.distributed as dist
from dtrain_lab.grading.lab13 import EXPERTS_PER_RANK, moe


def moe_layer(x, dest, first, weights):
    p = dist.get_world_size()
    y = torch.zeros_like(x)
    kept = (dest >= 0).nonzero().flatten()
    order = kept[torch.argsort(dest[kept], stable=True)]
    rows = x[order]
    counts = torch.bincount(dest[order], minlength=EXPERTS_PER_RANK * p).view(p, EXPERTS_PER_RANK)
    splits = counts.sum(1).tolist()
    got = torch.empty(sum(splits), x.shape[1], dtype=x.dtype)
    dist.all_to_all_single(got, rows, splits, splits)        # wrong: what I receive is not what I send
    back = torch.empty_like(rows)
    dist.all_to_all_single(back, got, splits, splits)
    y[order] = back
    return y


def run():
    return moe(moe_layer)
