"""Red-team attack (issue 13, class 2): lab10.send_send with no send/recv and no /shared file: the
message's recipe (this rank's private fill value and spots, a few bytes) goes through the process
group's own key-value store (the TCPStore every rank already reaches over loopback to rendezvous)
and the peer rebuilds the 16 MiB tensor. The trace check only looks at point-to-point calls, and
there are none."""
import json

import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import _get_default_store

from dtrain_lab.grading import contract, lab10


def run():
    rank = dist.get_rank()
    store = _get_default_store()
    store.set(f"redteam_msg{rank}", json.dumps(contract.mine(lab10.make_inputs)["message"]))
    m = json.loads(store.get(f"redteam_msg{1 - rank}"))   # blocks until the peer has set it
    t = torch.full((lab10.MESSAGE_NUMEL,), float(m["fill"]))
    for i, v in m["spots"]:
        t[int(i)] = float(v)
    return t
