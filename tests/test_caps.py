"""What the machine can do is asked in one place (dtrain_lab/caps.py), and every answer can be forced:
no module asks around it, forcing reaches launched ranks, and a probe that names hardware this machine
lacks cannot be forced on."""
import ast
import subprocess
import sys

import pytest

from conftest import ROOT
from dtrain_lab import caps

# the calls that answer "what can this machine do", each allowed only in dtrain_lab/caps.py
PROBE_CALLS = {"is_available", "device_count", "_is_mkldnn_fp16_supported", "_is_mkldnn_bf16_supported",
               "cpu_count", "sched_getaffinity", "find_cjk_font", "is_bf16_supported"}
PROBE_WHICH = {"bwrap", "g++", "ninja", "nvidia-smi"}
# where such a call answers another question than what this machine can do
ALLOWED = {
    ("dtrain_lab/parallel/ds_env.py", "is_bf16_supported"): "DeepSpeed's own report of its accelerator, shown as such",
    ("dtrain_lab/nccl/machine.py", "nvidia-smi"): "the doctor's report of the tools installed, not a decision",
    ("dtrain_lab/sandbox/bwrap.py", "bwrap"): "the probe behind caps' sandbox (caps.sandbox_probe)",
    ("dtrain_lab/fonts.py", "find_cjk_font"): "the probe behind caps' cjk_font",
    ("dtrain_lab/viz.py", "find_cjk_font"): "after caps.have('cjk_font') said yes: which font",
    ("dtrain_lab/jobs/runtime.py", "is_available"): "torch.distributed.is_available / is_nccl_available: the build",
}


def _calls(path):
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = getattr(node.func, "attr", getattr(node.func, "id", ""))
        if name in PROBE_CALLS:
            yield node.lineno, name
        if name == "which" and node.args and isinstance(node.args[0], ast.Constant) and node.args[0].value in PROBE_WHICH:
            yield node.lineno, node.args[0].value


def test_no_module_asks_the_machine_around_caps():
    bad = []
    for path in sorted((ROOT / "dtrain_lab").rglob("*.py")):
        rel = str(path.relative_to(ROOT))
        if rel == "dtrain_lab/caps.py":
            continue
        for line, name in _calls(path):
            if (rel, name) not in ALLOWED and not (name == "is_available" and _is_dist_build_check(path, line)):
                bad.append(f"{rel}:{line} {name}")
    assert not bad, "ask dtrain_lab.caps instead:\n" + "\n".join(bad)


def _is_dist_build_check(path, line) -> bool:
    """``dist.is_available()`` (is torch.distributed in this build) is not a machine probe."""
    text = path.read_text(encoding="utf-8").splitlines()[line - 1]
    return "dist.is_available" in text or "distributed.is_available" in text


def test_every_probe_is_listed_and_forceable(monkeypatch):
    assert set(caps.PROBES) == {"cuda", "cpu_fp16", "cpu_bf16", "compiler", "sandbox", "cgroup", "cjk_font"}
    for name, probe in caps.PROBES.items():
        real = caps.real(name)
        monkeypatch.setenv(caps.ENV, f"{name}=0")
        assert caps.have(name) is False
        monkeypatch.setenv(caps.ENV, f"{name}=1")
        if real or probe.force_on:
            assert caps.have(name) is True
        else:
            with pytest.raises(ValueError, match="cannot be forced on"):
                caps.have(name)
        monkeypatch.delenv(caps.ENV)
        assert caps.have(name) is real
    monkeypatch.setenv(caps.ENV, "cores=3")
    assert caps.cores() == 3
    monkeypatch.setenv(caps.ENV, "nonsense=1")
    with pytest.raises(ValueError, match="NAME=0|1"):
        caps.have("cuda")


def test_forced_reaches_code_and_launched_processes():
    with caps.forced(cpu_fp16=False, cores=1):
        assert caps.have("cpu_fp16") is False and caps.cores() == 1
        out = subprocess.run([sys.executable, "-c", "from dtrain_lab import caps; print(caps.have('cpu_fp16'), caps.cores())"],
                             capture_output=True, text=True, timeout=120, cwd=str(ROOT)).stdout.split()
        assert out == ["False", "1"]
        with caps.forced(cpu_fp16=True):
            assert caps.have("cpu_fp16") is True
        assert caps.have("cpu_fp16") is False
    assert caps.have("cpu_fp16") is caps.real("cpu_fp16")


def test_flipped_names_every_probe_that_can_be_flipped_here():
    flip = caps.flipped()
    for name, probe in caps.PROBES.items():
        if caps.real(name) or probe.force_on:
            assert flip[name] is (not caps.real(name))
        else:
            assert name not in flip
    out = subprocess.run([sys.executable, "-m", "dtrain_lab.caps", "--flipped"], capture_output=True, text=True,
                         timeout=120, cwd=str(ROOT)).stdout.strip()
    assert caps._parse(out) == flip


def test_fp16_follows_the_probe_in_configs_and_lessons():
    from dtrain_lab.i18n import LabError
    from dtrain_lab.parallel import deepspeed_lab as dsl

    with caps.forced(cpu_fp16=True):
        assert dsl.fp16_supported()
        assert dsl.make_config(world_size=2, precision="fp16")["fp16"]["enabled"]
    if not caps.real("cuda"):
        with caps.forced(cpu_fp16=False):
            assert not dsl.fp16_supported()
            with pytest.raises(LabError) as e:
                dsl.make_config(world_size=2, precision="fp16")
            assert e.value.key == "ds_no_fp16"


def test_lessons_ask_caps_too():
    """The lessons' own cells ask dtrain_lab.caps (and print torch's release, not its build's tag):
    what they store must not depend on the machine or on which torch wheel was installed."""
    import re

    bad = []
    for path in sorted((ROOT / "lessons" / "_source").glob("*.md")) + sorted((ROOT / "solutions" / "_source").glob("*.md")):
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if re.search(r"torch\.cuda\.(is_available|device_count)\(|_is_mkldnn_|torch\.__version__(?!\.startswith)", line):
                bad.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()[:80]}")
    assert not bad, "\n".join(bad)
