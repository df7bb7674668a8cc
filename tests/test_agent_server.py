"""The agent server (dtrain_lab.jobs.agents): a launch whose torchrun agent is forked from it runs as
one started as a fresh ``python -m torch.distributed.run``, and the server is used only where it
cannot change what the job does, and ends with the process that started it."""
import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from conftest import WORKERS, ended
from dtrain_lab.jobs import agents
from dtrain_lab.jobs.options import LaunchOptions

PROBE = WORKERS / "agent_probe.py"


def _same(a: dict, b: dict) -> None:
    for rank in (0, 1):
        x, y = dict(a[rank]), dict(b[rank])
        for m in (x, y):
            m["env"] = {k: v for k, v in m["env"].items() if k not in ("DTRAIN_TEST_TAG", "TORCHELASTIC_RUN_ID")}
        assert x.pop("dynamo") is True          # imported once by the server, not by each rank
        y.pop("dynamo")
        assert x == y, (x, y)


@pytest.mark.timeout(240)
def test_a_served_launch_runs_as_a_fresh_one(run, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    agents.shutdown()
    served = run(PROBE, nproc=2, args=["a", "b c"], timeout=120, env={"DTRAIN_PROBE": "1"})
    assert served.ok, served.summary()
    assert agents.server_pids() and (Path(served.log_dir) / "agent.log").is_file()
    monkeypatch.setenv("DTRAIN_AGENT_SERVER", "0")
    fresh = run(PROBE, nproc=2, args=["a", "b c"], timeout=120, env={"DTRAIN_PROBE": "1"})
    assert fresh.ok, fresh.summary()
    assert not (Path(fresh.log_dir) / "agent.log").exists()
    for r in (served, fresh):
        for m in r.metrics.values():
            assert m["env"]["DTRAIN_TEST_TAG"] == r.tag and m["job_id"] is True
            assert m["name"] == "__main__" and m["argv"] == ["a", "b c"] and m["cwd"] == str(tmp_path)
            assert m["path0"] == str(PROBE.parent) and m["env"]["OMP_NUM_THREADS"] == "1" and m["threads"] == 1
    _same(served.metrics, fresh.metrics)
    # the same torchrun command line, whichever process ran it (but for each job's own log folder)
    assert [a.replace(served.log_dir, "JOB") for a in served.command] == \
        [a.replace(fresh.log_dir, "JOB") for a in fresh.command]


def _opts(**kw) -> LaunchOptions:
    return LaunchOptions("dtrain_lab.demos.hello", 2, **kw)


def test_served_where_a_forked_agent_runs_as_a_fresh_one(monkeypatch):
    monkeypatch.delenv("DTRAIN_AGENT_SERVER", raising=False)
    monkeypatch.setattr(sys, "platform", "linux")
    assert agents.served(_opts(start="fork", env={"DTRAIN_X": "1"}))
    # variables torch reads when it is imported: served by a server started with them (below)
    assert agents.served(_opts(start="fork", env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"}))
    assert agents.served(_opts(start="fork", debug="DETAIL"))
    assert not agents.served(_opts(start="exec"))     # GPUs: a fresh Python per rank, no fork at all
    assert not agents.served(_opts(start="fork", nnodes=2, node_rank=0, rdzv_endpoint="127.0.0.1:29400"))
    monkeypatch.setenv("DTRAIN_AGENT_SERVER", "0")
    assert not agents.served(_opts(start="fork"))


@pytest.mark.timeout(240)
def test_a_changed_environment_gets_its_own_server(run, monkeypatch):
    agents.shutdown()
    first = run(PROBE, nproc=2, timeout=120)
    (server,) = agents.server_pids()
    monkeypatch.setenv("AGENT_PROBE_VAR", "seen")   # e.g. a notebook cell sets os.environ[...]
    second = run(PROBE, nproc=2, timeout=120)
    assert first.ok and second.ok
    assert first.metrics[0]["env"]["AGENT_PROBE_VAR"] is None
    assert all(m["env"]["AGENT_PROBE_VAR"] == "seen" for m in second.metrics.values())
    assert server in agents.server_pids() and len(agents.server_pids()) == 2
    second_server = [p for p in agents.server_pids() if p != server][0]
    # a third environment (debug=, which torch reads when it is imported): a server of its own, started with
    # it, in the place of the one used longest ago (agents.MAX_SERVERS is 2; neither runs a launch)
    third = run(PROBE, nproc=2, timeout=120, debug="DETAIL")
    assert third.ok and (Path(third.log_dir) / "agent.log").is_file(), third.summary()
    assert all(m["debug"] == "DebugLevel.DETAIL" for m in third.metrics.values())
    assert all(m["debug"] == "DebugLevel.OFF" for m in (*first.metrics.values(), *second.metrics.values()))
    assert len(agents.server_pids()) == 2 and second_server in agents.server_pids()
    assert not psutil.pid_exists(server) or psutil.Process(server).status() == psutil.STATUS_ZOMBIE, \
        "the server used longest ago was not closed"
    agents.shutdown()
    assert not psutil.pid_exists(second_server) or psutil.Process(second_server).status() == psutil.STATUS_ZOMBIE


@pytest.mark.timeout(120)
def test_the_server_ends_with_the_process_that_started_it():
    code = ("import time, dtrain_lab\nfrom dtrain_lab.jobs import agents\n"
            "r = dtrain_lab.launch('dtrain_lab.demos.hello', nproc=2, quiet=True, timeout=60)\n"
            "print(r.ok, agents.server_pids()[0], flush=True)\ntime.sleep(120)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                            env={k: v for k, v in os.environ.items() if k != "DTRAIN_AGENT_SERVER"})
    ok, pid = proc.stdout.readline().split()
    assert ok == "True"
    server = psutil.Process(int(pid))
    assert server.ppid() == proc.pid
    proc.kill()   # the kernel dies without any cleanup
    proc.wait()
    assert ended(server, 20), "the agent server outlived the process that started it"
