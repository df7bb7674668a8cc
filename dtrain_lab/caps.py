"""What this machine can do, asked in one place: every probe whose answer can reach what a lesson
prints, what a launch chooses or what a grade decides.

Machines of the same kind differ: one CPU has fp16 kernels in oneDNN and the next has none, one
machine has bubblewrap or a C++ compiler and another has not, a learner may have GPUs. Code that
depends on such a fact asks :func:`have` (or :func:`gpu_count`), never the underlying API, and
``tests/test_caps.py`` checks that no module asks around this one.

Every probe can be **forced** for a test, a CI leg or a lesson that shows both cases, through the
environment (so launched ranks see the same answer)::

    DTRAIN_CAPS="cpu_fp16=0,sandbox=0" make test

or :func:`forced` in code. A probe that names something this machine cannot pretend to have (a GPU,
a compiler, a sandbox, a font) may only be forced *off*; forcing it on raises :class:`ValueError`.
``python -m dtrain_lab.caps`` prints every probe, its answer here, and the flags that flip each one.
"""
from __future__ import annotations

import contextlib
import functools
import os
import shutil
import sys
from dataclasses import dataclass
from typing import Callable, Iterator

ENV = "DTRAIN_CAPS"


@dataclass(frozen=True)
class Probe:
    name: str
    doc: str
    ask: Callable[[], bool]
    force_on: bool      # whether forcing it on is meaningful here (only decisions of this course's code depend on it)


def _cuda() -> bool:
    if "torch" not in sys.modules and not _torch_importable():
        return False
    import torch

    try:
        return bool(torch.cuda.is_available()) and torch.cuda.device_count() > 0
    except Exception:  # noqa: BLE001 - a broken driver means CPU
        return False


def _torch_importable() -> bool:
    import importlib.util

    return importlib.util.find_spec("torch") is not None


def _cpu_fp16() -> bool:
    """oneDNN has fp16 kernels on this CPU (AVX512-FP16 or AMX-FP16): what DeepSpeed's CPU accelerator asks."""
    import torch

    try:
        return bool(torch.ops.mkldnn._is_mkldnn_fp16_supported())
    except Exception:  # noqa: BLE001
        return False


def _cpu_bf16() -> bool:
    """oneDNN has native bf16 kernels on this CPU (AVX512-BF16 or AMX): fast bf16 matmuls, not correctness."""
    import torch

    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except Exception:  # noqa: BLE001
        return False


def _compiler() -> bool:
    return shutil.which(os.environ.get("CXX", "g++") or "g++") is not None and shutil.which("ninja") is not None


def _sandbox() -> bool:
    from dtrain_lab.sandbox import bwrap

    return bwrap.probe().ok


def _cgroup() -> bool:
    from dtrain_lab.sandbox import cgroup

    return not cgroup.why_not()


def _cjk_font() -> bool:
    from dtrain_lab import fonts

    return fonts.find_cjk_font() is not None


PROBES: dict[str, Probe] = {p.name: p for p in (
    Probe("cuda", "a CUDA GPU is visible (NCCL, GPU memory, exec-started ranks)", _cuda, False),
    Probe("cpu_fp16", "this CPU's oneDNN has fp16 kernels (DeepSpeed's CPU accelerator accepts fp16)", _cpu_fp16, True),
    Probe("cpu_bf16", "this CPU's oneDNN has native bf16 kernels", _cpu_bf16, True),
    Probe("compiler", "g++ and ninja are on PATH (DeepSpeed's JIT-compiled ops)", _compiler, False),
    Probe("sandbox", "the grader's bubblewrap sandbox can be built here", _sandbox, False),
    Probe("cgroup", "the grader can give each graded job a cgroup of its own (cpu, memory, pids)", _cgroup, False),
    Probe("cjk_font", "a font with Chinese glyphs is registered with matplotlib", _cjk_font, False),
)}


CORES = "cores"   # the one count among the probes: CPU cores this process may run on


def _parse(text: str) -> dict:
    out: dict = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, value = item.partition("=")
        name, value = name.strip(), value.strip().lower()
        if name == CORES and value.isdigit() and int(value) > 0:
            out[name] = int(value)
            continue
        if name not in PROBES or not sep or value not in ("0", "1", "true", "false", "on", "off"):
            raise ValueError(f"{ENV}: {item!r} is not NAME=0|1 with NAME one of {', '.join(PROBES)} "
                             f"(or {CORES}=N)")
        out[name] = value in ("1", "true", "on")
    return out


