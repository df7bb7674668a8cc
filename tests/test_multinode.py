"""Two "nodes" on one machine: two torchrun agents (two dtrain_lab.launch calls) joined by a c10d
rendezvous on a loopback port (dtrain_lab.jobs.cluster.run_local_nodes), gloo.

One job that succeeds (every check on its reports) and one where node 1 fails right after start-up:
node 0 must then be stopped at once, and no process of either node may survive.
"""

import os

import pytest
import torch

from conftest import assert_no_survivors, new_tag
from dtrain_lab.jobs import cluster, nodes

DEMO = "dtrain_lab.demos.multinode_check"


@pytest.fixture(scope="module")
def job():
    tag = new_tag()
    # node 1's agent starts a second before node 0's: c10d numbers the agents by (address, pid),
    # so "node 1" normally becomes group rank 0 (pids can wrap around: the test reads them)
    r = cluster.run_local_nodes(DEMO, nnodes=2, nproc=1, timeout=90, startup_timeout=120,
                                env={"DTRAIN_TEST_TAG": tag}, start_order=[1, 0], stagger=1.0)
    assert_no_survivors(tag)
    return r


def test_job_ok_and_ranks_merged(job):
    assert job.ok, job.summary() + "\n" + "\n".join(r.output[-2000:] for n in job.nodes for r in n.result.ranks)
    assert [r.rank for r in job.ranks] == [0, 1]
    assert job.gathered("rank") == [0, 1]                       # metrics found under the true ranks
    assert job.gathered("world_size") == [2, 2]
    assert job.gathered("local_rank") == [0, 0]                 # one process per node
    assert job.gathered("local_world_size") == [1, 1]
    assert job.gathered("all_reduce_sum") == [3.0, 3.0]        # 1 + 2, across the two "nodes"


def test_group_rank_comes_from_the_rendezvous(job):
    # each node's workers know their node by GROUP_RANK; RANK = GROUP_RANK * LOCAL_WORLD_SIZE + LOCAL_RANK
    assert sorted(n.group_rank for n in job.nodes) == [0, 1]
    for n in job.nodes:
        assert n.ranks == [n.group_rank]
        (m,) = [job.metrics[r] for r in n.ranks]
        env = m["env"]
        assert m["group_rank"] == n.group_rank == int(env["GROUP_RANK"])
        assert int(env["RANK"]) == int(env["GROUP_RANK"]) * int(env["LOCAL_WORLD_SIZE"]) + int(env["LOCAL_RANK"])
        assert env["GROUP_WORLD_SIZE"] == "2" and env["WORLD_SIZE"] == "2"
        assert env["DTRAIN_SIM_NODE"] == str(n.requested_rank)
        assert env["TORCHELASTIC_RUN_ID"] == job.rdzv_id
        assert env["TORCHELASTIC_RESTART_COUNT"] == "0"
    envs = job.gathered("env")
    # one master for the whole job: the address and port of group rank 0, not the rendezvous port
    assert envs[0]["MASTER_ADDR"] == envs[1]["MASTER_ADDR"] == "127.0.0.1"
    assert envs[0]["MASTER_PORT"] == envs[1]["MASTER_PORT"]
    # every rank saw the same table of (host, group rank, local rank, pid, agent pid, the agent's
    # rendezvous key), one row per rank
    everyone = job.gathered("everyone")
    assert everyone[0] == everyone[1]
    rows = everyone[0]
    assert [row[1] for row in rows] == [0, 1]
    assert len({row[3] for row in rows}) == 2 and len({row[4] for row in rows}) == 2
    # torch's rule (dynamic_rendezvous.py): agents sorted by their _NodeDesc (address, pid, local id)
    # get group ranks 0, 1, ...; the demo reads the key from the rendezvous's own state
    keys = [tuple(row[5]) for row in rows]          # in group-rank order
    assert keys == sorted(keys)
    assert {k[0] for k in keys} == {"127.0.0.1"}    # run_local_nodes: --local-addr, so the pid decides
    assert [row[4] for row in rows] == [k[1] for k in keys]
    # a regression: the demo walked up /proc past the agent to the job's init, whose command line
    # also names torch.distributed.run, and under load those pids were not in the agents' order
    agent_pids = [row[4] for row in rows]
    assert agent_pids == sorted(agent_pids)
    assert not set(agent_pids) & {row[3] for row in rows}


