"""dtrain-lab: the library behind the distributed-training course.

``import dtrain_lab`` imports nothing (the names below load on first use): the notebook's setup cell
and the launcher stay fast, torch is imported by the modules that need it, and the process-starting
code of :mod:`dtrain_lab.sandbox` runs as ``python -I -S`` with the standard library alone.

The library is layered; arrows point only downward (a test checks it from the AST):

=============== ================================================================================
course          ``cli`` · ``viz`` · ``bench`` · ``demos/`` (launch targets) · ``grading/`` · ``authoring``
jobs            ``jobs/``: ``launch`` · ``runtime`` · ``cluster`` · ``diagnose`` · ``monitor``
technique       ``parallel/`` (ddp, zero, fsdp, tensor, model, pipeline, accum, amp, compression,
                actckpt, hetero, dims, deepspeed_lab) · ``resilience/`` · ``nccl/``
base            ``comm/`` (group helpers, counted and from-scratch collectives) · ``models`` ·
                ``data`` · ``perfmodel`` · ``i18n`` · ``caps`` (what this machine can do, forceable) ·
                ``sandbox/`` (starting, containing and isolating processes; stdlib only)
=============== ================================================================================

Technique and base code take a process group and run as plain code at world size 1; they never
import the jobs or course layers. Whatever trains, times or launches is a demo or a bench.
"""
from __future__ import annotations

import importlib

__version__ = "0.1.0"
__all__ = ["launch", "LaunchResult", "set_lang", "get_lang", "LabError", "show", "__version__"]

# The flat names of the first version, kept for learners' own notebooks: ``from dtrain_lab import zero``
# still works. The course itself imports the layered paths.
_MOVED = {
    "collectives": "dtrain_lab.comm.collectives",
    "ddp": "dtrain_lab.parallel.ddp",
    "zero": "dtrain_lab.parallel.zero",
    "fsdp": "dtrain_lab.parallel.fsdp",
    "tensor_parallel": "dtrain_lab.parallel.tensor",
    "model_parallel": "dtrain_lab.parallel.model",
    "pipeline": "dtrain_lab.parallel.pipeline",
    "accum": "dtrain_lab.parallel.accum",
    "amp": "dtrain_lab.parallel.amp",
    "compression": "dtrain_lab.parallel.compression",
    "actckpt": "dtrain_lab.parallel.actckpt",
    "hetero": "dtrain_lab.parallel.hetero",
    "parallel_dims": "dtrain_lab.parallel.dims",
    "deepspeed_lab": "dtrain_lab.parallel.deepspeed_lab",
    "recovery": "dtrain_lab.resilience",
    "nccl_vars": "dtrain_lab.nccl.vars",
    "runtime": "dtrain_lab.jobs.runtime",
    "cluster": "dtrain_lab.jobs.cluster",
    "monitor": "dtrain_lab.jobs.monitor",
    "debug": "dtrain_lab.jobs.diagnose",
}


_LAZY = {"launch": "dtrain_lab.jobs.launch", "LaunchResult": "dtrain_lab.jobs.launch",
         "set_lang": "dtrain_lab.i18n", "get_lang": "dtrain_lab.i18n", "LabError": "dtrain_lab.i18n"}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    if name in _MOVED:
        return importlib.import_module(_MOVED[name])
    raise AttributeError(f"module 'dtrain_lab' has no attribute {name!r}")


def show(obj) -> None:
    """Show the source of a library object with syntax colouring (used by the lessons)."""
    from dtrain_lab.viz import show as _show

    _show(obj)
