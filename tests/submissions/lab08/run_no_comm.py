"""Attack (issue 13): 1F1B without a single send or recv. Each rank runs the WHOLE model itself,
keeping a private copy of the other stage (trained with the same SGD), and fills in the data it
does not hold (stage 0 lacks the targets, stage 1 the inputs) with the practice data that
``make_inputs`` gives anyone (the other stage's starting weights too). Where every rank's data were
public (the practice seed) this gives
exactly the right parameters and losses; under the grader the inputs and targets are drawn for
every grade and private to their rank, so the practice stand-ins are wrong and so is the result."""
import torch
from dtrain_lab.grading import contract
from dtrain_lab.grading.lab08 import LR, lab_model, load_weights, make_inputs, stage_layers, train

_other = {}        # the other stage's private copy, kept across steps
_step = [0]


def schedule_1f1b(num_stages, num_microbatches):
    """Your function of exercise 1."""
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
    """No communication: the other stage is simulated here, the missing data is the practice data."""
    rank, world = contract.rank_and_world()
    step = _step[0]
    _step[0] += 1
    public = make_inputs(contract.PRACTICE_SEED, world)      # what anyone can compute
    if "model" not in _other:
        _other["model"] = stage_layers(lab_model(), 1 - rank)
        load_weights(_other["model"], public[1 - rank]["weights"])
    other = _other["model"]
    if inputs is None:
        inputs = list(public[0]["x"][step])
    if targets is None:
        targets = list(public[world - 1]["y"][step])
    stash, losses = {}, []
    for kind, mb in actions:
        if kind == "F":
            out = other(stage(inputs[mb])) if rank == 0 else stage(other(inputs[mb]))
            loss = loss_fn(out, targets[mb])
            losses.append(loss.item())
            stash[mb] = loss
        else:
            stash.pop(mb).backward()
    with torch.no_grad():                                    # the driver steps `stage`; we step the copy
        for p in other.parameters():
            p.sub_(p.grad, alpha=LR)
            p.grad = None
    return losses if rank == world - 1 else []


def run():
    """Called by the grader on every rank: 3 training steps with your schedule. Leave it as it is."""
    return train(schedule_1f1b, run_stage)
