"""A shortcut (issue 22): no pipeline. The inputs are broadcast from stage 0, the targets from the
last stage and each stage's starting weights from its rank (they are private), and every rank runs
the whole model, keeping a copy of the other stage that gets the same SGD step. The parameters and
losses are right, yet no activation or gradient ever crosses between the stages."""
import torch
import torch.distributed as dist

from dtrain_lab.grading.lab08 import D_IN, D_OUT, LR, M, MICRO, lab_model, stage_layers, train

_other = {}


def schedule_1f1b(num_stages, num_microbatches):
    schedule = []
    for s in range(num_stages):
        warmup = min(num_stages - s - 1, num_microbatches)
        actions = [("F", mb) for mb in range(warmup)]
        for i in range(num_microbatches - warmup):
            actions += [("F", warmup + i), ("B", i)]
        actions += [("B", mb) for mb in range(num_microbatches - warmup, num_microbatches)]
        schedule.append(actions)
    return schedule


def run_stage(stage, actions, inputs, targets, loss_fn, act_shape):
    rank, world = dist.get_rank(), dist.get_world_size()
    x = torch.stack(inputs) if inputs is not None else torch.empty(M, MICRO, D_IN, dtype=torch.float64)
    y = torch.stack(targets) if targets is not None else torch.empty(M, MICRO, D_OUT, dtype=torch.float64)
    dist.broadcast(x, 0)
    dist.broadcast(y, world - 1)
    if "model" not in _other:
        mine = [p.detach().clone() for p in stage.parameters()]
        theirs = [p.detach().clone() for p in stage_layers(lab_model(), 1 - rank, world).parameters()]
        for s in range(world):
            for t in (mine if s == rank else theirs):
                dist.broadcast(t, s)
        _other["model"] = stage_layers(lab_model(), 1 - rank, world)
        with torch.no_grad():
            for p, t in zip(_other["model"].parameters(), theirs):
                p.copy_(t)
    other = _other["model"]
    stash, losses = {}, []
    for kind, mb in actions:
        if kind == "F":
            out = other(stage(x[mb])) if rank == 0 else stage(other(x[mb]))
            loss = loss_fn(out, y[mb])
            losses.append(loss.item())
            stash[mb] = loss
        else:
            stash.pop(mb).backward()
    with torch.no_grad():
        for p in other.parameters():
            p.sub_(p.grad, alpha=LR)
            p.grad = None
    return losses if rank == world - 1 else []


def run():
    return train(schedule_1f1b, run_stage)
