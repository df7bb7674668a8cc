"""Lab 11 (NCCL configuration): every solution passes, every learner stub is "not yet", what a
learner starts from and plausible wrong answers fail with the right explanation, and the static
grader gives a verdict for anything it is handed without running, expanding or launching it.

Solutions and stubs come from the lab's one source, solutions/_source/lab_11_nccl.md; plausible
wrong answers live in tests/submissions/lab11/. Static checks are instant; the one launched
exercise (eval_timeout) costs a few launches, so it is graded as few times as possible."""
import importlib
import json
import re
import uuid
from pathlib import Path

import pytest

from conftest import ROOT, grade, grade_notebook
from dtrain_lab import authoring
from dtrain_lab.grading import lab11, registry, submissions_in_notebook
from dtrain_lab.grading.checks import lab11 as lab11_checks
from dtrain_lab.nccl.vars import NOT_VARIABLES, VARS

SOURCE = ROOT / "solutions" / "_source" / "lab_11_nccl.md"
WRONG = ROOT / "tests" / "submissions" / "lab11"
STUB_LINE = "# YOUR CODE HERE"


def cells() -> dict:
    """``{name: {"solution": text, "learner": text}}`` from the lab's %%writefile cells."""
    out = {}
    for cell in authoring.parse(SOURCE.read_text(encoding="utf-8")):
        text = cell.text.get("*", "")
        if cell.kind == "code" and text.startswith("%%writefile lab11_"):
            first, _, body = text.partition("\n")
            out[first.split()[1][len("lab11_"):].rsplit(".", 1)[0]] = authoring.blocks(body)
    return out


CELLS = cells()
EXERCISES = {e.id.split(".", 1)[1]: e for e in registry.all_exercises() if e.lab == "lab_11"}
STATIC = sorted(n for n, e in EXERCISES.items() if e.static_check is not None)


def started_from(name: str) -> str:
    """What the learner starts from, without the stub marker: a learner who changes nothing."""
    return "\n".join(line for line in CELLS[name]["learner"].split("\n") if STUB_LINE not in line)


def submit(tmp_path, name: str, text: str, tag: str = "") -> Path:
    path = tmp_path / (tag or uuid.uuid4().hex[:8]) / EXERCISES[name].filename
    path.parent.mkdir()
    path.write_text(text)
    return path


def test_every_exercise_has_one_cell_and_there_are_six():
    assert sorted(CELLS) == sorted(EXERCISES)
    assert len(EXERCISES) >= 6 and len(STATIC) >= 5
    for name, ex in EXERCISES.items():
        assert ex.filename == f"lab11_{name}.{'env' if ex.static_check else 'py'}"
        assert ex.title["en"] and re.search(r"[\u4e00-\u9fff]", ex.title["zh"])
    assert "lab11_*.env" in (ROOT / "labs" / ".gitignore").read_text()


@pytest.fixture
def no_launch(monkeypatch):
    """Static grading must never launch anything."""
    def refuse(*a, **kw):
        raise AssertionError("a static exercise launched a job")
    monkeypatch.setattr(importlib.import_module("dtrain_lab.jobs.launch"), "launch", refuse)


# ------------------------------------------------------------------------ static (.env) exercises
# a plausible wrong answer per scenario, the language its feedback is checked in, and phrases the
# explanation must contain
WRONG_EXPECT = {
    "two_nodes": ("en", ["NCCL_SOCKET_IFNAME=ens1 also selects ens1f1", "prefix",
                         "no interface called 'ens1'", "Unable to find address for: 'ens1'"]),
    "roce": ("zh", ["还选中了 mlx5_10, mlx5_11", "mlx5_1 同时会选中", "NCCL_IB_GID_INDEX=1", "fe80::"]),
    "pcie_box": ("en", ["GPU1 and GPU2 are connected through SYS", "GPU2 and GPU3 share a PCIe switch (PIX)",
                        "NCCL_P2P_LEVEL"]),
    "small_shm": ("zh", ["NCCL_SHM_DISABLE=1 只是绕开症状", "--shm-size", "docker run"]),
    "hang_debug": ("en", ["NCCL_TIMEOUT is not an NCCL environment variable", "TORCH_NCCL_DUMP_ON_TIMEOUT='0' stops",
                          "TORCH_DISTRIBUTED_DEBUG=DETAIL", "it is 'INFO' now"]),
}


