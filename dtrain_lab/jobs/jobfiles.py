"""Job files for SLURM and Kubernetes, written from one validated description of a job.

:class:`ClusterJob` is written out as

* a SLURM batch script (:meth:`ClusterJob.slurm`),
* a Kubeflow Trainer v2 ``TrainJob`` (:meth:`ClusterJob.trainjob`),
* a Kubeflow Training Operator v1 ``PyTorchJob`` (:meth:`ClusterJob.pytorchjob`),
* a plain Kubernetes indexed ``Job`` with its headless ``Service`` (:meth:`ClusterJob.k8s_job`).

Field names were checked against these sources (November 2026):

* Kubeflow Trainer ``pkg/apis/trainer/v1alpha1/trainjob_types.go``: ``spec.runtimeRef``
  (``name``, ``apiGroup`` default ``trainer.kubeflow.org``, ``kind`` default
  ``ClusterTrainingRuntime``), ``spec.trainer`` (``image``, ``command``, ``args``, ``env``,
  ``numNodes``, ``resourcesPerNode``, ``numProcPerNode``); ``pkg/runtime/framework/plugins/torch/torch.go``:
  the torch plugin injects ``PET_NNODES``, ``PET_NPROC_PER_NODE``, ``PET_NODE_RANK`` (the job
  completion index), ``PET_MASTER_ADDR`` (``<name>-node-0-0.<name>``), ``PET_MASTER_PORT``, and
  rejects these reserved names in ``trainer.env``; torchrun reads ``PET_<OPTION>`` as the default
  of ``--<option>``. The runtime name ``torch-distributed`` is the one in the Kubeflow runtime guide
  (kubeflow.org/docs/components/trainer/operator-guides/runtime).
* Kubeflow Training Operator ``pkg/apis/kubeflow.org/v1/pytorch_types.go``: ``spec.pytorchReplicaSpecs``
  (``Master``/``Worker``), ``spec.nprocPerNode`` (a string), ``spec.runPolicy``, ``elasticPolicy``
  (``rdzvBackend``, ``maxRestarts``, ...); the container must be named ``pytorch`` and its port
  ``pytorchjob-port``; ``pkg/controller.v1/pytorch/master.go``: every pod gets ``MASTER_ADDR``
  (``<name>-master-0``) and ``MASTER_PORT``.
* Kubernetes: "Job with Pod-to-Pod Communication" (kubernetes.io/docs/tasks/job/job-with-pod-to-pod-communication):
  ``completionMode: Indexed`` gives pods the hostname ``<job>-<index>``, resolvable as
  ``<job>-<index>.<service>`` once a headless Service (``clusterIP: None``, selector
  ``job-name: <job>``) is the pods' ``subdomain``; "Indexed Job for Parallel Processing"
  (kubernetes.io/docs/tasks/job/indexed-parallel-processing-static): the index is in
  ``JOB_COMPLETION_INDEX``; ``emptyDir`` with ``medium: Memory`` and ``sizeLimit`` is a tmpfs that
  counts against the container's memory limit (API reference of ``EmptyDirVolumeSource``).
* SLURM / PyTorch: the first node of the allocation from ``scontrol show hostnames
  "$SLURM_JOB_NODELIST"`` (first line; ``sed -n 1p`` rather than ``head -n1``, which under
  ``set -o pipefail`` can fail the script with SIGPIPE, exit 141 -- seen in our test); one ``srun``
  task per node (``--ntasks-per-node=1``) running one torchrun agent; the torchrun quick start
  (pytorch.org/docs/stable/elastic/quickstart.html):
  ``--rdzv-backend=c10d --rdzv-endpoint=HOST:PORT --rdzv-id=JOB_ID`` on every node, 29400 the default port.
"""
from __future__ import annotations

import argparse
import re
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from dtrain_lab.i18n import LabError, tr
from dtrain_lab.nccl import lint_env

_NAME_RE = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")          # RFC 1035 label (TrainJob's own rule)
_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_QUANTITY_RE = re.compile(r"^([1-9][0-9]*)(Mi|Gi|Ti)$")
_TIME_RE = re.compile(r"^(?:(\d+)-)?(\d{1,2}):(\d{2}):(\d{2})$")
_MODULE_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
# set by torchrun, SLURM or the operators: a job file must not set them itself
RESERVED_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR",
                "MASTER_PORT", "NODE_RANK", "JOB_COMPLETION_INDEX")
_MIB = {"Mi": 1, "Gi": 1024, "Ti": 1024 * 1024}
FORMATS = ("slurm", "trainjob", "pytorchjob", "job")


