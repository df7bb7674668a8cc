"""Red-team attack (issue 13, class 1 "import the grader's reference solution"): lab04.topk_ef
written by the course's own reference, which the exercise hides (``hide=`` binds a stub that
raises ImportError over ``dtrain_lab/parallel/compress_topk.py``). The stub covers the source
file only: the module's compiled bytecode, ``dtrain_lab/parallel/__pycache__/compress_topk.cpython-311.pyc``,
is still in the read-only package inside the sandbox (it exists wherever the package was imported
without PYTHONDONTWRITEBYTECODE, e.g. after ``pip install`` or a first ``import``), and a
SourcelessFileLoader loads it without looking at the source."""
import glob
import importlib
import importlib.machinery
import importlib.util
import os

import torch

import dtrain_lab.parallel
from dtrain_lab.grading.lab04 import ef_cases


def _reference():
    try:
        importlib.import_module("dtrain_lab.parallel.compress_topk")
    except ImportError:     # hidden, as the exercise says: the stub is in place
        pass
    else:
        raise RuntimeError("the module is not hidden: this attack proves nothing here")
    folder = os.path.join(os.path.dirname(dtrain_lab.parallel.__file__), "__pycache__")
    path = glob.glob(os.path.join(folder, "compress_topk.*.pyc"))[0]
    loader = importlib.machinery.SourcelessFileLoader("redteam_topk", path)
    spec = importlib.util.spec_from_loader("redteam_topk", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


REF = _reference()


def topk_ef_step(grad, residual, k, group=None):
    x = grad + residual
    dense, sent = REF.topk_sparse_allreduce(x, k, REF.CommState(group), index_dtype=torch.int64)
    return dense, x - sent


def run():
    return ef_cases(topk_ef_step)
