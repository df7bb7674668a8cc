"""Grading a class as a SLURM job array (``dtrain-lab grade FOLDER --slurm``) on a local two-node cluster
(tests/slurm_cluster.py): the same verdicts, scores and feedback as ``-j 2`` on the same folder; a run
again grades only what is missing or failed and writes no row twice; a task that dies becomes a row
that says so; progress is shown; SLURM missing or a partition that does not exist is a clear error.

Skips in one line where SLURM cannot run here; the CI leg ``slurm-array`` (tools/modes.sh) runs it with
``DTRAIN_REQUIRE_SLURM=1``, where a skip is a failure.
"""
import csv
import json
import os
import re
import subprocess
import sys
import time
import uuid

import psutil
import pytest

from slurm_cluster import LocalSlurm
from test_classrun import ATTACK, LAB11, env_solutions, notebook
from test_slurm_job import _need_slurm
from conftest import ROOT

CLI = [sys.executable, "-m", "dtrain_lab.cli"]


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    _need_slurm()
    with LocalSlurm(tmp_path_factory.mktemp("slurm")) as cluster:
        yield cluster


def grade(slurm, *args, timeout=400, lang="en", path=None):
    env = {**slurm.env, "DTRAIN_LANG": lang}
    if path is not None:
        env["PATH"] = path
    return subprocess.run([*CLI, "grade", *map(str, args), "--lang", lang], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env=env)


NUMBER = re.compile(r"-?\d+(\.\d+)?(e[-+]?\d+)?")


def comparable(results: dict) -> list:
    """What must be the same for -j and --slurm: per file, every row but its timings and run records; in
    the feedback, the numbers are masked: every grading draws its inputs from a fresh secret seed
    (grader._make_run), so the expected values it quotes differ from one grading to the next by design."""
    out = []
    for s in results["submissions"]:
        rows = [{k: (NUMBER.sub("#", v) if k == "feedback" else v) for k, v in r.items()
                 if k not in ("elapsed", "details")} for r in s["verdicts"]]
        out.append((s["student"], s["file"], s["kind"], s["score"], s["max_score"], rows))
    return out


