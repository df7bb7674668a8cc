"""DeepSpeed on this machine: importing it the course's way, the cache of its compiled ops, and what
it can run here (:func:`probe_features`) — found by asking DeepSpeed and torch, no traceback wall.

The first ``deepspeed.initialize`` of a process JIT-compiles a small C++ op (the CPU shared-memory
all-reduce, ``ShareMemCommBuilder``; g++ and 20-60 s). The build is cached in ``TORCH_EXTENSIONS_DIR``,
which :func:`extensions_dir` points at ``<checkout>/.torch_extensions`` unless it is already set
(every launched rank imports this module, so they all use the same cache); :func:`warm` builds it
once (``python -m dtrain_lab.parallel.deepspeed_lab --warm``, which ``make env`` runs).
"""
from __future__ import annotations

import contextlib
import io
import logging
import os
import sys
import time
import warnings
from pathlib import Path

import torch.distributed as dist

from dtrain_lab import caps
from dtrain_lab.comm import groups
from dtrain_lab.i18n import tr

__all__ = ["extensions_dir", "cuda_available", "import_deepspeed", "has_compiler", "fp16_supported",
           "probe_features", "warm"]

_REPO = Path(__file__).resolve().parents[2]


def _same_ninja() -> None:
    """Build with the ``ninja`` installed beside this Python (pip's, a DeepSpeed dependency) whatever
    ``PATH`` says. ninja records a hash of each build command in the cache's ``.ninja_log``, and
    versions hash differently: a process that found the system's ninja 1.11 first and one that found
    pip's 1.13 rebuilt the op (g++, about a minute) every time they alternated (seen on this course's CI
    machine, where ``make`` puts the environment's ``bin`` first and a bare ``python`` does not)."""
    here = os.path.dirname(sys.executable)
    if os.path.isfile(os.path.join(here, "ninja")):
        path = os.environ.get("PATH", "")
        if path.split(os.pathsep)[:1] != [here]:
            os.environ["PATH"] = os.pathsep.join([here, path]) if path else here


def extensions_dir() -> str:
    """Where compiled ops are cached: ``$TORCH_EXTENSIONS_DIR`` if set, else ``<checkout>/.torch_extensions``
    (inside a source checkout; elsewhere torch's default ``~/.cache/torch_extensions``). Sets the
    variable, and puts this Python's ``ninja`` first on ``PATH`` (:func:`_same_ninja`), so that every rank
    launched from here uses the same cache and the same build tool."""
    _same_ninja()
    current = os.environ.get("TORCH_EXTENSIONS_DIR")
    if current:
        return current
    if (_REPO / "pyproject.toml").is_file() and os.access(_REPO, os.W_OK):
        path = str(_REPO / ".torch_extensions")
        os.environ["TORCH_EXTENSIONS_DIR"] = path
        return path
    return os.path.join(os.path.expanduser("~"), ".cache", "torch_extensions")


def cuda_available() -> bool:
    return caps.have("cuda")


def _quiet_logs() -> None:
    with contextlib.suppress(Exception):
        from deepspeed.utils import logger

        logger.setLevel(logging.WARNING)


def _device_type() -> str:
    """Where this process trains: the process group's device if one is open (NCCL: a GPU), else a GPU
    if there is one."""
    if groups.initialized():
        return "cuda" if dist.get_backend() == "nccl" else "cpu"
    return "cuda" if cuda_available() else "cpu"


def import_deepspeed(device_type: str | None = None):
    """Import deepspeed the course's way: the cache directory set, the CPU accelerator chosen when
    this process trains on the CPU (``DS_ACCELERATOR=cpu``; ``device_type`` default: see
    :func:`_device_type`), DeepSpeed's INFO logs silenced."""
    if "deepspeed" not in sys.modules:
        extensions_dir()
        if "DS_ACCELERATOR" not in os.environ and (device_type or _device_type()) == "cpu":
            os.environ["DS_ACCELERATOR"] = "cpu"
    import deepspeed

    _quiet_logs()
    _skip_shm_op_without_compiler(deepspeed)
    # torch 2.13 marks the collectives ZeRO calls (all_gather_into_tensor, reduce_scatter_tensor) as
    # deprecated and warns on every call: one line per step per rank would bury the lesson's output
    warnings.filterwarnings("ignore", message=r"`torch\.distributed\.\w+` is deprecated", category=FutureWarning)
    return deepspeed


def has_compiler() -> bool:
    return caps.have("compiler")


def _skip_shm_op_without_compiler(deepspeed) -> None:
    """Without g++/ninja the CPU accelerator's shared-memory op cannot be built, and DeepSpeed's
    ``init_distributed`` would fail trying. That op only serves ``inference_all_reduce``; training
    collectives go through torch.distributed either way. So when it cannot be built (and is not in
    the cache), mark it incompatible in DeepSpeed's own table of ops (``deepspeed.ops.__compatible_ops__``,
    a module-level dict meant to persist edits) and DeepSpeed skips it."""
    if getattr(_skip_shm_op_without_compiler, "done", False):
        return
    _skip_shm_op_without_compiler.done = True  # type: ignore[attr-defined]
    with contextlib.suppress(Exception):
        from deepspeed.accelerator import get_accelerator

        builder = get_accelerator().create_op_builder("ShareMemCommBuilder")
        if builder is None or has_compiler() or any(Path(extensions_dir()).glob(f"{builder.NAME}/*.so")):
            return
        deepspeed.ops.__compatible_ops__[builder.NAME] = False