@pytest.mark.parametrize("name", STATIC)
def test_static_exercise(name, tmp_path, no_launch):
    ex = EXERCISES[name]
    v = grade(ex.id, submit(tmp_path, name, CELLS[name]["solution"]), lang="en")
    assert v.passed and v.outcome == "pass" and v.score == ex.max_score, v.feedback

    stub = grade(ex.id, submit(tmp_path, name, CELLS[name]["learner"]), lang="zh")
    assert stub.outcome == "error" and stub.details.get("not_yet") and "尚未作答" in stub.feedback

    start = grade(ex.id, submit(tmp_path, name, started_from(name)), lang="en")
    assert start.outcome == "wrong" and not start.passed and start.feedback.count("\n  - ") >= 1, start.feedback

    lang, phrases = WRONG_EXPECT[name]
    wrong = grade(ex.id, WRONG / f"{name}_wrong.env", lang=lang)
    assert wrong.outcome == "wrong", wrong.feedback
    for phrase in phrases:
        assert phrase in wrong.feedback, (phrase, wrong.feedback)
    if lang == "zh":
        assert "还不对" in wrong.feedback
    else:
        assert not re.search(r"[\u4e00-\u9fff]", wrong.feedback)


# other correct answers the rules must accept
ALSO_RIGHT = {
    "two_nodes": ["NCCL_SOCKET_IFNAME=ens1f0\nGLOO_SOCKET_IFNAME=ens1f0\n",
                  "\ufeffNCCL_SOCKET_IFNAME==ens1f0\r\nGLOO_SOCKET_IFNAME=ens1f0\r\nNCCL_DEBUG=WARN\r\n"],   # BOM, CRLF
    "roce": ["NCCL_IB_HCA=^=mlx5_8,mlx5_9,mlx5_10,mlx5_11\nNCCL_IB_GID_INDEX=3\nNCCL_IB_TC=106\n",
             ("NCCL_IB_HCA==mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1,mlx5_4:1,mlx5_5:1,mlx5_6:1,mlx5_7:1\n"
             "NCCL_IB_GID_INDEX=3\nNCCL_IB_TC=106\nNCCL_IB_DISABLE=0\n")],
    "pcie_box": ["CUDA_VISIBLE_DEVICES=3,2\n", "CUDA_VISIBLE_DEVICES=GPU-0c4d8f21,GPU-e2f61a97\n"],
    "small_shm": ["NCCL_DEBUG=INFO\nNCCL_DEBUG_SUBSYS=INIT,SHM\n"],
    "hang_debug": ["NCCL_DEBUG=INFO\nTORCH_DISTRIBUTED_DEBUG=DETAIL\n",   # the flight recorder is on by default
                   ("NCCL_DEBUG=INFO\nTORCH_NCCL_TRACE_BUFFER_SIZE=2000\nTORCH_NCCL_DUMP_ON_TIMEOUT=1\n"
                    "TORCH_DISTRIBUTED_DEBUG=DETAIL\n"),
                   ("NCCL_DEBUG=INFO\nNCCL_DEBUG_SUBSYS=INIT,COLL\nNCCL_DEBUG_FILE=/scratch/nccl.%h.%p.log\n"
                   "TORCH_FR_BUFFER_SIZE=4000\nTORCH_NCCL_DUMP_ON_TIMEOUT=1\nTORCH_DISTRIBUTED_DEBUG=DETAIL\n"
                   "TORCH_NCCL_ASYNC_ERROR_HANDLING=3\n")],
}


@pytest.mark.parametrize("name", STATIC)
def test_other_right_answers_pass(name, tmp_path, no_launch):
    for text in ALSO_RIGHT[name]:
        v = grade(EXERCISES[name].id, submit(tmp_path, name, text), lang="en")
        assert v.passed, (text, v.feedback)


