"""dtrain_lab.jobs.cluster.ClusterJob: one job written for SLURM, Kubeflow Trainer v2 (TrainJob), the
Training Operator v1 (PyTorchJob) and a plain indexed Job; the same nodes, ranks, rendezvous, GPUs,
shared memory and restarts in all four. The torchrun commands are parsed with torchrun's own
argument parser; the SLURM script is run by bash with stand-ins for scontrol and srun.
"""
import copy
import os
import shlex
import stat
import subprocess

import pytest
import yaml

from dtrain_lab.jobs.cluster import FORMATS, ClusterJob, main
from dtrain_lab.i18n import LabError

PARAMS = dict(name="lab-ddp", nnodes=3, gpus_per_node=4, module="dtrain_lab.demos.multinode_check",
              args=["--steps", "10"], image="pytorch/pytorch:2.7.1-cuda12.8-cudnn9-runtime", cpus=16,
              memory="64Gi", shm_size="16Gi", rdzv_port=29500, max_restarts=2,
              env={"NCCL_SOCKET_IFNAME": "eth0"}, time_limit="02:00:00", partition="gpu", namespace="ml")


@pytest.fixture(scope="module")
def job():
    return ClusterJob(**PARAMS)


def torchrun_args(argv, env=None, monkeypatch=None):
    """Parse a torchrun command line with torchrun's own parser (PET_* variables as defaults)."""
    from torch.distributed.run import get_args_parser

    assert argv[0] == "torchrun"
    if env and monkeypatch:
        for k, v in env.items():
            monkeypatch.setenv(k, v)
    return get_args_parser().parse_args(argv[1:])


def check_torchrun(a, endpoint):
    assert a.nnodes == "3" and a.nproc_per_node == "4"
    assert a.rdzv_backend == "c10d" and a.rdzv_endpoint == endpoint
    assert a.max_restarts == 2
    assert a.module is True and a.training_script == "dtrain_lab.demos.multinode_check"
    assert a.training_script_args == ["--steps", "10"]


# ------------------------------------------------------------------------------------------ SLURM
def test_slurm_directives(job):
    text = job.slurm()
    assert text.startswith("#!/bin/bash\n")
    directives = dict(line[len("#SBATCH --"):].split("=", 1) for line in text.splitlines()
                      if line.startswith("#SBATCH --"))
    assert directives["nodes"] == "3"
    assert directives["ntasks-per-node"] == "1"          # one torchrun agent per node
    assert directives["gpus-per-node"] == "4"
    assert directives["cpus-per-task"] == "16"
    assert directives["mem"] == "64G"
    assert directives["time"] == "02:00:00"
    assert directives["partition"] == "gpu"
    assert directives["job-name"] == "lab-ddp"
    assert "--node-rank" not in text                       # c10d assigns node ranks
    assert 'scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p' in text