def fp16_supported() -> bool:
    """True where DeepSpeed accepts ``fp16``: a CUDA GPU, or a CPU whose oneDNN has fp16 kernels (the
    CPU accelerator's own test, ``torch.ops.mkldnn._is_mkldnn_fp16_supported``)."""
    return caps.have("cuda") or caps.have("cpu_fp16")


def _why(feature: str, lang: str | None = None) -> str:
    """Why ``feature`` ("fp16", "fused_adam", "cpu_adam") is not usable here, in the learner's language."""
    key = {"fp16": "ds_no_fp16", "fused_adam": "ds_no_fused_adam", "cpu_adam": "ds_why_cpu_adam"}[feature]
    return tr(key, lang)


def probe_features(lang: str | None = None) -> list[dict]:
    """What DeepSpeed can do on this machine, found by asking DeepSpeed and torch (nothing compiled).

    One row per feature: ``feature``, ``ok`` (usable now, without compiling anything), ``detail``
    (in the learner's language). Checks: the accelerator DeepSpeed picked and its communication
    backend, bf16 and fp16 support, whether each compiled op (FusedAdam, CPU Adam, the shared-memory
    all-reduce) is prebuilt, already in the JIT cache, or would need a compile (and whether g++/ninja
    exist), and whether a CUDA GPU is present for NCCL/offload.
    """
    deepspeed = import_deepspeed()
    from deepspeed.accelerator import get_accelerator
    from deepspeed.git_version_info import installed_ops

    acc = get_accelerator()
    rows = [{"feature": "accelerator", "ok": True,
             "detail": f"{acc._name} / {acc.communication_backend_name()} (DeepSpeed {deepspeed.__version__})"}]
    bf16 = bool(acc.is_bf16_supported())
    rows.append({"feature": "bf16", "ok": bf16, "detail": tr("ds_works", lang, what="bf16.enabled") if bf16 else "—"})
    ok16 = fp16_supported()
    rows.append({"feature": "fp16", "ok": ok16,
                 "detail": tr("ds_works", lang, what="fp16.enabled") if ok16 else _why("fp16", lang)})
    compiler = has_compiler()
    cache = Path(extensions_dir())
    for op_class, name in (("FusedAdamBuilder", "fused_adam"), ("CPUAdamBuilder", "cpu_adam"),
                           ("ShareMemCommBuilder", "shm_comm")):
        try:
            builder = acc.create_op_builder(op_class)
        except Exception:  # noqa: BLE001
            builder = None
        if builder is None:
            rows.append({"feature": name, "ok": False, "detail": tr("ds_op_not_here", lang)})
            continue
        prebuilt = bool(installed_ops.get(builder.NAME, False))
        cached = any(cache.glob(f"**/{builder.NAME}*.so"))
        if prebuilt or cached:
            detail = tr("ds_op_prebuilt", lang) if prebuilt else tr("ds_op_cached", lang, cache=cache)
            rows.append({"feature": name, "ok": True, "detail": detail})
            continue
        if name == "cpu_adam" or (name == "fused_adam" and not cuda_available()):
            detail = _why(name, lang)
        else:
            detail = tr("ds_compiled_on_first_use", lang)
        if not compiler:
            detail += tr("ds_no_compiler", lang)
        rows.append({"feature": name, "ok": False, "detail": detail})
    gpu = cuda_available()
    rows.append({"feature": "nccl", "ok": gpu, "detail": tr("ds_gpu" if gpu else "ds_no_gpu", lang)})
    return rows


def warm(verbose: bool = True) -> dict:
    """Compile (or find in the cache) the op ``deepspeed.init_distributed`` needs on this accelerator."""
    deepspeed = import_deepspeed()
    from deepspeed.accelerator import get_accelerator

    t0 = time.time()
    acc = get_accelerator()
    builder = acc.create_op_builder("ShareMemCommBuilder")
    built = None
    if builder is not None and deepspeed.ops.__compatible_ops__.get(builder.NAME, False):
        sink = io.StringIO()
        with contextlib.redirect_stdout(sink):
            builder.load(verbose=False)
        built = builder.NAME
    info = {"accelerator": acc._name, "op": built, "cache": extensions_dir(), "seconds": round(time.time() - t0, 1)}
    if verbose:
        if built:
            print(tr("ds_op_ready", op=built, cache=info["cache"], seconds=info["seconds"]), flush=True)
        else:
            print(tr("ds_nothing_to_compile", accelerator=acc._name), flush=True)
    return info