# more wrong answers, one explanation each (exercise, file, phrase that must be in the feedback)
MORE_WRONG = [
    ("two_nodes", "NCCL_SOCKET_IFNAME=^eno1,ens1f1\nGLOO_SOCKET_IFNAME=ens1f0\n", "everything except these"),
    ("two_nodes", "NCCL_SOCKET_IFNAME==ens1f0\n", "GLOO_SOCKET_IFNAME is not set"),
    ("two_nodes", "NCCL_SOCKET_IFNAME==ens1f0\nGLOO_SOCKET_IFNAME==ens1f0\n", "NCCL_SOCKET_IFNAME syntax"),
    ("two_nodes", "NCCL_SOCKET_IFNAME==ens1f0\nGLOO_SOCKET_IFNAME=ens1f0\nNCCL_IB_DISABLE=1\n", "no RDMA device"),
    ("two_nodes", "NCCL_SOCKET_IFNAME=eno1,=ens1f0\nGLOO_SOCKET_IFNAME=ens1f0\n", "the = is written once"),
    ("roce", "NCCL_IB_HCA=mlx5\nNCCL_IB_DISABLE=1\n", "turns the IB/RoCE transport off"),
    ("roce", "NCCL_IB_HCA==mlx5_0,mlx5_1,mlx5_2,mlx5_3,mlx5_4,mlx5_5,mlx5_6,mlx5_7\nNCCL_IB_TC=106\n",
     "uses index 0 when it is unset"),
    ("roce", ("NCCL_IB_HCA==mlx5_0,mlx5_1,mlx5_2,mlx5_3,mlx5_4,mlx5_5,mlx5_6,mlx5_7\nNCCL_IB_GID_INDEX=2\n"
             "NCCL_IB_TC=106\n"), "cannot be routed"),
    ("roce", "NCCL_IB_HCA==mlx5_0,mlx5_1,mlx5_2,mlx5_3\nNCCL_IB_GID_INDEX=3\nNCCL_IB_TC=106\n",
     "leaves out mlx5_4, mlx5_5, mlx5_6, mlx5_7"),
    ("roce", ("NCCL_IB_HCA==mlx5_0,mlx5_1,mlx5_2,mlx5_3,mlx5_4,mlx5_5,mlx5_6,mlx5_7\nNCCL_IB_GID_INDEX=3\n"
             "NCCL_IB_TC=106\nNCCL_IB_ROCE_VERSION_NUM=2\n"), "was added in NCCL 2.21"),
    ("roce", "NCCL_IB_HCA==mlx5_0,mlx5_1,mlx5_2,mlx5_3,mlx5_4,mlx5_5,mlx5_6,mlx5_7\nNCCL_IB_GID_INDEX=3\n",
     "traffic class 106"),
    ("pcie_box", "NCCL_P2P_DISABLE=1\n", "CUDA_VISIBLE_DEVICES is not set"),
    ("pcie_box", "CUDA_VISIBLE_DEVICES=2,3\nNCCL_P2P_DISABLE=1\n", "having no NVLink is no reason"),
    ("pcie_box", "CUDA_VISIBLE_DEVICES=0,1\n", "taken by the inference server"),
    ("pcie_box", "CUDA_VISIBLE_DEVICES=1,2,3\n", "needs exactly 2"),
    ("pcie_box", "CUDA_VISIBLE_DEVICES=2,7\n", "is not a GPU of this box"),
    ("small_shm", "NCCL_DEBUG=INFO\nNCCL_P2P_DISABLE=1\n", "NVSwitch"),
    ("small_shm", "NCCL_CUMEM_HOST_ENABLE=1\nNCCL_DEBUG=WARN\n", "was added in NCCL 2.23"),
    ("small_shm", "NCCL_DEBUG=ATTN\n", "needs NCCL 2.32"),
    ("small_shm", "# nothing to do here\n", "Keep NCCL_DEBUG=WARN"),
    ("hang_debug", ("NCCL_DEBUG=TRACE\nTORCH_NCCL_TRACE_BUFFER_SIZE=2000\nTORCH_NCCL_DUMP_ON_TIMEOUT=1\n"
                   "TORCH_DISTRIBUTED_DEBUG=DETAIL\n"), "replayable trace"),
    ("hang_debug", ("NCCL_DEBUG=INFO\nTORCH_NCCL_TRACE_BUFFER_SIZE=0\nTORCH_NCCL_DUMP_ON_TIMEOUT=1\n"
                   "TORCH_DISTRIBUTED_DEBUG=DETAIL\n"), "switches the flight recorder off"),
    ("hang_debug", "NCCL_DEBUG=INFO\nTORCH_DISTRIBUTED_DEBUG=DETAIL\nTORCH_NCCL_ENABLE_MONITORING=0\n",
     "stops the flight recorder's record"),
    ("hang_debug", ("NCCL_DEBUG=INFO\nTORCH_NCCL_TRACE_BUFFER_SIZE=2000\nTORCH_NCCL_DUMP_ON_TIMEOUT=1\n"
                   "TORCH_DISTRIBUTED_DEBUG=DETAIL\nNCCL_IB_TIMEOUT=23\n"), "not a collective timeout"),
    ("hang_debug", ("NCCL_DEBUG=INFO\nTORCH_NCCL_TRACE_BUFFER_SIZE=2000\nTORCH_NCCL_DUMP_ON_TIMEOUT=1\n"
                   "TORCH_DISTRIBUTED_DEBUG=DETAIL\nNCCL_ALGO=Ring\n"), "Keep the configuration that hangs"),
    ("hang_debug", ("NCCL_DEBUG=INFO\nTORCH_NCCL_TRACE_BUFFER_SIZE=2000\nTORCH_NCCL_DUMP_ON_TIMEOUT=1\n"
                   "TORCH_DISTRIBUTED_DEBUG=DETAIL\nNCCL_ASYNC_ERROR_HANDLING=1\n"), "old name"),
    ("hang_debug", ("NCCL_DEBUG=INFO\nTORCH_NCCL_TRACE_BUFFER_SIZE=2000\nTORCH_NCCL_DUMP_ON_TIMEOUT=1\n"
                   "TORCH_DISTRIBUTED_DEBUG=DETAIL\nNCCL_DEBUG_FILE=/scratch/nccl.log\n"), "%h"),
]


