"""The `dtrain-lab` command: info, run (bad input -> clear message, exit 2), nccl lint/doctor wiring."""
import json
import subprocess
import sys

import pytest


def cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "dtrain_lab.cli", *args], capture_output=True, text=True,
                          timeout=120, env=env)


@pytest.mark.timeout(120)
def test_info_and_bad_run_target():
    r = cli("info")
    assert r.returncode == 0 and "torch 2.13.0" in r.stdout and "backend:" in r.stdout
    r = cli("--lang", "zh", "run", "no_such_module_x", "-n", "2")
    assert r.returncode == 2 and "无法启动" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.timeout(120)
def test_nccl_lint_and_doctor_through_the_command(tmp_path):
    env_file = tmp_path / "job.env"
    env_file.write_text("NCCL_TIMEOUT=1800\nNCCL_DEBUG=INFO\n")
    r = cli("nccl", "lint", "--file", str(env_file), "--json")
    assert r.returncode == 1, r.stderr
    assert "NCCL_TIMEOUT" in r.stdout and json.loads(r.stdout)
    env_file.write_text("export NCCL_DEBUG=INFO\n")   # docker run --env-file refuses `export`: exit 2
    r = cli("--lang", "en", "nccl", "lint", "--file", str(env_file))
    assert r.returncode == 2 and "export" in r.stderr and "Traceback" not in r.stderr
    clean = tmp_path / "clean.env"
    clean.write_text("NCCL_DEBUG=INFO\nNCCL_SOCKET_IFNAME=eth0\n")
    assert cli("nccl", "lint", "--file", str(clean)).returncode == 0
    r = cli("--lang", "en", "nccl", "doctor", "--json")
    assert r.returncode == 0 and "recommendations" in json.loads(r.stdout)
    top = cli("--lang", "zh", "doctor")          # `dtrain-lab doctor` is the same report
    assert top.returncode == 0 and "== PyTorch 与 NCCL ==" in top.stdout
