"""The grader itself: hostile submissions, the notebook/folder/CLI paths, exports, hidden checks."""
import json
import subprocess
import sys
import time

import pytest

from conftest import ROOT, new_tag, processes_with_tag
from dtrain_lab import caps
from dtrain_lab.grading import exercises, grade, grade_folder, gradescope_results, registry, submissions_in_notebook

from lab10_cases import PROGRAMS  # noqa: E402

GOOD = PROGRAMS["rank_branch"]["solution"]
HEADER = "import os, sys, time, torch\nimport torch.distributed as dist\nfrom dtrain_lab.grading.lab10 import local_loss\n"
BOX = None if caps.sandbox_probe().ok else False     # where this machine has no sandbox, test the rest unsandboxed


def job_processes(tag: str) -> list[int]:
    """Live processes of the grades since ``tag``: this test process's tree holds every process the
    grader starts, and anything that escapes one (conftest: a child subreaper)."""
    return [p.pid for p in processes_with_tag(tag)]


HOSTILE = {
    "flood": ("    for i in range(100000):\n        print('x' * 100)\n", ("pass",)),
    "fork": ("    if os.fork() == 0:\n        os.setsid()\n        time.sleep(3600)\n", ("pass",)),
    "os_exit": ("    os._exit(0)\n", ("wrong", "crash")),
    "sleep": ("    time.sleep(3600)\n", ("hang",)),
    "raise_one": ("    if dist.get_rank() == 1:\n        raise KeyError('only on rank 1')\n", ("crash",)),
    "memory": ("    hog = [torch.empty(1 << 28) for _ in range(64)]\n", ("crash",)),  # 64 GiB asked for
}


@pytest.mark.timeout(500)
def test_hostile_submissions_get_verdicts_and_leave_nothing(tmp_path):
    for name, (prefix, outcomes) in HOSTILE.items():
        path = tmp_path / f"hostile_{name}.py"
        body = GOOD.split("def run():\n", 1)[1]
        path.write_text(HEADER + "\n\ndef run():\n" + prefix + body)
        t0, tag = time.monotonic(), new_tag()
        v = grade("lab10.rank_branch", path, lang="en", sandbox=BOX)
        assert v.outcome in outcomes, (name, v.outcome, v.feedback)
        if name == "raise_one":
            assert "rank 1 failed first: KeyError" in v.feedback
        if name == "os_exit":   # named as what it is, not only "no result"
            assert "before its run() returned" in v.feedback and "os._exit" in v.feedback, v.feedback
        if name == "sleep":
            assert time.monotonic() - t0 < 60 + registry.get("lab10.rank_branch").timeout + 15
            assert "time.sleep" in v.feedback
        if name == "memory":
            assert "memory" in v.feedback.lower() or "MemoryError" in v.feedback
        deadline = time.monotonic() + 5
        while job_processes(tag) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert v.details["runs"] and not job_processes(tag), f"{name}: processes left behind"


def test_missing_file_and_missing_function(tmp_path):
    v = grade("lab10.rank_branch", tmp_path / "nope.py", lang="en")
    assert v.outcome == "error" and "%%writefile" in v.feedback


@pytest.mark.timeout(120)
def test_missing_entry_function(tmp_path):
    f = tmp_path / "f.py"
    f.write_text("def something_else():\n    return 1\n")
    v = grade("lab10.rank_branch", f, lang="zh", sandbox=BOX)
    assert v.outcome == "error" and "run()" in v.feedback and "必须定义" in v.feedback


def test_not_attempted_names_the_marker_line(tmp_path):
    f = tmp_path / "lab10_rank_branch.py"
    f.write_text(PROGRAMS["rank_branch"]["learner"])
    for lang, word in (("en", "not attempted"), ("zh", "尚未作答")):
        v = grade("lab10.rank_branch", f, lang=lang)
        assert v.outcome == "error" and word in v.feedback
        assert "# YOUR CODE HERE" in v.feedback and "stub" not in v.feedback and "空白模板" not in v.feedback


def test_symlinked_submission_is_refused(tmp_path):
    real = tmp_path / "real.py"
    real.write_text(GOOD)
    link = tmp_path / "lab10_rank_branch.py"
    link.symlink_to(real)
    v = grade("lab10.rank_branch", link, lang="en")
    assert v.outcome == "error" and "symbolic link" in v.feedback