def test_node_rank_is_ignored_and_results_are_renumbered(job):
    # node 1's agent started first, so unless pids wrapped around it became group rank 0
    swapped = job.nodes[1].group_rank == 0
    rows = job.gathered("everyone")[0]
    node1_agent = rows[job.nodes[1].group_rank][4]
    node0_agent = rows[job.nodes[0].group_rank][4]
    assert swapped == (node1_agent < node0_agent)
    # run_local_nodes starts node 0 a stagger after node 1's agent process exists (not after node 1's
    # launch began, which under load or in a fresh process can take longer than the stagger: then the
    # agents started together, in either order), so only a pid wrap-around can put node 0 first
    with open("/proc/sys/kernel/pid_max") as f:
        pid_max = int(f.read())
    wrapped = node1_agent - node0_agent > pid_max // 2    # node 1 near the top, node 0 from the bottom again
    assert swapped or wrapped, (node0_agent, node1_agent, pid_max)
    for n in job.nodes:
        # launch() takes a node's ranks from what its workers were given (not node_rank * nproc,
        # which is wrong when the rendezvous swapped the nodes), and finds their reports there
        assert [r.rank for r in n.result.ranks] == n.ranks
        assert n.result.ranks[0].metrics.get("rank") == n.ranks[0]
    # run_local_nodes read them under the ranks the workers really had
    assert [m["rank"] for m in job.metrics.values()] == [0, 1]


def test_ddp_step_same_on_both_nodes_and_equal_to_one_process(job):
    assert job.gathered("param_spread") == [0.0, 0.0]          # bitwise-identical replicas
    c = job.gathered("params_checksum")
    assert c[0] == c[1]
    for d in job.gathered("ddp_vs_single"):
        assert d < 1e-6, d


# node 1's worker fails at once; node 0's worker waits forever, as a rank waiting for a dead peer
# would (plain Python, no torch import: only the agents cost a start-up)
FAIL_WORKER = """
import os, time
mark = os.environ["DTRAIN_TEST_MARK"]
if os.environ["DTRAIN_SIM_NODE"] == "1":
    deadline = time.monotonic() + 90        # fail once node 0 is inside its program (a loaded machine is slow)
    while not os.path.exists(mark) and time.monotonic() < deadline:
        time.sleep(0.05)
    raise RuntimeError("node 1 fails on purpose")
print("node 0 waits for its peer", flush=True)
open(mark, "w").close()
time.sleep(600)
"""


def test_a_failing_node_stops_the_other_and_leaves_nothing(tmp_path):
    worker = tmp_path / "fail_worker.py"
    worker.write_text(FAIL_WORKER)
    tag = new_tag()
    r = cluster.run_local_nodes(str(worker), nnodes=2, nproc=1, timeout=120, startup_timeout=120,
                                env={"DTRAIN_TEST_TAG": tag, "DTRAIN_TEST_MARK": str(tmp_path / "node0_started")})
    assert_no_survivors(tag)
    assert not r.ok
    failed = r.nodes[1].result
    assert not failed.ok and not failed.hung, failed.summary()
    assert [rr.rank for rr in r.ranks if "node 1 fails on purpose" in (rr.exception or "")] == r.nodes[1].ranks
    # node 0 would wait until its own 120 s start-up limit. Usually the runner kills it as soon as
    # node 1 has failed; but when node 1's agent hosted the rendezvous store, node 0's agent can lose
    # the store and end by itself first, and then it must not be reported as stopped by its peer.
    # Node 1, whose rank failed, is never "stopped by its peer", even when node 0's launch returned
    # first and the runner killed node 1's agent in its shutdown
    node0 = r.nodes[0].result
    assert not node0.ok and not node0.hung and node0.elapsed < 100, node0.summary()
    assert "node 0 waits for its peer" in node0.ranks[0].output
    assert not r.nodes[1].stopped
    summary = r.summary("en")
    assert summary.startswith("✗")
    if r.nodes[0].stopped:
        assert r.stopped_by_peer == [0] and node0.returncode == -9
        assert "node 0 was stopped because another node had failed" in summary
    else:
        # it ended by itself: its agent lost the store (an exit code), or its agent stopped its rank
        # when the rendezvous closed and the rank recorded that end before the runner's SIGKILL of
        # the agent landed (-9, with the rank's own record)
        assert r.stopped_by_peer == [] and node0.returncode != 0
        if node0.returncode == -9:
            own = [rr for rr in r.ranks if rr.rank in r.nodes[0].ranks]
            assert nodes._failed_by_itself(node0, own), node0.summary()
        assert "was stopped because another node had failed" not in summary


