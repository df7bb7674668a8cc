"""Lesson 12's job under a real scheduler: the sbatch file ``dtrain-lab cluster slurm ... --nnodes 2`` writes
(CPU, gloo, no ``--gres``) is submitted to a local two-node SLURM cluster (tests/slurm_cluster.py).

Its two srun tasks are torchrun agents that meet through c10d; the ranks say which rank, local rank,
node and world they are. A task killed on one node ends the job on both (``srun --kill-on-bad-exit``);
within ``--max-restarts`` a rank killed once is restarted and the job ends well, with 0 it fails. Each
case is read from the job's output and ``scontrol show job``. Nothing of the cluster outlives it.

Skips in one line where SLURM is not installed or its daemons cannot start (a normal user); the CI leg
``slurm-job`` (tools/modes.sh) runs it with ``DTRAIN_REQUIRE_SLURM=1``, where a skip is a failure.
"""
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slurm_cluster import LocalSlurm, _free_ports, leftovers, unavailable

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
RANK_LINE = re.compile(r"^rank (\d+)/(\d+) local_rank (\d+) node\(group_rank\) (\d+)/(\d+) .*attempt (\d+) "
                       r"all_reduce=(\S+) ddp_vs_single=(\S+)", re.M)


def _need_slurm():
    why = unavailable()
    if why:
        if os.environ.get("DTRAIN_REQUIRE_SLURM") == "1":
            pytest.fail(f"DTRAIN_REQUIRE_SLURM=1 but {why}")
        pytest.skip(why)


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    _need_slurm()
    with LocalSlurm(tmp_path_factory.mktemp("slurm")) as cluster:
        yield cluster


def write_and_submit(slurm: LocalSlurm, folder: Path, *program_args: str, max_restarts: int = 0) -> tuple:
    """Write the job with the course's CLI and sbatch it: (job id, folder, submitted at)."""
    folder.mkdir(parents=True, exist_ok=True)
    cmd = [str(BIN / "dtrain-lab"), "cluster", "slurm", "--name", "mn", "--nnodes", "2",
           "-m", "dtrain_lab.demos.multinode_check", "--cpus", "1", "--memory", "1Gi", "--shm-size", "256Mi",
           "--rdzv-port", str(_free_ports(1)[0]), "--max-restarts", str(max_restarts), "--time", "00:05:00",
           "-o", str(folder / "job.sbatch"), "--", *program_args]
    subprocess.run(cmd, check=True, capture_output=True, timeout=60)
    script = (folder / "job.sbatch").read_text()
    assert "--gres" not in script and "--gpus" not in script          # a CPU job asks for no GPU
    t0 = time.monotonic()
    job_id = slurm.run("sbatch", "--parsable", "job.sbatch", cwd=folder,
                       env={"PATH": f"{BIN}:{slurm.env['PATH']}"}).stdout.strip().split(";")[0]
    return job_id, folder, t0


def finished(slurm: LocalSlurm, submitted: tuple, timeout: float = 180) -> tuple:
    """Wait until the job leaves the queue: (scontrol's record, the job's output, seconds from sbatch)."""
    job_id, folder, t0 = submitted
    state = slurm.wait_job(job_id, timeout=timeout)
    seconds = time.monotonic() - t0
    output = (folder / f"mn-{job_id}.out").read_text(errors="replace")
    return state, output, seconds


CASES = {"plain": ((), 0), "restart": (("--fail-once", "1"), 1), "kill_agent": (("--kill-agent", "1"), 1)}


@pytest.fixture(scope="module")
def jobs(slurm, tmp_path_factory):
    """The three cases, submitted at once (each node has 2 CPUs, a job takes 1 on each: two run at a time).
    (With ``--max-restarts 0`` the self-killed rank fails the job at once: torchrun's own behaviour, shown in
    tests/test_elastic.py through the course's launcher.)"""
    submitted = {name: write_and_submit(slurm, tmp_path_factory.mktemp(name), *args, max_restarts=mr)
                 for name, (args, mr) in CASES.items()}
    return {name: finished(slurm, sub) for name, sub in submitted.items()}


def _ranks(output: str) -> dict:
    """{(rank, attempt): (world, local_rank, node, nodes, all_reduce, ddp_vs_single)} from the ranks' lines."""
    return {(int(m[1]), int(m[6])): (int(m[2]), int(m[3]), int(m[4]), int(m[5]), float(m[7]), float(m[8]))
            for m in RANK_LINE.finditer(output)}


