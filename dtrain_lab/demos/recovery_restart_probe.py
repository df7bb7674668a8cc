"""Why a torchrun restart can fail to connect: the previous attempt's keys are still in the store.

    python -c "import dtrain_lab; print(dtrain_lab.jobs.launch('dtrain_lab.demos.recovery_restart_probe',
               nproc=2, args=['plain'], max_restarts=2, env={'DTRAIN_PG_TIMEOUT': '10'}).summary())"

Attempt 0: every rank joins, rank 1 exits (code 3) at step 2 of 4 all-reduces; torchrun restarts
the group. Attempt 1 first *looks* into torchrun's store (same ``MASTER_PORT``: one store for the
whole job) for gloo's peer-address keys ``default_pg/0//cpu//0/<rank>``, then joins:

* ``plain`` — ``dist.init_process_group("gloo")`` as PyTorch does it: the keys of attempt 0 are
  found, and a rank that reads its peer's *old* address before the peer rewrote it fails with
  "Gloo connectFullMesh failed ... Connection refused" (or retries until the time-out);
* ``runtime`` — :func:`dtrain_lab.jobs.runtime.init`: attempt ``n`` uses the prefix
  ``dtrain_attempt_<n>/``, an empty key space; the restart joins every time.

Reports per attempt: ``attempt``, ``master_port``, ``stale_keys`` (old keys seen before joining),
``joined_s`` (time to join); at the end ``total`` (the all-reduced sum).
"""
import datetime
import os
import sys
import time

import torch
import torch.distributed as dist

from dtrain_lab.i18n import tr
from dtrain_lab.jobs import runtime

GLOO_KEYS = "default_pg/0//cpu//0/{}"


def main() -> None:
    mode = sys.argv[1] if len(sys.argv) > 1 else "runtime"
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    timeout = datetime.timedelta(seconds=float(os.environ.get("DTRAIN_PG_TIMEOUT", "10")))
    stale = []
    if attempt > 0 and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        peek = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world,
                             is_master=False, timeout=timeout)
        stale = [GLOO_KEYS.format(r) for r in range(world) if peek.check([GLOO_KEYS.format(r)])]
    t0 = time.time()
    if mode == "plain":
        dist.init_process_group("gloo", timeout=timeout)
    else:
        runtime.init(timeout=timeout.total_seconds())
    runtime.report(attempt=attempt, master_port=int(os.environ["MASTER_PORT"]), stale_keys=stale,
                   joined_s=round(time.time() - t0, 3))
    x = torch.ones(1)
    for step in range(4):
        if attempt == 0 and rank == 1 and step == 2:
            print(tr("demo_probe_exit", step=step), flush=True)
            os._exit(3)
        dist.all_reduce(x)
    runtime.report(total=x.item(), last=True)
    dist.destroy_process_group()
    runtime._fast_exit(0)


if __name__ == "__main__":
    main()