def run_with_stand_ins(job, tmp_path, stubs: dict, env: dict) -> subprocess.CompletedProcess:
    """bash runs the job's SLURM script with ``stubs`` (name -> bash script) first on PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in stubs.items():
        p = bin_dir / name
        p.write_text(body)
        p.chmod(p.stat().st_mode | stat.S_IEXEC)
    script = tmp_path / "job.sbatch"
    script.write_text(job.slurm())
    return subprocess.run(["bash", str(script)], env={"PATH": f"{bin_dir}:/usr/bin:/bin", **env}, capture_output=True,
                          text=True, timeout=30)


def test_slurm_script_runs_with_stand_ins(job, tmp_path):
    """bash runs the script; scontrol/srun are stand-ins that print what they were given."""
    stubs = {
        # `show node NAME`: SLURM's record of a node; NodeAddr is where SLURM reaches it (a node's name
        # need not resolve), the address the script gives torchrun
        "scontrol": '#!/bin/bash\nif [ "$1 $2 $3" = "show node gpu-07" ]; then\n'
                    '  echo "NodeName=gpu-07 Arch=x86_64 CoresPerSocket=16"\n'
                    '  echo "   NodeAddr=10.1.0.7 NodeHostName=gpu-07 Version=22.05.8"\n  exit 0\nfi\n'
                    '[ "$1 $2" = "show hostnames" ] && [ "$3" = "gpu-[07-09]" ] || exit 9\n'
                    'printf "gpu-07\\ngpu-08\\ngpu-09\\n"\nfor i in $(seq 1 2000); do echo "gpu-x$i"; done\n',
        "srun": '#!/bin/bash\necho "NCCL_SOCKET_IFNAME=$NCCL_SOCKET_IFNAME"\nprintf "ARG %s\\n" "$@"\n',
    }
    out = run_with_stand_ins(job, tmp_path, stubs,
                             {"SLURM_JOB_NODELIST": "gpu-[07-09]", "SLURM_NNODES": "3", "SLURM_JOB_ID": "4242"})
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "NCCL_SOCKET_IFNAME=eth0"
    argv = [ln[4:] for ln in lines if ln.startswith("ARG ")]
    assert argv[0] == "--kill-on-bad-exit=1"
    a = torchrun_args(argv[1:])
    check_torchrun(a, "10.1.0.7:29500")                    # the first node of the allocation, by its NodeAddr
    assert a.rdzv_id == "4242"


def test_slurm_script_stops_when_the_head_node_has_no_address(job, tmp_path):
    """No NodeAddr in SLURM's record of the first node: the script fails before srun starts anything."""
    stubs = {"scontrol": '#!/bin/bash\n[ "$1 $2" = "show hostnames" ] && echo gpu-07 && exit 0\necho "NodeName=gpu-07"\n',
             "srun": '#!/bin/bash\necho SRUN-STARTED\n'}
    out = run_with_stand_ins(job, tmp_path, stubs, {"SLURM_JOB_NODELIST": "gpu-07", "SLURM_NNODES": "1", "SLURM_JOB_ID": "1"})
    assert out.returncode != 0 and "SRUN-STARTED" not in out.stdout


# ------------------------------------------------------------------------------------------ TrainJob
def test_trainjob(job, monkeypatch):
    # TrainJob is a CRD: kubernetes-validate has schemas for the built-in kinds only, so its fields are
    # checked by hand here (see test_k8s_job_matches_the_kubernetes_schema)
    doc = yaml.safe_load(job.trainjob())
    assert doc["apiVersion"] == "trainer.kubeflow.org/v1alpha1" and doc["kind"] == "TrainJob"
    assert doc["metadata"] == {"name": "lab-ddp", "namespace": "ml"}
    assert doc["spec"]["runtimeRef"] == {"name": "torch-distributed", "apiGroup": "trainer.kubeflow.org",
                                         "kind": "ClusterTrainingRuntime"}
    t = doc["spec"]["trainer"]
    assert t["numNodes"] == 3 and t["numProcPerNode"] == 4
    assert t["resourcesPerNode"]["limits"] == {"cpu": 16, "memory": "64Gi", "nvidia.com/gpu": 4}
    assert t["image"] == PARAMS["image"]
    assert t["env"] == [{"name": "NCCL_SOCKET_IFNAME", "value": "eth0"}]
    assert not any(e["name"].startswith("PET_") for e in t["env"])   # reserved by the torch plugin
    # what the torch runtime injects (kubeflow/trainer torch.go), read by torchrun as defaults
    pet = {"PET_NNODES": "3", "PET_NPROC_PER_NODE": "4", "PET_NODE_RANK": "1",
           "PET_MASTER_ADDR": "lab-ddp-node-0-0.lab-ddp", "PET_MASTER_PORT": "29400"}
    a = torchrun_args(t["command"], pet, monkeypatch)
    assert a.nnodes == "3" and a.nproc_per_node == "4" and a.node_rank == 1
    assert a.master_addr == "lab-ddp-node-0-0.lab-ddp"
    assert a.module and a.training_script == "dtrain_lab.demos.multinode_check"


