"""DDP.on_event: the events of a synchronised backward, in order, for tests/test_ddp_events.py.

Two steps of MLP(16, 32, 4, depth=2) in three buckets, with and without overlap, recorded; the same
steps not recorded, to check that recording changes nothing."""
import threading

import torch
import torch.distributed as dist
import torch.nn.functional as F

from dtrain_lab.data import global_batch, regression_dataset, shard
from dtrain_lab.jobs import runtime
from dtrain_lab.models import MLP
from dtrain_lab.parallel.ddp import DDP

THREE_BUCKETS_MB = 0.0004


def run(overlap: bool, record: bool) -> tuple[list, list]:
    rt = runtime.current()
    model = MLP(16, 32, 4, depth=2, seed=0)
    ddp = DDP(model, bucket_cap_mb=THREE_BUCKETS_MB, overlap=overlap)
    events, lock = [], threading.Lock()

    def tell(e):
        with lock:
            events.append(dict(e))

    if record:
        ddp.on_event = tell
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = regression_dataset(n=64, d_in=16, d_out=4, seed=0)
    for step in range(2):
        x, y = shard(global_batch(data, step, 8), rt.rank, rt.world_size)
        opt.zero_grad(set_to_none=True)
        F.mse_loss(ddp(x), y).backward()
        opt.step()
    dist.barrier()
    return events, torch.cat([p.detach().reshape(-1) for p in model.parameters()]).tolist()


def main() -> None:
    out = {}
    for overlap in (True, False):
        events, params = run(overlap, record=True)
        _, plain = run(overlap, record=False)
        out["overlap" if overlap else "no_overlap"] = {"events": events, "same_params": params == plain}
    runtime.report(**out, last=True)


if __name__ == "__main__":
    runtime.entrypoint(main)
