"""A parameter without a gradient is given a zero one: weight decay and momentum still move the frozen
and the unused parameters, and every element's step count advances every step. torch.optim skips them."""
import math

import torch
import torch.distributed as dist
import torch.nn.functional as F
from dtrain_lab.grading.lab05 import train


def shard_bounds(numel, rank, world_size):
    size = math.ceil(numel / world_size)
    start = min(rank * size, numel)
    return start, min(start + size, numel)


class Zero1Adam:
    """Adam whose state is sharded over the ranks: ZeRO stage 1 (P_os, Rajbhandari et al. 2020)."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, group=None):
        self.params = list(params)
        self.lr, self.betas, self.eps, self.weight_decay, self.group = lr, betas, eps, weight_decay, group
        self.rank, self.world = dist.get_rank(group), dist.get_world_size(group)
        self.numel = sum(p.numel() for p in self.params)
        self.size = math.ceil(self.numel / self.world)        # elements per shard, padding included
        self.start, self.end = shard_bounds(self.numel, self.rank, self.world)
        self.state = {}   # Adam's moments (and step counts) of this rank's shard only
        like = self.params[0]
        self.state["exp_avg"] = torch.zeros(self.size, dtype=like.dtype, device=like.device)
        self.state["exp_avg_sq"] = torch.zeros_like(self.state["exp_avg"])
        self.state["step"] = torch.zeros_like(self.state["exp_avg"])   # per element: parameters skip steps

    @torch.no_grad()
    def step(self):
        """Average the gradients, update this rank's shard with Adam, all-gather the parameters."""
        total = self.size * self.world
        like = self.params[0]
        flat_grad = torch.zeros(total, dtype=like.dtype, device=like.device)
        has_grad = torch.zeros(total, dtype=torch.bool, device=like.device)
        offset = 0
        for p in self.params:
            if p.grad is not None:   # frozen, or unused in this step: zeros here, and masked below
                flat_grad[offset:offset + p.numel()] = p.grad.reshape(-1)
                has_grad[offset:offset + p.numel()] = True
            offset += p.numel()
        grad = torch.empty(self.size, dtype=flat_grad.dtype, device=flat_grad.device)
        dist.reduce_scatter_single(grad, flat_grad, group=self.group)   # the sum of my shard only
        grad /= self.world

        mine = slice(self.rank * self.size, (self.rank + 1) * self.size)
        flat = F.pad(torch.cat([p.reshape(-1) for p in self.params]), (0, total - self.numel))
        shard = flat[mine].clone()
        beta1, beta2 = self.betas
        m, v, t = self.state["exp_avg"], self.state["exp_avg_sq"], self.state["step"]
        g = grad + self.weight_decay * shard                           # torch.optim.Adam's weight decay
        t += 1                                                         # every element, every step
        m.copy_(beta1 * m + (1 - beta1) * g)
        v.copy_(beta2 * v + (1 - beta2) * g * g)
        m_hat = m / (1 - beta1 ** t.clamp(min=1))
        v_hat = v / (1 - beta2 ** t.clamp(min=1))
        shard = shard - self.lr * m_hat / (v_hat.sqrt() + self.eps)   # a missing gradient taken as zero

        dist.all_gather_single(flat, shard, group=self.group)        # every rank's new shard
        offset = 0
        for p in self.params:
            p.copy_(flat[offset:offset + p.numel()].view_as(p))
            offset += p.numel()


def run():
    return train(Zero1Adam)