# ------------------------------------------------------------------------------------------ PyTorchJob
def test_pytorchjob(job):
    # PyTorchJob is a CRD: no schema in kubernetes-validate, so its fields are checked by hand
    text = job.pytorchjob()
    assert "&id" not in text and "*id" not in text       # Master and Worker written out in full
    doc = yaml.safe_load(text)
    assert doc["apiVersion"] == "kubeflow.org/v1" and doc["kind"] == "PyTorchJob"
    spec = doc["spec"]
    assert spec["nprocPerNode"] == "4"
    reps = spec["pytorchReplicaSpecs"]
    assert reps["Master"]["replicas"] == 1 and reps["Worker"]["replicas"] == 2     # 3 nodes
    assert spec["runPolicy"]["activeDeadlineSeconds"] == 7200
    for role in ("Master", "Worker"):
        pod = reps[role]["template"]["spec"]
        (c,) = pod["containers"]
        assert c["name"] == "pytorch"                    # the operator looks for this name
        assert c["ports"] == [{"name": "pytorchjob-port", "containerPort": 29500}]
        assert c["resources"]["limits"]["nvidia.com/gpu"] == 4
        assert {"name": "NCCL_SOCKET_IFNAME", "value": "eth0"} in c["env"]
        check_shm(pod, c)
        # Kubernetes expands $(MASTER_ADDR)/$(MASTER_PORT), which the operator sets on every pod
        argv = [x.replace("$(MASTER_ADDR)", "lab-ddp-master-0").replace("$(MASTER_PORT)", "29500")
                for x in c["command"]]
        check_torchrun(torchrun_args(argv), "lab-ddp-master-0:29500")


def check_shm(pod, container):
    vol = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    assert vol[mounts["/dev/shm"]]["emptyDir"] == {"medium": "Memory", "sizeLimit": "16Gi"}


# ------------------------------------------------------------------------------------------ Job
def test_indexed_job_and_headless_service(job):
    svc, k8s_job = list(yaml.safe_load_all(job.k8s_job()))
    assert svc["kind"] == "Service" and svc["apiVersion"] == "v1"
    assert svc["spec"]["clusterIP"] == "None"            # headless: one DNS record per pod
    assert svc["spec"]["selector"] == {"job-name": "lab-ddp"}
    assert k8s_job["apiVersion"] == "batch/v1" and k8s_job["kind"] == "Job"
    spec = k8s_job["spec"]
    assert spec["completionMode"] == "Indexed"
    assert spec["completions"] == spec["parallelism"] == 3
    assert spec["backoffLimit"] == 2 and spec["activeDeadlineSeconds"] == 7200
    pod = spec["template"]["spec"]
    assert pod["subdomain"] == svc["metadata"]["name"]
    (c,) = pod["containers"]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 4
    index = {e["name"]: e for e in c["env"]}["NODE_INDEX"]
    assert index["valueFrom"]["fieldRef"]["fieldPath"] == \
        "metadata.annotations['batch.kubernetes.io/job-completion-index']"
    check_shm(pod, c)
    # pod 0 is "<job>-0", reachable as "<job>-0.<service>": it hosts the rendezvous
    host = f"{k8s_job['metadata']['name']}-0.{svc['metadata']['name']}"
    check_torchrun(torchrun_args(c["command"]), f"{host}:29500")


# the newest Kubernetes release kubernetes-validate 1.37.0 ships schemas for, and an older one (1.30; upstream
# support has ended, but clusters lag behind): the same file must be accepted by both
K8S_VERSIONS = ("1.30", "1.37")


@pytest.mark.parametrize("override", [{}, dict(env={}, gpus_per_node=0, nproc_per_node=2), dict(nnodes=1)],
                         ids=["gpu", "cpu", "one-node"])
