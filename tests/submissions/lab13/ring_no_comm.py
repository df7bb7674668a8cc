"""Wrong: attention to the rank's own block only — no K/V block ever travels (rank 0 happens to be right)."""
import torch
from dtrain_lab.grading.lab13 import TOKENS, attend, block_attention
import torch.distributed as dist


def merge(o1, lse1, o2, lse2):
    lse = torch.logaddexp(lse1, lse2)
    return torch.exp(lse1 - lse).unsqueeze(-1) * o1 + torch.exp(lse2 - lse).unsqueeze(-1) * o2, lse


def ring_attention(q, k, v):
    rank = dist.get_rank()
    o, _ = block_attention(q, k, v, rank * TOKENS, rank * TOKENS)
    return o


def run():
    return attend(ring_attention, merge)