def test_two_node_job_runs_and_ranks_say_where_they_are(jobs):
    state, output, seconds = jobs["plain"]
    assert state["JobState"] == "COMPLETED" and state["ExitCode"] == "0:0", output[-3000:]
    assert state["NumNodes"] == "2" and state["NodeList"] == "n[1-2]"
    ranks = _ranks(output)
    assert sorted(ranks) == [(0, 0), (1, 0)], output[-3000:]
    # rank r of world 2, one process per node (local rank 0), node r of 2 (GROUP_RANK from the rendezvous)
    assert sorted((r, v[0], v[1], v[2], v[3]) for (r, _), v in ranks.items()) == [(0, 2, 0, 0, 2), (1, 2, 0, 1, 2)]
    for v in ranks.values():
        assert v[4] == 3.0                 # the all-reduce crossed the nodes: 1 + 2
        assert v[5] < 1e-6                 # one DDP step equals one process on the whole batch
    print(f"two-node SLURM job: {seconds:.1f} s from sbatch to the end of the job (run time {state['RunTime']})")


def test_rank_killed_once_is_restarted_within_max_restarts(jobs):
    state, output, _ = jobs["restart"]
    assert state["JobState"] == "COMPLETED", output[-3000:]
    assert "rank 1: killing myself (attempt 0)" in output
    ranks = _ranks(output)
    assert sorted(ranks) == [(0, 1), (1, 1)], output[-3000:]          # both finished, in the second attempt
    assert all(v[4] == 3.0 and v[5] < 1e-6 for v in ranks.values())


def test_task_killed_on_one_node_ends_the_job_on_both(jobs):
    # node 1's torchrun agent (the srun task there) is SIGKILLed; max-restarts cannot help a dead agent
    state, output, seconds = jobs["kill_agent"]
    assert state["JobState"] == "FAILED", output[-3000:]
    assert "killing the torchrun agent of node 1" in output
    assert re.search(r"srun: (Force Terminated|.*Terminating) StepId=\d+\.\d+", output), output[-3000:]
    assert not _ranks(output)
    # ended by SLURM at once, not by the job's 5-minute limit or a collective's timeout (30 min on gloo)
    assert state["JobState"] != "TIMEOUT" and state["RunTime"] < "00:01:00", state["RunTime"]


def test_nothing_of_a_cluster_is_left_after_it_stops(tmp_path):
    _need_slurm()
    cluster = LocalSlurm(tmp_path / "c")
    t0 = time.monotonic()
    with cluster:
        started = time.monotonic() - t0
        pids = cluster.pids()
        assert len(pids) == 4                                 # munged, slurmctld, two slurmd
        job = cluster.run("sbatch", "--parsable", "--nodes=2", "--output=/dev/null", "--wrap", "srun sleep 300").stdout.strip()
        deadline = time.monotonic() + 30
        while cluster.job_state(job).get("JobState") != "RUNNING" and time.monotonic() < deadline:
            time.sleep(0.2)
        assert cluster.job_state(job).get("JobState") == "RUNNING"
    left = leftovers(cluster.conf)
    assert not left, [p.info for p in left]
    assert not cluster.root.exists()
    print(f"local SLURM cluster: started in {started:.2f} s, stopped in {cluster.stop_s:.2f} s")


def test_a_cluster_whose_owner_is_killed_leaves_nothing(tmp_path):
    """The process that started the cluster dies without stopping it (a killed test worker): its janitor
    removes every daemon and job process."""
    _need_slurm()
    code = (f"import sys, time; sys.path.insert(0, {str(ROOT / 'tests')!r})\n"
            "from slurm_cluster import LocalSlurm\n"
            f"c = LocalSlurm({str(tmp_path / 'c')!r}).start()\n"
            "c.run('sbatch', '--nodes=2', '--output=/dev/null', '--wrap', 'srun sleep 300')\n"
            "print(c.conf, flush=True)\n"
            "time.sleep(300)\n")
    owner = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        conf = owner.stdout.readline().strip()
        assert conf, "the cluster did not start"
        time.sleep(1.0)
        assert leftovers(conf)
    finally:
        owner.kill()
        owner.wait()
    deadline = time.monotonic() + 20
    while leftovers(conf) and time.monotonic() < deadline:
        time.sleep(0.3)
    assert not leftovers(conf), [p.info for p in leftovers(conf)]
    assert not (tmp_path / "c").exists()