def test_k8s_job_matches_the_kubernetes_schema(override):
    """Every document of the plain Job file against the real Kubernetes OpenAPI schemas (offline).
    strict=True: an unknown (e.g. misspelled) field fails, not just a missing or mistyped one.
    The two CRDs (TrainJob, PyTorchJob) have no schema in kubernetes-validate: their tests check by hand."""
    kv = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate is not installed (pip install -e '.[dev]')")
    from kubernetes_validate.utils import all_versions

    assert all_versions()[-1] == "1.37.0"                 # the newest it ships is the one validated
    docs = ClusterJob(**dict(PARAMS, **override)).k8s_job_dicts()
    assert [d["kind"] for d in docs] == ["Service", "Job"]
    for version in K8S_VERSIONS:
        for doc in docs:
            assert kv.validate(doc, version, strict=True) == version, (doc["kind"], version)
    if override:
        return
    # the validator can fail: a misspelled field (top level and nested) and a wrong type
    svc, k8s_job = docs
    bad = copy.deepcopy(k8s_job)
    bad["spec"]["completionMod"] = bad["spec"].pop("completionMode")
    c = copy.deepcopy(k8s_job)
    c["spec"]["template"]["spec"]["containers"][0]["volumeMount"] = \
        c["spec"]["template"]["spec"]["containers"][0].pop("volumeMounts")
    typed = copy.deepcopy(svc)
    typed["spec"]["ports"][0]["port"] = "29500"
    for doc, needle in ((bad, "'completionMod' was unexpected"), (c, "'volumeMount' was unexpected"),
                        (typed, "'29500' is not of type 'integer'")):
        for version in K8S_VERSIONS:
            with pytest.raises(kv.ValidationError) as e:
                kv.validate(doc, version, strict=True)
            assert needle in e.value.message, e.value.message
    # and the CRDs are indeed outside its schemas
    for doc in (ClusterJob(**PARAMS).trainjob_dict(), ClusterJob(**PARAMS).pytorchjob_dict()):
        with pytest.raises(kv.SchemaNotFoundError):
            kv.validate(doc, K8S_VERSIONS[-1], strict=True)


def test_same_job_everywhere(job, monkeypatch):
    """World size, GPUs and the NCCL variable agree across the four outputs."""
    assert job.world_size == 12
    texts = {fmt: job.render(fmt) for fmt in FORMATS}
    for fmt, text in texts.items():
        assert "NCCL_SOCKET_IFNAME" in text and "eth0" in text, fmt
        assert "dtrain_lab.demos.multinode_check" in text, fmt
    assert ClusterJob(**PARAMS).render("job") == texts["job"]    # deterministic


def test_env_only_when_given_and_cpu_jobs():
    params = dict(PARAMS, env={}, gpus_per_node=0, nproc_per_node=2)
    cpu = ClusterJob(**params)
    assert cpu.nproc == 2 and cpu.world_size == 6
    for fmt in FORMATS:
        text = cpu.render(fmt)
        assert "NCCL_SOCKET_IFNAME" not in text and "nvidia.com/gpu" not in text and "gpus-per-node" not in text
    assert "env" not in yaml.safe_load(cpu.trainjob())["spec"]["trainer"]
    assert "--nproc-per-node=2" in cpu.slurm()
    argv = shlex.split(cpu.slurm().splitlines()[-1])
    assert argv[:2] == ["srun", "--kill-on-bad-exit=1"]


# ------------------------------------------------------------------------------------------ errors
BAD = [
    (dict(nnodes=0), "nnodes"), (dict(nnodes="2"), "nnodes"), (dict(name="Lab_DDP"), "'Lab_DDP'"),
    (dict(gpus_per_node=-1), "gpus_per_node"), (dict(cpus=0), "cpus"),
    (dict(memory="64GB"), "memory='64GB'"), (dict(shm_size="64Gi"), "shm_size=64Gi"),
    (dict(time_limit="2h"), "'2h'"), (dict(time_limit="01:75:00"), "'01:75:00'"),
    (dict(script="train.py"), "script='train.py'"), (dict(module="not a module"), "'not a module'"),
    (dict(rdzv_port=80), "rdzv_port"), (dict(max_restarts=-1), "max_restarts"),
    (dict(nproc_per_node=2), "nproc_per_node=2"), (dict(env={"RANK": "0"}), "RANK"),
    (dict(env={"PET_NNODES": "2"}), "PET_NNODES"), (dict(env={"BAD-NAME": "1"}), "BAD-NAME"),
    (dict(env={"NCCL_DEBUG": "LOUD"}), "NCCL_DEBUG='LOUD'"), (dict(image="has space"), "'has space'"),
]


