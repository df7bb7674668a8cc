"""Multi-node jobs: two "nodes" on one machine, and job files for SLURM and Kubernetes.

* :mod:`dtrain_lab.jobs.nodes`: :func:`run_local_nodes` starts ``nnodes`` torchrun agents on this
  machine joined by a c10d rendezvous over loopback, exactly what happens on a cluster minus the
  network, and rebuilds the job's ranks from what the workers were really given
  (:class:`NodesResult`).
* :mod:`dtrain_lab.jobs.jobfiles`: :class:`ClusterJob`, one validated description of a job written
  out as a SLURM batch script, a Kubeflow ``TrainJob`` or ``PyTorchJob``, or an indexed Kubernetes
  ``Job``; :func:`main` is ``dtrain-lab cluster``.

This module keeps the names lessons and tests use (``cluster.run_local_nodes``, ``cluster.ClusterJob``).
"""
from __future__ import annotations

from dtrain_lab.jobs.jobfiles import FORMATS, RESERVED_ENV, ClusterJob, main
from dtrain_lab.jobs.nodes import NodeInfo, NodesResult, free_port, run_local_nodes

__all__ = ["run_local_nodes", "NodesResult", "NodeInfo", "free_port", "ClusterJob", "FORMATS", "RESERVED_ENV",
           "main"]
