"""An attack (no communication, forged report): no Job, no DDP, no checkpoint. Each rank trains the
lab's model alone on the only data it has, its own shard, and hands back a report that claims a
resume at step 4 of a restarted attempt. Without the other rank's data the parameters are wrong."""
import torch
import torch.distributed as dist
import torch.nn.functional as F

from dtrain_lab.grading.lab09 import STEPS, batch, lab_model, make_optim, rank_seed


def run():
    rank = dist.get_rank()
    model = lab_model()
    opt, sched = make_optim(model)
    torch.manual_seed(rank_seed(rank))
    for step in range(STEPS):
        x, y = batch(step)
        opt.zero_grad(set_to_none=True)
        F.mse_loss(model(x), y).backward()
        opt.step()
        sched.step()
    return {"params": [p.detach().clone() for p in model.parameters()], "steps_run": list(range(4, STEPS)),
            "attempt": 1}
