"""The grader itself: hostile submissions, the notebook/folder/CLI paths, exports, hidden checks."""
import json
import subprocess
import sys
import time

import psutil
import pytest

from conftest import ROOT
from dtrain_lab.grading import (exercises, grade, grade_folder, gradescope_results, registry,
                                submissions_in_notebook)

from lab10_cases import PROGRAMS  # noqa: E402

GOOD = PROGRAMS["rank_branch"]["solution"]
HEADER = "import os, sys, time, torch\nimport torch.distributed as dist\nfrom dtrain_lab.grading.lab10 import local_loss\n"


def survivors(marker: str):
    left = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if any(marker in part for part in (p.info["cmdline"] or [])) and p.status() != psutil.STATUS_ZOMBIE:
                left.append(p.pid)
        except psutil.Error:
            pass
    return left


HOSTILE = {
    "flood": ("    for i in range(100000):\n        print('x' * 100)\n", ("pass",)),
    "fork": ("    if os.fork() == 0:\n        os.setsid()\n        time.sleep(3600)\n", ("pass",)),
    "os_exit": ("    os._exit(0)\n", ("wrong", "crash")),
    "sleep": ("    time.sleep(3600)\n", ("hang",)),
    "raise_one": ("    if dist.get_rank() == 1:\n        raise KeyError('only on rank 1')\n", ("crash",)),
    "memory": ("    hog = [torch.empty(1 << 28) for _ in range(64)]\n", ("crash",)),  # 64 GiB asked for
}


@pytest.mark.timeout(400)
def test_hostile_submissions_get_verdicts_and_leave_nothing(tmp_path):
    for name, (prefix, outcomes) in HOSTILE.items():
        path = tmp_path / f"hostile_{name}_{time.time_ns()}.py"
        body = GOOD.split("def run():\n", 1)[1]
        path.write_text(HEADER + "\n\ndef run():\n" + prefix + body)
        t0 = time.monotonic()
        v = grade("lab10.rank_branch", path, lang="en")
        assert v.outcome in outcomes, (name, v.outcome, v.feedback)
        if name == "raise_one":
            assert "rank 1 failed first: KeyError" in v.feedback
        if name == "sleep":
            assert time.monotonic() - t0 < 60 + registry.get("lab10.rank_branch").timeout + 15
            assert "time.sleep(3600)" in v.feedback
        if name == "memory":
            assert "memory" in v.feedback.lower() or "MemoryError" in v.feedback
        deadline = time.monotonic() + 5
        while survivors(path.name) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not survivors(path.name), f"{name}: processes left behind"


def test_missing_file_and_missing_function(tmp_path):
    v = grade("lab10.rank_branch", tmp_path / "nope.py", lang="en")
    assert v.outcome == "error" and "%%writefile" in v.feedback


@pytest.mark.timeout(120)
def test_missing_entry_function(tmp_path):
    f = tmp_path / "f.py"
    f.write_text("def something_else():\n    return 1\n")
    v = grade("lab10.rank_branch", f, lang="zh")
    assert v.outcome == "error" and "run()" in v.feedback and "必须定义" in v.feedback


def test_registry_lists_bilingual_exercises():
    ex = exercises("lab_10")
    assert len(ex) == 8
    for e in ex:
        assert e["title"]["en"] and any("\u4e00" <= c <= "\u9fff" for c in e["title"]["zh"])
        assert e["file"].endswith(".py")


def _notebook(cells):
    return {"nbformat": 4, "nbformat_minor": 5, "metadata": {},
            "cells": [{"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None,
                       "source": src} for src in cells]}


@pytest.mark.timeout(300)
def test_folder_of_notebooks_cli_json_and_gradescope(tmp_path):
    solution = GOOD
    wrong = (ROOT / "tests/submissions/lab10/rank_branch_wrong.py").read_text()
    folder = tmp_path / "class"
    folder.mkdir()
    (folder / "alice.ipynb").write_text(json.dumps(_notebook(["%%writefile lab10_rank_branch.py\n" + solution, "1+1"])))
    (folder / "bob.ipynb").write_text(json.dumps(_notebook(["%%writefile lab10_rank_branch.py\n" + wrong])))
    assert set(submissions_in_notebook(folder / "alice.ipynb")) == {"lab10.rank_branch"}
    results = grade_folder(folder, lang="en")
    assert [v.passed for v in results["alice.ipynb"]] == [True]
    assert [v.passed for v in results["bob.ipynb"]] == [False]
    gs = gradescope_results(results["alice.ipynb"] + results["bob.ipynb"])
    assert gs["score"] == 1 and [t["status"] for t in gs["tests"]] == ["passed", "failed"]
    assert all({"name", "score", "max_score", "output"} <= set(t) for t in gs["tests"])

    out = tmp_path / "results.json"
    r = subprocess.run([sys.executable, "-m", "dtrain_lab.cli", "grade", str(folder / "bob.ipynb"), "--json",
                        "--gradescope", str(out), "--lang", "en"], capture_output=True, text=True, timeout=200)
    assert r.returncode == 1, r.stderr
    data = json.loads(r.stdout)
    assert data[str(folder / "bob.ipynb")][0]["outcome"] == "wrong"
    assert json.loads(out.read_text())["score"] == 0


@pytest.mark.timeout(200)
def test_hidden_checks_from_an_instructor_module(tmp_path, monkeypatch):
    (tmp_path / "instructor_hidden.py").write_text(
        "from dtrain_lab.grading import add_hidden_check, problem\n"
        "def must_be_float(rt, result, module):\n"
        "    return [] if type(result) is float else [problem('结果必须是 Python float', 'the result must be a Python float')]\n"
        "add_hidden_check('lab10.rank_branch', must_be_float)\n")
    f = tmp_path / "tensor_result.py"
    f.write_text(GOOD.replace("return loss.item()", "return loss"))  # a 1-element tensor, not a float
    assert grade("lab10.rank_branch", f, lang="en").passed            # the public checks accept it
    monkeypatch.setenv("DTRAIN_HIDDEN_CHECKS", "instructor_hidden")   # the instructor's private module
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    v = grade("lab10.rank_branch", f, lang="en")
    assert v.outcome == "wrong" and "must be a Python float" in v.feedback
