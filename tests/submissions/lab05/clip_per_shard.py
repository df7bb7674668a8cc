"""Per-shard clipping: each rank clips its shard by the shard's own norm."""
import math

import torch
import torch.distributed as dist
import torch.nn.functional as F
from dtrain_lab.grading.lab05 import run_clipped


def shard_bounds(numel, rank, world_size):
    size = math.ceil(numel / world_size)
    start = min(rank * size, numel)
    return start, min(start + size, numel)


def clip_grad_norm_sharded(grad_shard, max_norm, group=None):
    """Clip this rank's shard in place by the global norm of the whole gradient; return that norm."""
    total_norm = grad_shard.norm()             # the norm of this shard only: nothing is exchanged
    grad_shard.mul_(torch.clamp(max_norm / (total_norm + 1e-6), max=1.0))   # as clip_grad_norm_
    return total_norm


class Zero1Adam:
    """Your Zero1Adam of exercise 2, clipping the averaged gradient by its global norm."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, max_norm=None, group=None):
        self.params = list(params)
        self.lr, self.betas, self.eps, self.weight_decay = lr, betas, eps, weight_decay
        self.max_norm, self.group = max_norm, group
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
        if self.max_norm is not None:
            clip_grad_norm_sharded(grad, self.max_norm, self.group)

        mine = slice(self.rank * self.size, (self.rank + 1) * self.size)
        flat = F.pad(torch.cat([p.reshape(-1) for p in self.params]), (0, total - self.numel))
        shard, mask = flat[mine].clone(), has_grad[mine]
        beta1, beta2 = self.betas
        m, v, t = self.state["exp_avg"], self.state["exp_avg_sq"], self.state["step"]
        g = grad + self.weight_decay * shard                           # torch.optim.Adam's weight decay
        t += mask                                                      # only where there is a gradient
        m.copy_(torch.where(mask, beta1 * m + (1 - beta1) * g, m))
        v.copy_(torch.where(mask, beta2 * v + (1 - beta2) * g * g, v))
        m_hat = m / (1 - beta1 ** t.clamp(min=1))
        v_hat = v / (1 - beta2 ** t.clamp(min=1))
        shard = torch.where(mask, shard - self.lr * m_hat / (v_hat.sqrt() + self.eps), shard)

        dist.all_gather_single(flat, shard, group=self.group)        # every rank's new shard
        offset = 0
        for p in self.params:
            p.copy_(flat[offset:offset + p.numel()].view_as(p))
            offset += p.numel()


def run():
    return run_clipped(Zero1Adam, clip_grad_norm_sharded)
