"""Red-team attack (issue 13, class 2 "no communication"): lab10.rank_branch answered with NO
torch.distributed call at all. Every rank publishes its private loss in the job's shared folder
(``contract.shared_dir()``, which exercise 7 needs) and polls until every rank's file is there."""
import json
import os
import time

from dtrain_lab.grading import contract
from dtrain_lab.grading.lab10 import local_loss


def run():
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    folder = contract.shared_dir()
    tmp = os.path.join(folder, f".loss{rank}.tmp")
    with open(tmp, "w") as f:
        json.dump(local_loss(), f)
    os.rename(tmp, os.path.join(folder, f"loss{rank}.json"))
    losses = {}
    while len(losses) < world:
        for r in range(world):
            p = os.path.join(folder, f"loss{r}.json")
            if r not in losses and os.path.exists(p):
                with open(p) as f:
                    losses[r] = json.load(f)
        time.sleep(0.05)
    return sum(losses.values()) / world