def test_registry_lists_bilingual_exercises():
    ex = exercises("lab_10")
    assert len(ex) == len(PROGRAMS) >= 8    # one per %%writefile cell of the lab
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
    results = grade_folder(folder, lang="en", sandbox=BOX)
    assert [v.passed for v in results["alice.ipynb"]] == [True]
    assert [v.passed for v in results["bob.ipynb"]] == [False]
    gs = gradescope_results(results["alice.ipynb"] + results["bob.ipynb"])
    assert gs["score"] == 1 and [t["status"] for t in gs["tests"]] == ["passed", "failed"]
    assert all({"name", "score", "max_score", "output"} <= set(t) for t in gs["tests"])

    out = tmp_path / "results.json"
    cmd = [sys.executable, "-m", "dtrain_lab.cli", "grade", str(folder / "bob.ipynb"), "--json",
           "--gradescope", str(out), "--lang", "en"] + ([] if BOX is None else ["--no-sandbox"])
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=200)
    assert r.returncode == 1, r.stderr
    data = json.loads(r.stdout)
    assert data[str(folder / "bob.ipynb")][0]["outcome"] == "wrong"
    assert json.loads(out.read_text())["score"] == 0


@pytest.mark.timeout(200)
def test_hidden_checks_from_an_instructor_module(tmp_path, monkeypatch):
    (tmp_path / "instructor_hidden.py").write_text(
        "from dtrain_lab.grading import add_hidden_check, own_words\n"
        "def must_be_float(run, rank, result):\n"
        "    text = own_words('the result must be a Python float', '结果必须是 Python float')\n"
        "    return [] if type(result) is float else [text]\n"
        "add_hidden_check('lab10.rank_branch', must_be_float)\n")
    f = tmp_path / "tensor_result.py"
    f.write_text(GOOD.replace("return loss.item()", "return loss"))  # a 1-element tensor, not a float
    assert grade("lab10.rank_branch", f, lang="en", sandbox=BOX).passed   # the public checks accept it
    monkeypatch.setattr(registry, "_hidden_loaded", False)
    monkeypatch.setenv("DTRAIN_HIDDEN_CHECKS", "instructor_hidden")    # the instructor's private module
    monkeypatch.syspath_prepend(str(tmp_path))
    v = grade("lab10.rank_branch", f, lang="en", sandbox=BOX)
    assert v.outcome == "wrong" and "must be a Python float" in v.feedback
    registry.get("lab10.rank_branch").hidden.clear()


def test_grading_is_refused_without_a_sandbox_and_says_why(monkeypatch, tmp_path, capsys):
    from dtrain_lab.grading import main

    monkeypatch.setenv(caps.ENV, "sandbox=0")   # what a machine that cannot build the sandbox answers
    f = tmp_path / "lab10_rank_branch.py"
    f.write_text(GOOD)
    for lang, words in (("en", "not graded"), ("zh", "没有评分")):
        v = grade("lab10.rank_branch", f, lang=lang)
        assert v.outcome == "error" and v.details["refused"] == "no_sandbox" and not v.passed
        assert words in v.feedback and "forced off" in v.feedback and "--no-sandbox" in v.feedback
    assert main(["lab10.rank_branch", str(f), "--lang", "en"]) == 2
    assert "bubblewrap" in capsys.readouterr().out


@pytest.mark.timeout(200)
def test_check_cell_is_a_self_check_without_a_sandbox(monkeypatch, tmp_path, capsys):
    from dtrain_lab.grading import check

    monkeypatch.setenv(caps.ENV, "sandbox=0")   # what a machine that cannot build the sandbox answers
    f = tmp_path / "lab10_rank_branch.py"
    f.write_text(GOOD)
    v = check("lab10.rank_branch", str(f), lang="en")
    assert v.passed and v.details["self_check"] and not v.details["sandboxed"]
    out = capsys.readouterr().out
    # the notice is a line of its own; the verdict below it reads as a sandboxed one does
    assert out.startswith("(self-check, not a grade") and out.split("\n", 1)[1].strip() == v.feedback.strip()
    assert "--no-sandbox" not in v.feedback


def test_learner_copies_never_import_the_checks_or_a_reference():
    """The learner copies (labs/) import only the labs' contract modules: never the checks, never a
    reference answer (issue 15: lab 05 printed reference_bounds, lab 08 reference_1f1b's schedule)."""
    found = []
    for path in sorted(ROOT.glob("labs/*/*.ipynb")):
        for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
            src = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
            if cell["cell_type"] == "code" and ("grading.checks" in src or "reference_" in src):
                found.append(f"{path.relative_to(ROOT)}: {src[:60]!r}")
    assert not found, found
