"""Grading a class (``dtrain-lab grade FOLDER -j N``): every file gets a row, nothing in one file stops
the run or scores, each submission is graded from its own snapshot, nothing outlives the run, and the
results are written atomically. Attacks of issue 13, groups 4 (class runs) and 6 (one results.json
for a whole class)."""
import csv
import json
import os
import subprocess
import sys
import time
import uuid

import psutil
import pytest

from conftest import ROOT, _servers
from dtrain_lab import authoring
from dtrain_lab.grading import classrun, gradebook, intake, registry

BOM = b"\xef\xbb\xbf"
CLI = [sys.executable, "-m", "dtrain_lab.cli"]
# lab 11 (.env files, read and never run: the cheapest exercises) once the grader has it
LAB11 = "lab_11" in {e.lab for e in registry.all_exercises()}


def env_solutions() -> dict:
    """``{"lab11_roce.env": {"solution": text, "learner": text}, ...}`` from the lab 11 source."""
    out = {}
    source = ROOT / "solutions" / "_source" / "lab_11_nccl.md"
    for cell in authoring.parse(source.read_text(encoding="utf-8")):
        text = cell.text.get("*", "")
        first, _, body = text.partition("\n")
        if cell.kind == "code" and first.startswith("%%writefile lab11_") and first.endswith(".env"):
            out[first.split()[1]] = authoring.blocks(body)
    return out


def notebook(cells) -> str:
    return json.dumps({"nbformat": 4, "nbformat_minor": 5, "metadata": {},
                       "cells": [{"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None,
                                  "source": src} for src in cells]})


def all_files(folder) -> set:
    found = set()
    for dirpath, dirnames, filenames in os.walk(folder, followlinks=False):
        for name in filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
            found.add(os.path.relpath(os.path.join(dirpath, name), folder).replace(os.sep, "/"))
    return found