@pytest.mark.parametrize("name,text,phrase", MORE_WRONG)
def test_more_wrong_answers_are_explained(name, text, phrase, tmp_path, no_launch):
    v = grade(EXERCISES[name].id, submit(tmp_path, name, text), lang="en")
    assert v.outcome == "wrong" and phrase in v.feedback, v.feedback


def test_hostile_static_submissions_get_verdicts(tmp_path, no_launch):
    ex_id = "lab11.two_nodes"
    canary = tmp_path / "canary"
    cases = {
        "binary": (b"\x7fELF\x02\x01\x01\x00" + bytes(range(256)) * 4, "error", "not a text file"),
        "latin1": ("NCCL_SOCKET_IFNAME=ens1f0 # caf\xe9\n".encode("latin-1"), "error", "UTF-8"),
        "huge": (b"NCCL_DEBUG=INFO\n" * (10 * 1024 * 1024 // 16), "error", "at most 65536 bytes"),
        "shell": (f"NCCL_SOCKET_IFNAME=$(touch {canary})\nGLOO_SOCKET_IFNAME=`touch {canary}`\n"
                  f"NCCL_DEBUG=${{HOME}}\n".encode(), "wrong", "read literally"),
        "not_env": (b"rm -rf ~\n", "error", "Write KEY=VALUE"),
        "export": (b"export NCCL_SOCKET_IFNAME==ens1f0\n", "error", "without export"),   # docker refuses it
        "bad_quote": (b"NCCL_SOCKET_IFNAME='=ens1f0\n", "wrong", "selects no interface"),   # docker keeps the quote
        "empty": (b"", "wrong", "NCCL_SOCKET_IFNAME is not set"),
        # docker run --env-file keeps quotes and "comments" in the value: wrong for this machine
        "quoted": (b'NCCL_SOCKET_IFNAME="=ens1f0"\nGLOO_SOCKET_IFNAME=ens1f0 # training\n', "wrong", "keeps quotes"),
        "loader": (b"NCCL_SOCKET_IFNAME==ens1f0\nGLOO_SOCKET_IFNAME=ens1f0\nLD_PRELOAD=/tmp/x.so\n", "wrong",
                   "LD_PRELOAD"),
    }
    for tag, (data, outcome, phrase) in cases.items():
        path = tmp_path / tag / "lab11_two_nodes.env"
        path.parent.mkdir()
        path.write_bytes(data)
        v = grade(ex_id, path, lang="en")
        assert v.outcome == outcome and phrase in v.feedback, (tag, v.feedback[:500])
        assert len(v.feedback) < 5000, tag
    assert not canary.exists(), "a value was executed"
    # a link to a right answer elsewhere is refused, never followed (and neither is a link to a secret)
    right = submit(tmp_path, "two_nodes", CELLS["two_nodes"]["solution"])
    for tag, target in (("link", right), ("secret", Path.home() / ".ssh" / "id_rsa")):
        link = tmp_path / tag / "lab11_two_nodes.env"
        link.parent.mkdir()
        link.symlink_to(target)
        v = grade(ex_id, link, lang="en")
        assert v.outcome == "error" and not v.passed and "symbolic link" in v.feedback, v.feedback
    v = grade(ex_id, tmp_path / "missing" / "lab11_two_nodes.env", lang="zh")
    assert v.outcome == "error" and "找不到提交文件" in v.feedback
    d = tmp_path / "a_directory.env"
    d.mkdir()
    assert grade(ex_id, d, lang="en").outcome == "error"


def test_static_cells_of_a_notebook_are_graded(tmp_path, no_launch):
    nb = {"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": [
        {"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None,
         "source": f"%%writefile lab11_{name}.env\n" + CELLS[name]["solution"]} for name in STATIC]}
    nb["cells"][STATIC.index("two_nodes")]["source"] = ("%%writefile lab11_two_nodes.env\n"
                                                       + (WRONG / "two_nodes_wrong.env").read_text())
    path = tmp_path / "learner.ipynb"
    path.write_text(json.dumps(nb))
    assert set(submissions_in_notebook(path)) == {f"lab11.{n}" for n in STATIC}
    verdicts = {v.exercise: v for v in grade_notebook(path, lang="en")}
    assert not verdicts["lab11.two_nodes"].passed
    assert all(v.passed for k, v in verdicts.items() if k != "lab11.two_nodes")


def test_rules_name_only_documented_variables():
    """Every NCCL / PyTorch / Gloo variable the lab's rules and solutions mention is in the knowledge
    base (or is one of the names the knowledge base says nothing reads)."""
    families = re.compile(r"\b((?:TORCH_)?NCCL_[A-Z0-9_]*[A-Z0-9]|TORCH_DISTRIBUTED_DEBUG|TORCH_FR_[A-Z_]+"
                          r"|GLOO_[A-Z_]+)\b")
    text = Path(lab11_checks.__file__).read_text() + SOURCE.read_text() + "".join(p.read_text() for p in WRONG.iterdir())
    names = set(families.findall(text)) - {"NCCL_IB_CUDA_SUPPORT"}  # the lint demo's removed variable
    unknown = sorted(n for n in names if n not in VARS and n not in NOT_VARIABLES)
    assert not unknown, unknown


def test_machine_data_matches_the_lab_text():
    text = SOURCE.read_text()
    m = lab11_checks
    for name in m.ETH_INTERFACES + m.ROCE_HCAS[:2] + m.ROCE_HCAS[8:] + m.PCIE_UUIDS:
        assert name in text, name
    assert m.ROCE_NCCL in text and m.SHM_NCCL in text and str(m.ROCE_TC) in text
    assert f"{lab11.PG_TIMEOUT_S:g}-second" in text and f"VAL_SIZE = {lab11.VAL_SIZE}" in text


# ------------------------------------------------------------------------ the launched exercise
@pytest.mark.timeout(400)
def test_eval_timeout(tmp_path):
    ex = EXERCISES["eval_timeout"]
    assert ex.pg_timeout <= 20 and ex.timeout <= 20
    assert lab11.SECONDS_PER_SAMPLE * lab11.VAL_SIZE > 1.5 * ex.pg_timeout   # rank 0 alone trips it

    # the solution's passing grade: solutions/{zh,en}/lab_11_nccl.ipynb, re-graded by nbval (test_solution_cells.py)
    stub = grade(ex.id, submit(tmp_path, "eval_timeout", CELLS["eval_timeout"]["learner"]), lang="en")
    assert stub.outcome == "error" and "not attempted" in stub.feedback

    # the program the learner starts from, with the environment "fix": the timeout trips on gloo
    wrong = grade(ex.id, WRONG / "eval_timeout_wrong.py", lang="zh")
    assert wrong.outcome == "crash", wrong.feedback
    assert "Timed out waiting 4000ms" in wrong.feedback and "这是进程组的超时" in wrong.feedback
    assert "NCCL_TIMEOUT 不是任何组件会读取的变量" in wrong.feedback
    assert "TORCH_NCCL_BLOCKING_WAIT 只是让 wait() 阻塞" in wrong.feedback

    # the other fix: rank 0 alone evaluates, the others wait in a group with a longer timeout
    other = grade(ex.id, WRONG / "eval_timeout_new_group.py", lang="en")
    assert other.passed, other.feedback

    # no communication: the ranks other than 0 cannot read rank 0's samples, and the practice data
    # they can compute is not the graded run's
    attack = grade(ex.id, WRONG / "no_communication.py", lang="en")
    assert attack.outcome == "wrong" and not attack.passed, attack.feedback
    assert "the mean metric over the whole validation set should be" in attack.feedback


def test_eval_explanations_without_launching():
    """The explanation attached to a failed run, for outcomes that are slow to produce for real."""
    hang = lab11_checks._explain_eval("hang", "hung", "import os\nos.environ['NCCL_DEBUG'] = 'INFO'\n")
    assert any("process group's timeout" in p["en"] and "default_pg_nccl_timeout" in p["en"] for p in hang)
    assert any("NCCL_DEBUG" in p["en"] and "no environment variable" in p["en"] for p in hang)
    assert lab11_checks._explain_eval("wrong", "should be 0.45", "def run(): return 0") == []
