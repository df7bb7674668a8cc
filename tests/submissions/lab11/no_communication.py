"""An attack (no communication): every rank answers without hearing from rank 0, from what it can see.

Rank 0 evaluates its samples; the others try to read rank 0's private inputs through the contract
(refused) and fall back to the practice data every rank can compute (another seed: wrong)."""
from dtrain_lab.grading import contract
from dtrain_lab.grading.lab11 import VAL_SIZE, make_inputs, val_score


def run():
    try:
        samples = contract.mine(make_inputs, 0)["val"]
    except Exception:  # noqa: BLE001 - another rank's inputs are not here
        samples = make_inputs(0, 1)[0]["val"]
    return sum(val_score(s) for s in samples) / VAL_SIZE