def run_cli(*args, timeout=600):
    return subprocess.run([*CLI, "grade", *map(str, args), "--lang", "en"], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


@pytest.mark.timeout(600)
def test_every_file_gets_a_row_and_no_attack_scores(tmp_path):
    """Group 4: a malformed notebook, a loose .py, unknown files, a link, a checkpoint copy: each an
    error row, none scoring, the run goes on; a byte-order mark is tolerated (the file is graded exactly
    as without it); results.json and gradebook.csv agree and name every file."""
    from lab10_cases import PROGRAMS

    solution = PROGRAMS["send_send"]["solution"]                  # one world size: one launch
    good_nb = notebook(["%%writefile lab10_send_send.py\n" + solution])
    folder, out = tmp_path / "class", tmp_path / "grades"
    folder.mkdir()
    (folder / "carol.ipynb").write_text('{"cells": [ {"cell_type": "code", "source": "x"')   # cut off
    (folder / "eve.ipynb").write_text("[1, 2, 3]")                                         # JSON, not a notebook
    (folder / "ivan.ipynb").write_bytes(b"\xff\xfe" + good_nb.encode("utf-16-le"))          # not UTF-8
    (folder / "dave.py").write_text(solution)                                              # a loose file
    (folder / "notes.txt").write_text("hello")
    (folder / os.fsdecode(b"bad\xff name.ipynb")).write_text("{}")                          # a name that is not UTF-8
    os.mkfifo(folder / "pipe.ipynb")                                                      # would block a reader
    (tmp_path / "elsewhere.ipynb").write_text(good_nb)
    (folder / "link.ipynb").symlink_to(tmp_path / "elsewhere.ipynb")                        # links never followed
    (folder / ".ipynb_checkpoints").mkdir()
    (folder / ".ipynb_checkpoints" / "zed-checkpoint.ipynb").write_text(good_nb)
    (folder / "frank").mkdir()                                                             # a per-student folder
    (folder / "frank" / "lab10.ipynb").write_bytes(BOM + good_nb.encode())
    (folder / "=HYPERLINK(1).ipynb").write_text(notebook(["%%writefile lab10_rank_branch.py\n"
                                                          + PROGRAMS["rank_branch"]["learner"]]))
    if LAB11:
        env = env_solutions()["lab11_roce.env"]["solution"]
        (folder / "grace_lab11_roce.env").write_bytes(BOM + env.encode())
        (folder / "heidi_lab11_roce.env").write_text(env)                                  # the same, no BOM
    else:
        (folder / "grace_lab11_roce.env").write_bytes(BOM + b"NCCL_DEBUG=WARN\n")           # names no known exercise
    r = run_cli(folder, "-j", "2", "--out", out)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    results = json.loads((out / "results.json").read_text(encoding="utf-8"))
    subs = {s["file"]: s for s in results["submissions"]}
    shown = {f.encode("utf-8", "surrogateescape").decode("utf-8", "replace") for f in all_files(folder)}
    assert set(subs) == shown, sorted(set(subs) ^ shown)
    why = {f: " ".join(v["feedback"] for v in s["verdicts"]) for f, s in subs.items()}
    attacks = ["carol.ipynb", "eve.ipynb", "ivan.ipynb", "dave.py", "notes.txt", "link.ipynb", "bad\ufffd name.ipynb",
               "pipe.ipynb", ".ipynb_checkpoints/zed-checkpoint.ipynb"] + ([] if LAB11 else ["grace_lab11_roce.env"])
    for f in attacks:
        assert [v["outcome"] for v in subs[f]["verdicts"]] == ["error"], (f, subs[f])
        assert subs[f]["score"] == 0, (f, subs[f])
        assert subs[f]["verdicts"][0]["details"]["reason"]["zh"], f     # the reason in both languages
    assert "not a valid notebook" in why["carol.ipynb"] and "not a notebook" in why["eve.ipynb"]
    assert "not UTF-8" in why["ivan.ipynb"]
    assert ".py file on its own" in why["dave.py"] and "symbolic link" in why["link.ipynb"]
    assert subs["frank/lab10.ipynb"]["student"] == "frank"
    # the BOM changes nothing: the notebook is graded as without it (the solution passes)
    assert [(v["exercise"], v["outcome"]) for v in subs["frank/lab10.ipynb"]["verdicts"]] == [("lab10.send_send", "pass")]
    expected = 1
    if LAB11:
        assert subs["grace_lab11_roce.env"]["student"] == "grace_lab11_roce"
        for f in ("grace_lab11_roce.env", "heidi_lab11_roce.env"):
            assert [(v["exercise"], v["outcome"]) for v in subs[f]["verdicts"]] == [("lab11.roce", "pass")], (f, why[f])
        expected += 2
    with open(out / "gradebook.csv", newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    assert list(rows[0]) == ["student", "file", "exercise", "score", "max_score", "outcome"]
    assert len(rows) == sum(len(s["verdicts"]) for s in results["submissions"])
    assert {r["file"] for r in rows} == {gradebook.csv_cell(f) for f in subs}
    assert "'=HYPERLINK(1).ipynb" in {r["file"] for r in rows}                    # text, not a formula
    assert sum(float(r["score"]) for r in rows) == expected
    assert not [p for p in out.iterdir() if p.name.endswith(".tmp")]


@pytest.mark.timeout(300)
def test_gradescope_output_refuses_a_class(tmp_path, capsys):
    """Group 6: a folder's results are never one Gradescope results.json (no identity, the class total as
    the score): more than one submission is refused, with the way to the autograder zip."""
    from dtrain_lab import cli

    folder = tmp_path / "class"
    folder.mkdir()
    stub = notebook(["%%writefile lab10_rank_branch.py\n# YOUR CODE HERE\n"])
    (folder / "alice.ipynb").write_text(stub)
    (folder / "bob.ipynb").write_text(stub)
    gs = tmp_path / "results.json"
    args = ["grade", str(folder), "--gradescope", str(gs), "--out", str(tmp_path / "grades"), "--lang", "en"]
    assert cli.main(args) == 2
    err = capsys.readouterr().err
    assert "autograder build" in err and "Traceback" not in err
    assert not gs.exists() and not (tmp_path / "grades").exists()
    # one submission: that student's own results.json, in Gradescope's format
    (folder / "bob.ipynb").unlink()
    assert cli.main(args) == 0, capsys.readouterr()
    doc = json.loads(gs.read_text(encoding="utf-8"))
    assert doc["score"] == 0 and [t["extra_data"]["exercise"] for t in doc["tests"]] == ["lab10.rank_branch"]
    assert doc["tests"][0]["status"] == "failed" and "not attempted" in doc["tests"][0]["output"]


def _marked(marker: str) -> list:
    left = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if any(marker in part for part in (p.info["cmdline"] or [])) and p.status() != psutil.STATUS_ZOMBIE:
                left.append(p.pid)
        except psutil.Error:
            pass
    return left


ATTACK = '''
import os, subprocess, sys
import torch.distributed as dist


def run():
    # rewrite the classmate's notebook and this one's own, and the class results
    for path in {targets!r}:
        try:
            with open(path, "w") as f:
                f.write({payload!r})
        except OSError:
            pass
    # a daemon that escapes the job's process group and session, with an empty environment (no tag a
    # cleanup could find it by), and waits for the grader to finish
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", "{marker}"],
                             start_new_session=True, env={{}}, close_fds=True)
        os._exit(0)
    return None
'''


@pytest.mark.timeout(600)
def test_a_submission_cannot_change_another_or_outlive_the_run(tmp_path):
    """Group 3 in folder mode: alice's code rewrites bob's notebook (with a correct answer), her own, and
    the results, and leaves a double-forked setsid daemon. Every file was copied into its own private
    folder before anything ran, so bob is graded on what he handed in; no process survives the run."""
    from lab10_cases import PROGRAMS

    folder, out = tmp_path / "class", tmp_path / "grades"
    folder.mkdir()
    marker = f"dtrain-attack-{uuid.uuid4().hex}"
    good = notebook(["%%writefile lab10_rank_branch.py\n" + PROGRAMS["rank_branch"]["solution"]])
    wrong = (ROOT / "tests" / "submissions" / "lab10" / "rank_branch_wrong.py").read_text()
    targets = [str(folder / "bob.ipynb"), str(folder / "alice.ipynb"), str(out / "results.json")]
    attack = ATTACK.format(targets=targets, payload=good, marker=marker)
    (folder / "alice.ipynb").write_text(notebook(["%%writefile lab10_rank_branch.py\n" + attack]))
    (folder / "bob.ipynb").write_text(notebook(["%%writefile lab10_rank_branch.py\n" + wrong]))
    t0 = time.monotonic()
    r = run_cli(folder, "-j", "2", "--out", out)
    assert r.returncode == 0, r.stdout + r.stderr
    results = json.loads((out / "results.json").read_text(encoding="utf-8"))
    assert results["format"] == classrun.FORMAT
    verdict = {s["student"]: s["verdicts"][0] for s in results["submissions"]}
    assert verdict["bob"]["outcome"] in ("wrong", "crash", "hang"), verdict["bob"]["feedback"]
    assert verdict["alice"]["outcome"] != "pass", verdict["alice"]["feedback"]
    assert sum(s["score"] for s in results["submissions"]) == 0
    deadline = time.monotonic() + 5
    while _marked(marker) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _marked(marker), "a daemon started by a submission outlived the class run"
    print(f"two lab 10 submissions, -j 2: {time.monotonic() - t0:.1f} s")


@pytest.mark.timeout(120)
def test_a_worker_over_its_budget_is_stopped_and_reported(tmp_path, monkeypatch):
    folder = tmp_path / "class"
    folder.mkdir()
    (folder / "alice.ipynb").write_text(notebook(["%%writefile lab10_rank_branch.py\n# YOUR CODE HERE\n"]))
    monkeypatch.setattr(classrun, "budget", lambda ids: 0.05)   # the worker cannot even import in that time
    results = classrun.run_class(folder, jobs=1, lang="en")
    (v,) = results["submissions"][0]["verdicts"]
    assert v["outcome"] == "error" and v["score"] == 0 and "did not finish" in v["feedback"], v
    # this test worker's agent server (dtrain_lab.jobs.agents), supervisor server (grading.supervisors) and
    # notebook kernel zygote (tests/kernel_zygote.py), if a launch, a grade or a notebook ran here before,
    # are not the class run's
    # (a zombie has ended: this test process is a child subreaper, conftest, and adopts the grader's orphans)
    servers = _servers()
    assert not [c for c in psutil.Process().children(recursive=True)
                if c.pid not in servers and c.status() != psutil.STATUS_ZOMBIE]


def test_worker_verdicts_are_checked_against_the_registry(tmp_path):
    """A verdict comes back through a file: whatever it claims, the score is the exercise's own, and an
    exercise it was not asked for, or no verdict, cannot add points."""
    item = classrun.Item(rel="alice.ipynb", student="alice", kind="notebook",
                         exercises=["lab10.rank_branch", "lab10.send_send", "lab10.accum_steps"], private=tmp_path)
    forged = [{"exercise": "lab10.rank_branch", "outcome": "pass", "score": 1e6, "feedback": "ok"},
              {"exercise": "lab10.send_send", "outcome": "invented", "score": 1, "feedback": "ok"},
              {"exercise": "lab02.sync", "outcome": "pass", "score": 1, "feedback": "not asked for"}]
    (tmp_path / "result.json").write_text(json.dumps(forged))
    rows = {r["exercise"]: r for r in classrun._checked_rows(item, "en")}
    assert set(rows) == {"lab10.rank_branch", "lab10.send_send", "lab10.accum_steps"}
    assert rows["lab10.rank_branch"]["score"] == rows["lab10.rank_branch"]["max_score"] == 1
    assert rows["lab10.send_send"]["outcome"] == rows["lab10.accum_steps"]["outcome"] == "error"
    assert rows["lab10.send_send"]["score"] == rows["lab10.accum_steps"]["score"] == 0


def test_scan_refuses_oversized_files_and_unknown_env_files(tmp_path, monkeypatch):
    folder = tmp_path / "class"
    folder.mkdir()
    monkeypatch.setattr(intake, "MAX_FILE_BYTES", 1000)
    (folder / "big.ipynb").write_text(notebook(["%%writefile lab10_send_send.py\n" + "x = 1\n" * 300]))
    (folder / "mystery.env").write_text("NCCL_DEBUG=INFO\n")
    (folder / "empty.ipynb").write_text(notebook(["print(1)"]))
    items = {i.rel: i for i in classrun.scan(folder, "en")}
    assert items["big.ipynb"].error[0] == "class_too_large"
    assert items["mystery.env"].error[0] == "class_unknown_env"
    assert items["empty.ipynb"].error[0] == "class_no_exercises"


def test_results_are_replaced_atomically(tmp_path, monkeypatch):
    target = tmp_path / "results.json"
    gradebook.write_atomic(target, '{"old": true}')

    def broken_replace(src, dst):
        raise OSError("disk gone")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError):
        gradebook.write_atomic(target, '{"new": true}')
    assert json.loads(target.read_text()) == {"old": True}
    assert [p.name for p in tmp_path.iterdir()] == ["results.json"]


HOSTILE_NAMES = ("=1+1", "+1", "-1", "@SUM(A1)", "\tx", "alice;=1+2", "bob,=HYPERLINK(\"http://x\")",
                 "carol\t@SUM(A1)", "dave; +1", "eve|=cmd", "=1;2", "mallory\n=2")


def test_csv_cells_never_start_a_formula():
    for text in HOSTILE_NAMES:   # (a line break becomes a space: "mallory =2" starts no cell)
        cell = gradebook.csv_cell(text)
        assert "\n" not in cell and ("'" in cell or text == "mallory\n=2"), text
    for text in ("=1+1", "+1", "-1", "@SUM(A1)"):
        assert gradebook.csv_cell(text) == "'" + text
    assert gradebook.csv_cell("alice;=1+2") == "alice;'=1+2"
    assert gradebook.csv_cell("alice") == "alice" and gradebook.csv_cell("o'brien, jr") == "o'brien, jr"


@pytest.mark.parametrize("separator", [",", ";", "\t"])
def test_a_spreadsheet_splitting_on_any_separator_sees_no_formula(separator):
    """The gradebook as a spreadsheet reads it with ``,`` or ``;`` (German, French settings) or tab as
    its list separator: no cell it makes starts a formula, and every cell is quoted."""
    import csv
    import io

    results = {"submissions": [{"student": name, "file": name + ".ipynb", "verdicts": [
        {"exercise": "lab10.rank_branch", "score": 1.0, "max_score": 1, "outcome": "pass"}]} for name in HOSTILE_NAMES]}
    text = gradebook.gradebook_csv(results)
    assert all(line.startswith('"') for line in text.splitlines())
    for row in csv.reader(io.StringIO(text), delimiter=separator):
        for cell in row:   # (a reader that met a quote in mid-cell keeps it: the cell starts after it)
            start = cell.lstrip(' "')
            assert start[:1] not in gradebook.FORMULA_START, (separator, cell)


@pytest.mark.timeout(300)
def test_a_class_is_refused_without_a_sandbox_unless_no_sandbox_is_given(tmp_path, capsys, monkeypatch):
    """Where this machine cannot sandbox, a class whose exercises run code is not graded at all, and says
    why in both languages; --no-sandbox is the instructor's explicit choice."""
    from dtrain_lab import cli

    folder, out = tmp_path / "class", tmp_path / "grades"
    folder.mkdir()
    (folder / "alice.ipynb").write_text(notebook(["%%writefile lab10_rank_branch.py\n# YOUR CODE HERE\n"]))
    monkeypatch.setenv("DTRAIN_CAPS", "sandbox=0")   # what a machine that cannot build the sandbox answers
    args = ["grade", str(folder), "--out", str(out), "--lang", "en"]
    assert cli.main(args) == 2
    err = capsys.readouterr().err
    assert "cannot run the grader's sandbox" in err and "沙箱" in err and "Traceback" not in err, err
    assert not out.exists()
    assert cli.main(args + ["--no-sandbox"]) == 0
    (v,) = json.loads((out / "results.json").read_text(encoding="utf-8"))["submissions"][0]["verdicts"]
    assert v["outcome"] == "error" and "not attempted" in v["feedback"]
