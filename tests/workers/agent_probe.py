"""What a rank sees of the process it was started from: launched by tests/test_agent_server.py both
through an agent server (dtrain_lab.jobs.agents) and as a fresh ``python -m torch.distributed.run``;
the test asserts that the two see the same."""
import os
import sys

import torch
import torch.distributed as dist

from dtrain_lab.jobs import runtime


def main() -> None:
    rt = runtime.current()
    x = torch.tensor([float(rt.rank + 1)])
    dist.all_reduce(x)
    runtime.report(
        sum=x.item(), name=__name__, argv=sys.argv[1:], cwd=os.getcwd(), path0=sys.path[0],
        env={k: os.environ.get(k) for k in ("DTRAIN_TEST_TAG", "DTRAIN_PROBE", "AGENT_PROBE_VAR", "OMP_NUM_THREADS", "RANK",
                                            "WORLD_SIZE", "TORCHELASTIC_RUN_ID")},
        job_id=bool(os.environ.get("DTRAIN_JOB_ID")), threads=torch.get_num_threads(),
        seed=torch.initial_seed(), dynamo="torch._dynamo" in sys.modules, debug=str(dist.get_debug_level()))


if __name__ == "__main__":
    runtime.entrypoint(main)