def _mib(quantity: str) -> int:
    m = _QUANTITY_RE.match(quantity)
    assert m is not None
    return int(m.group(1)) * _MIB[m.group(2)]


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


@dataclass
class ClusterJob:
    """One multi-node torchrun job, validated on creation; ``slurm()``, ``trainjob()``,
    ``pytorchjob()`` and ``k8s_job()`` write it for each system.

    Exactly one of ``module`` (``python -m`` style) and ``script`` (a path inside the image / on the
    shared file system) names the program. ``gpus_per_node=0`` is a CPU job (``nproc_per_node``
    processes per node, default 1). ``memory`` and ``shm_size`` are Kubernetes quantities
    (``"64Gi"``, ``"512Mi"``); ``/dev/shm`` is memory, so ``shm_size`` must be smaller than
    ``memory``. ``env`` is checked by :func:`dtrain_lab.nccl.lint_env` (``NCCL_SOCKET_IFNAME`` is
    written only when you give it). ``time_limit`` is ``[D-]HH:MM:SS``.
    """

    name: str
    nnodes: int
    gpus_per_node: int = 0
    module: str | None = None
    script: str | None = None
    args: Sequence[str] = ()
    image: str | None = None
    cpus: int = 8
    memory: str = "32Gi"
    shm_size: str = "8Gi"
    nproc_per_node: int | None = None
    rdzv_port: int = 29400
    max_restarts: int = 0
    env: Mapping[str, str] = field(default_factory=dict)
    time_limit: str = "01:00:00"
    partition: str | None = None
    namespace: str = "default"
    runtime: str = "torch-distributed"

    def __post_init__(self):
        self.args = [str(a) for a in self.args]
        self.env = {str(k): str(v) for k, v in dict(self.env).items()}
        self.validate()

    # ------------------------------------------------------------------------------- validation
    def validate(self) -> None:
        """Raise a bilingual :class:`LabError` naming the first bad field and its value."""
        if not isinstance(self.name, str) or not _NAME_RE.match(self.name) or len(self.name) > 40:
            raise LabError("cl_bad_name", value=self.name)
        for name, lo, hi in (("nnodes", 1, 4096), ("gpus_per_node", 0, 64), ("cpus", 1, 4096),
                             ("rdzv_port", 1024, 65535), ("max_restarts", 0, 1000)):
            v = getattr(self, name)
            if not _is_int(v) or not lo <= v <= hi:
                raise LabError("cl_bad_range", field=name, value=v, lo=lo, hi=hi)
        if self.nproc_per_node is not None and (not _is_int(self.nproc_per_node) or self.nproc_per_node < 1):
            raise LabError("cl_bad_int", field="nproc_per_node", value=self.nproc_per_node, lo=1)
        if self.gpus_per_node and self.nproc_per_node not in (None, self.gpus_per_node):
            raise LabError("cl_nproc_gpus", nproc=self.nproc_per_node, gpus=self.gpus_per_node)
        if (self.module is None) == (self.script is None):
            raise LabError("cl_program", module=self.module, script=self.script)
        if self.module is not None and not _MODULE_RE.match(str(self.module)):
            raise LabError("cl_bad_module", value=self.module)
        if self.script is not None and (not isinstance(self.script, str) or not self.script.strip()):
            raise LabError("cl_bad_module", value=self.script)
        for name in ("memory", "shm_size"):
            v = getattr(self, name)
            if not isinstance(v, str) or not _QUANTITY_RE.match(v):
                raise LabError("cl_bad_quantity", field=name, value=v)
        if _mib(self.shm_size) >= _mib(self.memory):
            raise LabError("cl_shm_memory", shm=self.shm_size, memory=self.memory)
        if not isinstance(self.time_limit, str) or not _TIME_RE.match(self.time_limit) or self.seconds() <= 0:
            raise LabError("cl_bad_time", value=self.time_limit)
        if self.image is not None and (not isinstance(self.image, str) or not self.image.strip()
                                       or any(c.isspace() for c in self.image)):
            raise LabError("cl_bad_image", value=self.image)
        if not isinstance(self.namespace, str) or not _NAME_RE.match(self.namespace):
            raise LabError("cl_bad_name", value=self.namespace)
        for k in self.env:
            if not _ENV_NAME_RE.match(k):
                raise LabError("cl_env_name", name=k)
            if k in RESERVED_ENV or k.startswith("PET_") or k.startswith("TORCHELASTIC_"):
                raise LabError("cl_env_reserved", name=k)
        for f in lint_env(self.env):
            if f.severity == "error":
                # the finding's own message, rendered in each half's language
                raise LabError("cl_env_lint", name=f.var, value=self.env.get(f.var, ""),
                               finding=LabError(f.key, **f.fields))

    def seconds(self) -> int:
        m = _TIME_RE.match(self.time_limit)
        assert m is not None
        d, h, mi, s = (int(x) if x else 0 for x in m.groups())
        if mi > 59 or s > 59:
            return -1
        return ((d * 24 + h) * 60 + mi) * 60 + s

    @property
    def nproc(self) -> int:
        """Processes per node: one per GPU, else ``nproc_per_node`` (default 1)."""
        return self.gpus_per_node or self.nproc_per_node or 1

    @property
    def world_size(self) -> int:
        return self.nnodes * self.nproc

    def program(self) -> list[str]:
        return (["-m", self.module] if self.module else [str(self.script)]) + list(self.args)

    def torchrun(self, endpoint: str, rdzv_id: str, nnodes: str | None = None) -> list[str]:
        """The torchrun command every node runs (c10d rendezvous: no ``--node-rank``)."""
        return ["torchrun", f"--nnodes={nnodes or self.nnodes}", f"--nproc-per-node={self.nproc}",
                "--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}", f"--rdzv-id={rdzv_id}",
                f"--max-restarts={self.max_restarts}"] + self.program()

    def _need_image(self) -> str:
        if not self.image:
            raise LabError("cl_need_image", name=self.name)
        return self.image

    def _resources(self) -> dict:
        limits: dict[str, Any] = {"cpu": self.cpus, "memory": self.memory}
        if self.gpus_per_node:
            limits["nvidia.com/gpu"] = self.gpus_per_node
        return {"limits": dict(limits), "requests": dict(limits)}

    def _env_list(self) -> list[dict]:
        return [{"name": k, "value": v} for k, v in self.env.items()]

    def _shm(self) -> tuple[dict, dict]:
        volume = {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": self.shm_size}}
        return volume, {"name": "dshm", "mountPath": "/dev/shm"}

    # ------------------------------------------------------------------------------- SLURM
    def slurm(self) -> str:
        """An ``sbatch`` script: one task per node, each running one torchrun agent.

        The rendezvous host is the first node of the allocation (its address: a SLURM node name need
        not be a host name); every node gets the same
        ``--rdzv-endpoint`` and ``--rdzv-id=$SLURM_JOB_ID``; the node rank comes from the c10d
        rendezvous (``$SLURM_NODEID`` would only be needed with ``--rdzv-backend=static``).
        ``/dev/shm`` on SLURM is the node's own (no per-job size to set here).
        """
        slurm_mem = re.sub(r"(Mi|Gi|Ti)$", lambda m: m.group(1)[0], self.memory)   # 64Gi -> 64G
        lines = ["#!/bin/bash",
                 f"#SBATCH --job-name={self.name}",
                 f"#SBATCH --nodes={self.nnodes}",
                 "#SBATCH --ntasks-per-node=1",
                 f"#SBATCH --cpus-per-task={self.cpus}",
                 f"#SBATCH --mem={slurm_mem}",
                 f"#SBATCH --time={self.time_limit}"]
        if self.gpus_per_node:
            lines.append(f"#SBATCH --gpus-per-node={self.gpus_per_node}")
        if self.partition:
            lines.append(f"#SBATCH --partition={self.partition}")
        lines += ["#SBATCH --output=%x-%j.out",
                  "# Written by `dtrain-lab cluster slurm`. One srun task per node; each task is one torchrun",
                  "# agent that starts --nproc-per-node workers. The c10d rendezvous assigns node ranks.",
                  "set -euo pipefail",
                  "# the first node hosts the rendezvous; sed reads all of scontrol's output (with pipefail,",
                  "# `| head -n1` can end the script: scontrol may get SIGPIPE once head has exited)",
                  'head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p)',
                  # its address as SLURM has it (a node's name need not resolve); `grep .` fails the script
                  # (set -e) when there is none
                  """head_addr=$(scontrol show node "$head_node" | sed -n 's/.*NodeAddr=\\([^ ]*\\).*/\\1/p' | grep .)""",
                  f"export OMP_NUM_THREADS=${{OMP_NUM_THREADS:-{max(1, self.cpus // self.nproc)}}}"]
        for k, v in self.env.items():
            lines.append(f"export {k}={shlex.quote(v)}")
        cmd = self.torchrun(f"$head_addr:{self.rdzv_port}", "$SLURM_JOB_ID", nnodes="$SLURM_NNODES")
        quoted = [c if "$" in c else shlex.quote(c) for c in cmd]
        quoted = [f'"{c}"' if "$" in c else c for c in quoted]
        lines.append("srun --kill-on-bad-exit=1 " + " ".join(quoted))
        return "\n".join(lines) + "\n"

    # ------------------------------------------------------------------------------- Kubeflow v2
    def trainjob_dict(self) -> dict:
        """Kubeflow Trainer v2 ``TrainJob`` referring to the ``ClusterTrainingRuntime`` ``runtime``.

        The torch runtime sets ``PET_NNODES``, ``PET_NPROC_PER_NODE``, ``PET_NODE_RANK``,
        ``PET_MASTER_ADDR`` and ``PET_MASTER_PORT``, which torchrun reads, so the command is a bare
        ``torchrun``. Restarts and ``/dev/shm`` belong to the runtime's pod template (ask the
        cluster's administrators), and the TrainJob has no time-limit field of its own.
        """
        trainer: dict[str, Any] = {
            "image": self._need_image(),
            "command": ["torchrun"] + self.program(),
            "numNodes": self.nnodes,
            "numProcPerNode": self.nproc,
            "resourcesPerNode": self._resources(),
        }
        if self.env:
            trainer["env"] = self._env_list()
        return {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": {"runtimeRef": {"name": self.runtime, "apiGroup": "trainer.kubeflow.org",
                                        "kind": "ClusterTrainingRuntime"},
                         "trainer": trainer}}

    # ------------------------------------------------------------------------------- Kubeflow v1
    def pytorchjob_dict(self) -> dict:
        """Training Operator v1 ``PyTorchJob``: one Master and ``nnodes - 1`` Workers.

        The operator gives every pod ``MASTER_ADDR=<name>-master-0`` and ``MASTER_PORT`` (the port
        named ``pytorchjob-port``); torchrun uses them as the c10d rendezvous endpoint (Kubernetes
        expands ``$(VAR)`` in ``command``).
        """
        image = self._need_image()
        volume, mount = self._shm()

        def replica(n: int) -> dict:
            return {"replicas": n, "restartPolicy": "OnFailure",
                    "template": {"spec": {
                        "containers": [{
                            "name": "pytorch", "image": image,
                            "command": self.torchrun("$(MASTER_ADDR):$(MASTER_PORT)", self.name),
                            "ports": [{"name": "pytorchjob-port", "containerPort": self.rdzv_port}],
                            **({"env": self._env_list()} if self.env else {}),
                            "resources": self._resources(), "volumeMounts": [mount]}],
                        "volumes": [volume]}}}

        specs = {"Master": replica(1)}
        if self.nnodes > 1:
            specs["Worker"] = replica(self.nnodes - 1)
        return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": {"nprocPerNode": str(self.nproc),
                         "runPolicy": {"activeDeadlineSeconds": self.seconds(),
                                       "backoffLimit": self.max_restarts, "cleanPodPolicy": "Running"},
                         "pytorchReplicaSpecs": specs}}

    # ------------------------------------------------------------------------------- plain Job
    def k8s_job_dicts(self) -> list[dict]:
        """A headless ``Service`` and an indexed ``Job`` of ``nnodes`` pods.

        Pod ``i`` is ``<name>-<i>`` (``JOB_COMPLETION_INDEX=i``), reachable as ``<name>-<i>.<name>``;
        pod 0 hosts the c10d rendezvous. The index is also given to the program as ``NODE_INDEX``
        (downward API, annotation ``batch.kubernetes.io/job-completion-index``) for logs; the node
        rank itself comes from the rendezvous.
        """
        image = self._need_image()
        volume, mount = self._shm()
        endpoint = f"{self.name}-0.{self.name}:{self.rdzv_port}"
        # the index through the downward API (what JOB_COMPLETION_INDEX itself is made from): a
        # "$(JOB_COMPLETION_INDEX)" reference would depend on where the controller adds that variable
        env = self._env_list() + [{"name": "NODE_INDEX", "valueFrom": {"fieldRef": {
            "fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}}]
        service = {"apiVersion": "v1", "kind": "Service",
                   "metadata": {"name": self.name, "namespace": self.namespace},
                   "spec": {"clusterIP": "None", "selector": {"job-name": self.name},
                            "publishNotReadyAddresses": True,
                            "ports": [{"name": "rdzv", "port": self.rdzv_port}]}}
        job = {"apiVersion": "batch/v1", "kind": "Job",
               "metadata": {"name": self.name, "namespace": self.namespace},
               "spec": {"completions": self.nnodes, "parallelism": self.nnodes, "completionMode": "Indexed",
                        "backoffLimit": self.max_restarts, "activeDeadlineSeconds": self.seconds(),
                        "template": {"spec": {
                            "subdomain": self.name, "restartPolicy": "Never",
                            "containers": [{
                                "name": "trainer", "image": image,
                                "command": self.torchrun(endpoint, self.name),
                                "ports": [{"name": "rdzv", "containerPort": self.rdzv_port}],
                                "env": env, "resources": self._resources(), "volumeMounts": [mount]}],
                            "volumes": [volume]}}}}
        return [service, job]

    # ------------------------------------------------------------------------------- text
    def trainjob(self) -> str:
        return _yaml([self.trainjob_dict()])

    def pytorchjob(self) -> str:
        return _yaml([self.pytorchjob_dict()])

    def k8s_job(self) -> str:
        return _yaml(self.k8s_job_dicts())

    def render(self, fmt: str) -> str:
        """``fmt`` is one of ``slurm``, ``trainjob``, ``pytorchjob``, ``job``."""
        table = {"slurm": self.slurm, "trainjob": self.trainjob, "pytorchjob": self.pytorchjob,
                 "job": self.k8s_job}
        if fmt not in table:
            raise LabError("cl_bad_format", value=fmt, choices=", ".join(FORMATS))
        return table[fmt]()


def _yaml(docs: list[dict]) -> str:
    import yaml  # PyYAML: only needed to write Kubernetes files

    class _Plain(yaml.SafeDumper):   # Master and Worker share dicts: write them out, no &id001 aliases
        def ignore_aliases(self, data):
            return True

    header = "# Written by `dtrain-lab cluster`. Check it against your cluster before `kubectl apply -f`.\n"
    return header + yaml.dump_all(docs, Dumper=_Plain, sort_keys=False, default_flow_style=False,
                                  allow_unicode=True)


# =============================================================================== command line
def main(argv: Sequence[str] | None = None) -> int:
    """``dtrain-lab cluster slurm|trainjob|pytorchjob|job --name N --nnodes 2 ... [-o FILE] [-- ARGS]``."""
    ap = argparse.ArgumentParser(prog="dtrain-lab cluster", description=tr("cl_cli_desc"), epilog=tr("cl_cli_epilog"))
    ap.add_argument("format", choices=FORMATS)
    ap.add_argument("--name", required=True)
    ap.add_argument("--nnodes", type=int, required=True)
    ap.add_argument("--gpus-per-node", type=int, default=0)
    ap.add_argument("--nproc-per-node", type=int)
    prog = ap.add_mutually_exclusive_group(required=True)
    prog.add_argument("-m", "--module")
    prog.add_argument("--script")
    ap.add_argument("--image")
    ap.add_argument("--cpus", type=int, default=8)
    ap.add_argument("--memory", default="32Gi")
    ap.add_argument("--shm-size", default="8Gi")
    ap.add_argument("--rdzv-port", type=int, default=29400)
    ap.add_argument("--max-restarts", type=int, default=0)
    ap.add_argument("--env", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--time", dest="time_limit", default="01:00:00")
    ap.add_argument("--partition")
    ap.add_argument("--namespace", default="default")
    ap.add_argument("--runtime", default="torch-distributed")
    ap.add_argument("-o", "--output", help=tr("cl_cli_output"))
    argv = list(sys.argv[1:] if argv is None else argv)
    program_args: list[str] = []
    if "--" in argv:   # everything after "--" is for the training program
        program_args = argv[argv.index("--") + 1:]
        argv = argv[:argv.index("--")]
    a = ap.parse_args(argv)
    try:
        env = {}
        for item in a.env:
            if "=" not in item:
                raise LabError("cl_env_name", name=item)
            k, v = item.split("=", 1)
            env[k] = v
        job = ClusterJob(name=a.name, nnodes=a.nnodes, gpus_per_node=a.gpus_per_node, module=a.module,
                         script=a.script, args=program_args, image=a.image, cpus=a.cpus, memory=a.memory,
                         shm_size=a.shm_size, nproc_per_node=a.nproc_per_node, rdzv_port=a.rdzv_port,
                         max_restarts=a.max_restarts, env=env, time_limit=a.time_limit,
                         partition=a.partition, namespace=a.namespace, runtime=a.runtime)
        text = job.render(a.format)
    except LabError as e:
        print(str(e), file=sys.stderr)
        return 2
    if a.output:
        Path(a.output).write_text(text)
        print(tr("cl_written", path=a.output, fmt=a.format))
    else:
        sys.stdout.write(text)
    return 0
