"""DDP.on_event (what lesson 02's bucket figure is drawn from): the events of each synchronised
backward, in the order DDP did them, and recording them changes nothing."""
import pytest

from conftest import WORKERS, job_metrics
from forkjob import fork_launch

REVERSED = ["layers.4.bias", "layers.4.weight", "layers.2.bias", "layers.2.weight", "layers.0.bias", "layers.0.weight"]


@pytest.fixture(scope="module")
def metrics():
    return job_metrics(fork_launch(str(WORKERS / "ddp_events.py"), nproc=2, timeout=120, quiet=True), 2)


def _ordered(events):
    return [(e["event"], e.get("param", e.get("bucket"))) for e in events if e["event"] != "done"]


@pytest.mark.timeout(200)
def test_events_in_the_order_ddp_does_them(metrics):
    ready = [("ready", p) for p in REVERSED]
    step_overlap = (ready[0:2] + [("launch", 0)] + ready[2:4] + [("launch", 1)] + ready[4:6] + [("launch", 2)]
                    + [("backward_end", None), ("wait", 0), ("wait", 1), ("wait", 2)])
    step_plain = (ready + [("backward_end", None), ("launch", 0), ("launch", 1), ("launch", 2),
                           ("wait", 0), ("wait", 1), ("wait", 2)])
    for m in metrics.values():
        assert _ordered(m["overlap"]["events"]) == step_overlap * 2
        assert _ordered(m["no_overlap"]["events"]) == step_plain * 2
        for case in ("overlap", "no_overlap"):
            ev = m[case]["events"]
            assert sorted(e["bucket"] for e in ev if e["event"] == "done") == [0, 0, 1, 1, 2, 2]
            assert all(all(k in ("event", "param", "bucket") for k in e) for e in ev)
            assert m[case]["same_params"]           # recording changes nothing


@pytest.mark.timeout(200)
def test_each_bucket_completes_after_its_launch(metrics):
    for m in metrics.values():
        for case in ("overlap", "no_overlap"):
            ev = m[case]["events"]
            for b in range(3):
                launches = [i for i, e in enumerate(ev) if e["event"] == "launch" and e["bucket"] == b]
                dones = [i for i, e in enumerate(ev) if e["event"] == "done" and e["bucket"] == b]
                assert all(d > lo for lo, d in zip(launches, dones))