@pytest.mark.parametrize("order", ["failed node returns first", "stopped node returns first"])
def test_who_was_stopped_by_its_peer_does_not_depend_on_which_launch_returns_first(monkeypatch, tmp_path, order):
    """The bookkeeping of run_local_nodes on fake launches, in both orders the real ones can return:
    node 1's rank raises; node 0's rank waits until it is killed. Node 0 is the one stopped by its
    peer, never node 1, even when node 0's launch returns first and node 1's agent is killed too."""
    import threading

    from dtrain_lab.jobs import nodes
    from dtrain_lab.jobs.result import LaunchResult, RankResult

    killed = {0: threading.Event(), 1: threading.Event()}
    node1_may_return = threading.Event()

    def fake_launch(target, nproc, env, **kw):
        i = int(env["DTRAIN_SIM_NODE"])
        log = tmp_path / f"node{i}"
        log.mkdir()
        (log / f"started.{i}.0").write_text("")
        if i == 1:
            (log / "error.1.0.json").write_text('{"type": "RuntimeError", "message": "node 1 fails"}')
            if order == "stopped node returns first":
                node1_may_return.wait(10)      # its agent is still shutting down
        else:
            if order == "stopped node returns first":
                node1_may_return.set()
                killed[0].set()                # its agent ended by itself (lost the store) ...
            killed[0].wait(10)                 # ... or waits until the runner kills it
        # node 0's rank has an exception-like line in its stderr (a background thread's, as its peers went
        # away) but recorded nothing: it did not fail by itself (seen under load: it was reported as failed)
        rank = RankResult(rank=i, stderr="RuntimeError: Connection closed by peer\n" if i == 0 else "")
        rank.exception = "RuntimeError: Connection closed by peer" if i == 0 else None
        return LaunchResult(target=target, nproc=nproc, ok=False, returncode=-9 if i == 0 else 1, hung=False,
                            elapsed=0.1, ranks=[rank], log_dir=str(log))

    def fake_kill(marker, node=None, rounds=10):
        if node is None:
            return False
        killed[node].set()
        return True                            # a running agent was killed

    monkeypatch.setattr(nodes, "launch", fake_launch)
    monkeypatch.setattr(nodes, "_kill_marker", fake_kill)
    r = nodes.run_local_nodes("x.py", nnodes=2, nproc=1, timeout=30, startup_timeout=30)
    assert not r.ok and not r.nodes[1].stopped
    if order == "failed node returns first":
        assert r.stopped_by_peer == [0] and r.nodes[0].stopped
    else:   # node 0 returned first, so the runner killed node 1's agent: still not "stopped by a peer"
        assert r.stopped_by_peer == [] and not r.nodes[0].stopped


def test_bad_arguments():
    from dtrain_lab.i18n import LabError

    with pytest.raises(LabError, match="nnodes"):
        cluster.run_local_nodes(DEMO, nnodes=0)
    with pytest.raises(LabError, match="nproc"):
        cluster.run_local_nodes(DEMO, nproc=1.5)
    p = cluster.free_port()
    assert 1024 <= p <= 65535


def test_demo_finds_the_rendezvous_endpoint_on_torchruns_command_line():
    import subprocess
    import sys

    from dtrain_lab.demos import multinode_check as mc

    cases = [(["--rdzv-endpoint", "10.0.0.7:29500"], ("10.0.0.7", 29500)),
             (["--rdzv_endpoint=[::1]:1234"], ("::1", 1234)),
             (["--rdzv-endpoint", "head-node"], ("head-node", 29400)),   # torchrun's default port
             (["--standalone"], None)]
    for args, expected in cases:
        p = subprocess.Popen([sys.executable, "-c", "import sys; print(flush=True); sys.stdin.read()", "-m",
                              "torch.distributed.run", *args, "prog.py"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        try:
            p.stdout.readline()                                          # it runs: its command line is set
            assert mc._rdzv_endpoint(p.pid) == expected, args
        finally:
            p.communicate(b"")
    assert mc._rdzv_endpoint(os.getpid()) is None                      # not a torchrun
    assert mc.rendezvous_node() is None                                 # no rendezvous here


def test_demo_runs_alone_in_a_world_of_one():
    # without torchrun the demo's collectives are not available; its pieces still agree
    from dtrain_lab.demos import multinode_check as mc

    a, b = mc._model(), mc._model()
    assert torch.equal(mc._flat(a), mc._flat(b))
    x0, _ = mc._batch(0)
    x1, _ = mc._batch(1)
    assert not torch.equal(x0, x1)