@pytest.mark.parametrize("override,needle", BAD)
def test_bad_config_names_the_bad_factor(override, needle):
    with pytest.raises(LabError) as e:
        ClusterJob(**dict(PARAMS, **override))
    msg = str(e.value)
    assert needle in msg, msg
    zh, en = e.value.message("zh"), e.value.message("en")
    assert zh != en and zh in msg and en in msg           # both languages


def test_kubernetes_needs_an_image_and_formats_are_checked():
    job = ClusterJob(**dict(PARAMS, image=None))
    assert "#SBATCH" in job.slurm()                        # SLURM does not need one
    for fmt in ("trainjob", "pytorchjob", "job"):
        with pytest.raises(LabError, match="image"):
            job.render(fmt)
    with pytest.raises(LabError, match="'helm'"):
        job.render("helm")


# ------------------------------------------------------------------------------------------ CLI
def test_command_line(tmp_path, capsys):
    from dtrain_lab.cli import main as cli_main

    out = tmp_path / "job.yaml"
    rc = cli_main(["cluster", "job", "--name", "lab-ddp", "--nnodes", "3", "--gpus-per-node", "4",
                   "-m", "dtrain_lab.demos.multinode_check", "--image", PARAMS["image"], "--cpus", "16",
                   "--memory", "64Gi", "--shm-size", "16Gi", "--rdzv-port", "29500", "--max-restarts", "2",
                   "--env", "NCCL_SOCKET_IFNAME=eth0", "--time", "02:00:00", "--namespace", "ml",
                   "-o", str(out), "--", "--steps", "10"])
    assert rc == 0
    assert out.read_text() == ClusterJob(**PARAMS).k8s_job()
    rc = main(["slurm", "--name", "x", "--nnodes", "0", "-m", "m"])
    assert rc == 2
    assert "nnodes" in capsys.readouterr().err
    assert os.path.exists(out)


def test_run_passes_multinode_arguments(monkeypatch):
    """`dtrain-lab run` hands every multi-node argument, the rendezvous id included, to launch()."""
    import importlib

    from dtrain_lab.cli import main as cli_main

    launch_mod = importlib.import_module("dtrain_lab.jobs.launch")  # the package re-exports launch() itself

    seen = {}

    class Result:
        ok, hung, returncode = True, False, 0

    def fake_launch(target, **kw):
        seen.update(kw, target=target)
        return Result()

    monkeypatch.setattr(launch_mod, "launch", fake_launch)
    rc = cli_main(["run", "dtrain_lab.demos.multinode_check", "-n", "2", "--nnodes", "2", "--node-rank", "1",
                   "--rdzv-endpoint", "10.0.0.1:29400", "--rdzv-id", "job42", "--max-restarts", "1",
                   "--", "--steps", "3"])
    assert rc == 0
    assert seen["target"] == "dtrain_lab.demos.multinode_check"
    assert (seen["nproc"], seen["nnodes"], seen["node_rank"]) == (2, 2, 1)
    assert (seen["rdzv_endpoint"], seen["rdzv_id"], seen["max_restarts"]) == ("10.0.0.1:29400", "job42", 1)
    assert seen["args"] == ["--steps", "3"]
    # options may follow the target; the program's own ones go after "--", others get a clear message
    seen.clear()
    assert cli_main(["run", "train.py", "-n", "2", "--timeout", "30"]) == 0
    assert (seen["target"], seen["nproc"], seen["timeout"], seen["args"]) == ("train.py", 2, 30.0, [])
    seen.clear()
    assert cli_main(["run", "train.py", "-n", "2", "--lr", "3"]) == 2
    assert seen == {}
