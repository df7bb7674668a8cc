"""Red-team attack (issue 13, class 1 "the checks run inside the submission"; the brief's (a)):
lab10.rank_branch without the exercise. The submission writes its own success record and leaves:
- it computes the answer of the PUBLIC practice seed (``make_inputs(0, world)``, what every rank
  could recompute without communicating),
- writes it straight into the harness's result file, appends a "returned"/"done" event and a
  forged trace with an all_reduce in it,
- empties the grader's registry of checks and hidden checks (as far as it can see them), and
- leaves with ``os._exit(0)`` before the harness could write anything.
"""
import json
import os
import time

from dtrain_lab.grading import channel, lab10


def run():
    world = int(os.environ["WORLD_SIZE"])
    practice = lab10.make_inputs(0, world)
    answer = sum(i["loss"] for i in practice) / world
    io = os.environ["DTRAIN_GRADE_IO"]
    channel.write(os.path.join(io, "result"), answer)
    with open(os.path.join(io, "trace"), "a") as f:
        f.write(json.dumps({"op": "all_reduce", "numel": 1, "dtype": "torch.float32"}) + "\n")
    with open(os.path.join(io, "events"), "a") as f:
        for ev in ("returned", "done"):
            f.write(json.dumps({"ev": ev, "t": time.time(), "bytes": 64}) + "\n")
    try:
        from dtrain_lab.grading import registry
        for ex in registry.all_exercises():
            ex.checks.clear()
            ex.job_checks.clear()
    except Exception:  # noqa: BLE001 - the checks are not even importable in the sandbox
        pass
    os._exit(0)
