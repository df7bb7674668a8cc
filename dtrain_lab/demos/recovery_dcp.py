"""A sharded (DCP) checkpoint saved by N ranks and loaded by M; a heartbeat watchdog names a stalled rank.

    torchrun --standalone --nproc-per-node 2 -m dtrain_lab.demos.recovery_dcp save ROOT
    torchrun --standalone --nproc-per-node 3 -m dtrain_lab.demos.recovery_dcp load ROOT

``save``: a 10 x 3 matrix ``arange(30)`` is a ``DTensor`` sharded by rows over the ranks (5 + 5 on 2
ranks); with a replicated vector and a step number it is written by
:func:`~dtrain_lab.resilience.recovery.dcp_save` to ``ROOT/step_00000007`` (every rank its own rows, rank 0
the ``COMMIT`` file). Then the watchdog part: every rank sends heartbeats for steps 1-3; at step 4
rank 1 stalls for ``STALL`` seconds (fault injection, ``DTRAIN_FAIL_MODE=stall``) while rank 0 keeps
beating and runs a :class:`~dtrain_lab.resilience.recovery.Watchdog` with ``stale_after=STALE`` seconds,
until the watchdog has named a rank (rank 1 beats again only after that).

``load``: the matrix is a zero ``DTensor`` sharded over *this* world (4 + 4 + 2 rows on 3 ranks);
:func:`~dtrain_lab.resilience.recovery.dcp_load` fills it from the newest committed folder (DCP reshards).

Reports: ``local`` (this rank's rows), ``full`` (the whole matrix), ``vec``, ``step``, and on rank 0
of ``save`` ``watchdog`` (what the watchdog reported).
"""
import os
import sys
import time

import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor

from dtrain_lab.resilience import recovery
from dtrain_lab.jobs import runtime

ROWS, COLS, STEP = 10, 3, 7


def state_for(mesh, full: torch.Tensor, vec: torch.Tensor, step: int) -> dict:
    return {"w": distribute_tensor(full, mesh, [Shard(0)]), "vec": vec, "step": step}


def main() -> None:
    rt = runtime.current()
    mode, root = sys.argv[1], sys.argv[2]
    mesh = init_device_mesh(rt.device.type, (rt.world_size,))
    if mode == "save":
        full = torch.arange(ROWS * COLS, dtype=torch.float32).reshape(ROWS, COLS)
        state = state_for(mesh, full, torch.linspace(0, 1, 5), STEP)
        recovery.dcp_save(state, os.path.join(root, f"step_{STEP:08d}"))
        runtime.report(saved=True, local=state["w"].to_local().tolist())
        watchdog_part(rt, root)
    else:
        state = state_for(mesh, torch.zeros(ROWS, COLS), torch.zeros(5), 0)
        found = recovery.dcp_latest(root)
        recovery.dcp_load(state, found)
        runtime.report(loaded=os.path.basename(str(found)), local=state["w"].to_local().tolist(),
                       full=state["w"].full_tensor().tolist(), vec=state["vec"].tolist(), step=state["step"])


def watchdog_part(rt, root: str) -> None:
    """Rank 1 stalls after step 3 (``DTRAIN_FAIL_MODE=stall``); rank 0 keeps beating and runs the
    watchdog until it has named a rank, then stops it. Rank 1 beats step 4 only after that, so the
    report does not depend on how fast a loaded machine schedules either rank."""
    stale = float(os.environ.get("DTRAIN_TEST_STALE", "1.0"))
    hb = os.path.join(root, "heartbeats")
    reports: list = []
    dog = recovery.Watchdog(hb, rt.world_size, stale_after=stale, interval=0.1,
                            on_stall=reports.append) if rt.rank == 0 else None
    for step in range(1, 4):
        recovery.heartbeat(hb, step, rt.rank)
        time.sleep(0.05)
    torch.distributed.barrier()
    if dog is not None:
        recovery.heartbeat(hb, 3, rt.rank)     # fresh, whatever the barrier cost
        dog.start()
    recovery.maybe_fail(4, rt.rank)     # DTRAIN_FAIL_RANK=1, DTRAIN_FAIL_MODE=stall: rank 1 sleeps here
    if dog is not None:
        deadline = time.monotonic() + stale + 60
        while not reports and time.monotonic() < deadline:      # rank 0 stays healthy meanwhile
            recovery.heartbeat(hb, 4, rt.rank)
            time.sleep(0.1)
        dog.stop()
    torch.distributed.barrier()
    recovery.heartbeat(hb, 4, rt.rank)
    if dog is not None:
        runtime.report(watchdog=[{k: r[k] for k in ("rank", "step", "age", "message")} for r in reports])

if __name__ == "__main__":
    runtime.entrypoint(main)