def _real_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:       # not Linux
        return os.cpu_count() or 1


def cores() -> int:
    """CPU cores this process may run on (its affinity mask on Linux); ``DTRAIN_CAPS=cores=N`` forces it."""
    return int(forcing().get(CORES) or _real_cores())


def forcing() -> dict:
    """The probes forced through ``DTRAIN_CAPS`` now."""
    return _parse(os.environ.get(ENV, ""))


@functools.lru_cache(maxsize=None)
def _real(name: str) -> bool:
    return bool(PROBES[name].ask())


def real(name: str) -> bool:
    """What the probe answers on this machine, whatever is forced."""
    return _real(name)


def have(name: str) -> bool:
    """The probe's answer: forced if ``DTRAIN_CAPS`` names it, else asked once per process."""
    if name not in PROBES:
        raise KeyError(f"unknown capability {name!r}; known: {', '.join(PROBES)}")
    forced_now = forcing()
    if name in forced_now:
        if forced_now[name] and not PROBES[name].force_on and not _real(name):
            raise ValueError(f"{ENV}: {name} cannot be forced on here: {PROBES[name].doc}, and this machine has not")
        return forced_now[name]
    return _real(name)


def sandbox_probe():
    """The grader's sandbox on this machine (:func:`dtrain_lab.sandbox.bwrap.probe`), or a failed probe
    that says why when ``sandbox`` is forced off."""
    from dtrain_lab.sandbox import bwrap

    if have("sandbox"):
        return bwrap.probe()
    return bwrap.Probe(False, None, f"{ENV}: sandbox=0 (forced off)")


def gpu_count() -> int:
    """CUDA GPUs visible to this process: 0 where ``cuda`` is absent or forced off."""
    if not have("cuda"):
        return 0
    import torch

    return torch.cuda.device_count()


@contextlib.contextmanager
def forced(**values: bool) -> Iterator[None]:
    """Force probes inside a ``with`` block (and in every job launched from it): ``forced(cpu_fp16=False)``."""
    now = forcing()
    for name, value in values.items():
        if name == CORES:
            now[name] = int(value)
            continue
        if name not in PROBES:
            raise KeyError(f"unknown capability {name!r}; known: {', '.join(PROBES)}")
        if value and not PROBES[name].force_on and not _real(name):
            raise ValueError(f"{name} cannot be forced on here: {PROBES[name].doc}, and this machine has not")
        now[name] = bool(value)
    saved = os.environ.get(ENV)
    os.environ[ENV] = ",".join(f"{k}={int(v)}" for k, v in sorted(now.items()))
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = saved


def flipped() -> dict:
    """Every probe set to the answer this machine does *not* give, where that can be forced: what the
    CI leg ``DTRAIN_CAPS=$(python -m dtrain_lab.caps --flipped)`` runs the notebooks with."""
    out: dict = {}
    for name, p in PROBES.items():
        answer = _real(name)
        if answer or p.force_on:
            out[name] = not answer
    out[CORES] = 1 if _real_cores() > 1 else 64
    return out


def summary() -> str:
    """One line: what this machine has, as the probes answer (forced ones marked)."""
    forced_now = forcing()
    parts = []
    for name in PROBES:
        mark = "*" if name in forced_now else ""
        parts.append(f"{name} {'yes' if have(name) else 'no'}{mark}")
    if "sandbox" in PROBES and have("sandbox"):
        from dtrain_lab.sandbox import bwrap

        system = shutil.which("bwrap")
        parts[list(PROBES).index("sandbox")] += " (" + ("system bubblewrap" if bwrap.probe().bwrap == system
                                                          else "the course's own bubblewrap") + ")"
    line = "this machine: " + ", ".join(parts) + f", {cores()} cores"
    return line + (f" (* forced by {ENV})" if forced_now else "")


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args == ["--flipped"]:
        print(",".join(f"{k}={int(v)}" for k, v in sorted(flipped().items())))
        return 0
    if args == ["--summary"]:
        print(summary())
        return 0
    flip = flipped()
    for name, p in PROBES.items():
        state = "yes" if _real(name) else "no"
        how = f"{name}={int(flip[name])}" if name in flip else "(cannot be forced on here)"
        print(f"{name:<10} {state:<4} {how:<28} {p.doc}")
    print(f"{CORES:<10} {_real_cores():<4} {CORES + '=' + str(flip[CORES]):<28} CPU cores this process may run on")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