def csv_rows(out):
    with open(out / "gradebook.csv", newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def make_class(folder, marker):
    from lab10_cases import PROGRAMS

    folder.mkdir()
    wrong = (ROOT / "tests" / "submissions" / "lab10" / "rank_branch_wrong.py").read_text()
    good = notebook(["%%writefile lab10_rank_branch.py\n" + PROGRAMS["rank_branch"]["solution"]])
    (folder / "alice.ipynb").write_text(good)
    if not LAB11:   # a wrong answer that runs (with lab 11, a wrong .env file is the cheaper one)
        (folder / "bob.ipynb").write_text(notebook(["%%writefile lab10_rank_branch.py\n" + wrong]))
    attack = ATTACK.format(targets=[str(folder / "alice.ipynb")], payload="{}", marker=marker)
    (folder / "mallory.ipynb").write_text(notebook(["%%writefile lab10_rank_branch.py\n" + attack]))
    (folder / "carol.ipynb").write_text('{"cells": [')                       # malformed: an error row
    (folder / "dave.py").write_text("print(1)\n")                            # a loose file: an error row
    if LAB11:
        env = env_solutions()["lab11_roce.env"]
        (folder / "grace_lab11_roce.env").write_text(env["solution"])
        (folder / "heidi_lab11_roce.env").write_text(env["learner"])


@pytest.mark.timeout(900)
def test_array_grades_like_j2_and_a_run_again_keeps_every_row(slurm, tmp_path):
    marker = f"dtrain-attack-{uuid.uuid4().hex}"
    folder = tmp_path / "class"
    make_class(folder, marker)
    t0 = time.monotonic()
    local = grade(slurm, folder, "-j", "2", "--out", tmp_path / "j2")
    t_local = time.monotonic() - t0
    assert local.returncode == 0, local.stdout + local.stderr
    t0 = time.monotonic()
    r = grade(slurm, folder, "--slurm", "--wait", "--max-concurrent", "2", "--out", tmp_path / "sl")
    t_slurm = time.monotonic() - t0
    assert r.returncode == 0, r.stdout + r.stderr + slurm.logs()
    assert "Traceback" not in r.stderr
    assert "graded 0 of" in r.stderr and f"graded {4 if LAB11 else 3} of {4 if LAB11 else 3}" in r.stderr
    j2 = json.loads((tmp_path / "j2" / "results.json").read_text(encoding="utf-8"))
    sl = json.loads((tmp_path / "sl" / "results.json").read_text(encoding="utf-8"))
    assert sl["format"] == j2["format"] and sl["jobs"] == "slurm"
    assert comparable(sl) == comparable(j2)
    verdict = {s["student"]: s["verdicts"][0] for s in sl["submissions"]}
    assert verdict["alice"]["outcome"] == "pass"
    assert verdict["heidi_lab11_roce" if LAB11 else "bob"]["outcome"] != "pass"
    assert verdict["mallory"]["outcome"] != "pass" and verdict["carol"]["outcome"] == "error"
    assert [r["outcome"] for r in verdict.values()].count("pass") == (2 if LAB11 else 1)
    # the hostile submission's daemon did not outlive its task; alice's file is untouched
    assert not [p for p in psutil.process_iter(["cmdline"]) if marker in " ".join(p.info["cmdline"] or [])
                and p.status() != psutil.STATUS_ZOMBIE]
    assert "rank_branch" in (folder / "alice.ipynb").read_text()
    first = csv_rows(tmp_path / "sl")
    assert len(first) == len({(r["file"], r["exercise"]) for r in first})     # one row per file and exercise

    # again, nothing changed: nothing is graded, the same rows, none twice
    again = grade(slurm, folder, "--slurm", "--wait", "--out", tmp_path / "sl")
    assert again.returncode == 0, again.stdout + again.stderr
    assert "0 submission(s) to grade" in again.stdout and f"{4 if LAB11 else 3} kept" in again.stdout
    assert csv_rows(tmp_path / "sl") == first
    sl2 = json.loads((tmp_path / "sl" / "results.json").read_text(encoding="utf-8"))
    assert comparable(sl2) == comparable(sl)
    # one file changed (the wrong answer fixed): only it is graded again
    fixed, source = ("heidi_lab11_roce.env", "grace_lab11_roce.env") if LAB11 else ("bob.ipynb", "alice.ipynb")
    (folder / fixed).write_text((folder / source).read_text())
    third = grade(slurm, folder, "--slurm", "--wait", "--out", tmp_path / "sl")
    assert "1 submission(s) to grade" in third.stdout, third.stdout + third.stderr
    rows = csv_rows(tmp_path / "sl")
    assert len(rows) == len(first)
    assert [r["outcome"] for r in rows if r["file"] == fixed] == ["pass"]
    print(f"class of {len(list(folder.iterdir()))} files: -j 2 {t_local:.1f} s, SLURM array {t_slurm:.1f} s")


@pytest.mark.timeout(600)
def test_a_task_that_dies_is_a_row_and_a_run_again_grades_it(slurm, tmp_path):
    if not LAB11:
        pytest.skip("needs lab 11's .env exercises")
    folder, out = tmp_path / "class", tmp_path / "out"
    folder.mkdir()
    env = env_solutions()["lab11_roce.env"]["solution"]
    for name in ("ann", "ben", "cat"):
        (folder / f"{name}_lab11_roce.env").write_text(env)
    r = grade(slurm, folder, "--slurm", "--max-concurrent", "1", "--out", out, lang="zh")
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads((out / ".slurm" / "class.json").read_text())
    array, merge = doc["submits"][-1]["array"], doc["submits"][-1]["merge"]
    slurm.run("scancel", f"{array}_2")            # the last task: still pending behind --max-concurrent 1
    status = grade(slurm, folder, "--slurm", "--status", "--out", out, lang="zh")
    assert "已评" in status.stdout, status.stdout + status.stderr
    slurm.wait_job(merge, timeout=240)
    results = json.loads((out / "results.json").read_text(encoding="utf-8"))
    rows = {s["student"]: s["verdicts"][0] for s in results["submissions"]}
    assert rows["ann_lab11_roce"]["outcome"] == rows["ben_lab11_roce"]["outcome"] == "pass"
    died = rows["cat_lab11_roce"]
    assert died["outcome"] == "error" and died["score"] == 0
    # cancelled while pending, SLURM keeps no record of that task; on a loaded machine it may have started
    # already, and SLURM says CANCELLED: either way the row names the task and says so
    fb = died["feedback"]
    assert f"{array}_2" in fb and ("SLURM 已无记录" in fb or "CANCELLED" in fb), fb
    assert died["details"]["reason"]["en"] and died["details"]["reason"]["zh"]
    # again: only the one whose task died is graded; every student still has exactly one row
    again = grade(slurm, folder, "--slurm", "--wait", "--out", out)
    assert "1 submission(s) to grade" in again.stdout and "2 kept" in again.stdout, again.stdout + again.stderr
    rows = csv_rows(out)
    assert sorted(r["student"] for r in rows) == ["ann_lab11_roce", "ben_lab11_roce", "cat_lab11_roce"]
    assert {r["outcome"] for r in rows} == {"pass"}


def test_no_sbatch_and_an_unknown_partition_are_clear_errors(slurm, tmp_path):
    folder = tmp_path / "class"
    folder.mkdir()
    (folder / "x_lab11_roce.env").write_text("NCCL_DEBUG=WARN\n")
    for lang, words in (("en", "SLURM's commands are not"), ("zh", "找不到 SLURM 的命令")):
        r = grade(slurm, folder, "--slurm", "--out", tmp_path / "o", lang=lang, path=os.path.dirname(sys.executable))
        assert r.returncode != 0 and words in r.stderr and "Traceback" not in r.stderr, r.stderr
    for lang, words in (("en", "no partition 'nope'"), ("zh", "没有名为 'nope' 的分区")):
        r = grade(slurm, folder, "--slurm", "--partition", "nope", "--out", tmp_path / "o", lang=lang)
        assert r.returncode != 0 and words in r.stderr and "debug" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not (tmp_path / "o" / "results.json").exists()
    # results inside a folder every sandbox binds (here: the course package) would show the class's copies
    inside = ROOT / "dtrain_lab" / f"grades-{uuid.uuid4().hex}"
    r = grade(slurm, folder, "--slurm", "--out", inside)
    assert r.returncode != 0 and "every submission's sandbox can read" in r.stderr, r.stderr
    assert not inside.exists()
    # an existing partition is used for the array and the merge job
    r = grade(slurm, folder, "--slurm", "--partition", "grading", "--sbatch=--comment=lab11", "--wait",
              "--out", tmp_path / "o")
    assert r.returncode == 0, r.stdout + r.stderr
    script = (tmp_path / "o" / ".slurm" / "array-0.sbatch").read_text()
    assert "#SBATCH --partition=grading" in script and "#SBATCH --comment=lab11" in script
