"""The Gradescope autograder: ``dtrain-lab autograder build LAB --out FILE.zip`` and its
``run_autograder``, run end to end in a temporary $AUTOGRADER_ROOT with the zip's own wheel installed
(no network: ``pip install --no-deps --target``), on cheap submissions: one lab 10 exercise that runs
on 2 ranks, stubs that are refused before anything runs, lab 11 `.env` files (read, never run).
Gradescope's format: gradescope-autograders.readthedocs.io/en/latest/specs/ (``docs/specs.md`` of
gradescope/autograder_samples)."""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import pytest

from conftest import ROOT
from dtrain_lab import caps
from dtrain_lab.grading import autograder, gradebook, intake, registry
from dtrain_lab.i18n import LabError
from test_classrun import BOM, LAB11, env_solutions, notebook

VISIBILITY = {"visible", "hidden", "after_due_date", "after_published"}


def check_gradescope(doc: dict) -> None:
    """The fields of Gradescope's results.json this autograder writes, with their types and limits."""
    assert isinstance(doc["score"], (int, float)) and isinstance(doc["execution_time"], int)
    assert isinstance(doc["output"], str) and len(doc["output"].encode()) <= 64 * 1024
    assert doc.get("visibility", "visible") in VISIBILITY and doc.get("stdout_visibility", "hidden") in VISIBILITY
    for t in doc["tests"]:
        assert isinstance(t["name"], str) and t["name"]
        assert isinstance(t["score"], float) and isinstance(t["max_score"], float) and 0 <= t["score"] <= t["max_score"]
        assert t["status"] in ("passed", "failed") and t["visibility"] in VISIBILITY
        assert isinstance(t["output"], str) and len(t["output"].encode()) <= 64 * 1024
        assert isinstance(t["extra_data"]["execution_time"], float)
    assert doc["score"] == sum(t["score"] for t in doc["tests"])


def test_lab_is_named_three_ways_and_help_lists_every_lab():
    for text in ("lab10", "10", "lab_10", "lab-10", "lab_10_deadlocks", "LAB10"):
        assert intake.resolve_lab(text) == "lab_10", text
    for bad in ("lab_10_zero", "99", "lab", ""):
        with pytest.raises(LabError) as e:
            intake.resolve_lab(bad)
        assert "lab_10_deadlocks" in str(e.value) and "实验" in str(e.value)
    r = subprocess.run([sys.executable, "-m", "dtrain_lab.cli", "autograder", "build", "--help"],
                       capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    labs = sorted({e.lab for e in registry.all_exercises()})
    names = {p.stem[:6]: p.stem for p in (ROOT / "solutions" / "_source").glob("lab_*.md")}
    for lab in labs:   # derived from the registry: a new lab appears without touching the autograder
        assert lab in r.stdout and names[lab] in r.stdout, (lab, r.stdout)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """Zips of lab 10 (sandboxed; and one allowed to run unsandboxed), of lab 11's roce exercise when the
    grader has lab 11, and one install of their wheel. The install lies outside /tmp: a rank's sandbox
    mounts a private /tmp over it (in Gradescope the course is in /opt/dtrain-lab/venv)."""
    tmp = tmp_path_factory.mktemp("ag")
    zips = {"lab10": autograder.build("lab_10_deadlocks", tmp / "lab10.zip", lang="en")}
    with zipfile.ZipFile(zips["lab10"]) as z:
        wheel = tmp / next(n for n in z.namelist() if n.startswith("wheels/"))
        z.extract(wheel.relative_to(tmp).as_posix(), tmp)
    zips["open"] = autograder.build("10", tmp / "open.zip", lang="en", exercises=["lab10.send_send"],
                                    allow_unsandboxed=True, wheel=wheel)
    if LAB11:
        zips["roce"] = autograder.build("11", tmp / "roce.zip", exercises=["lab11.roce"], lang="en", wheel=wheel)
    site = Path(tempfile.mkdtemp(prefix="dtrain-ag-site-", dir="/var/tmp"))
    site.chmod(0o755)   # as /opt/dtrain-lab in Gradescope: unsandboxed ranks run as a uid of their own
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target", str(site),
                    str(wheel)], check=True, timeout=300)
    yield {**zips, "site": site}
    shutil.rmtree(site, ignore_errors=True)


def test_zip_layout_setup_and_pins(built, tmp_path):
    with zipfile.ZipFile(built["lab10"]) as z:
        names = z.namelist()
        infos = {i.filename: i for i in z.infolist()}
        config = json.loads(z.read("autograder.json"))
        setup = z.read("setup.sh").decode()
        z.extractall(tmp_path)
    assert {"setup.sh", "run_autograder", "autograder.json"} <= set(names)       # at the root of the zip
    for script in ("setup.sh", "run_autograder"):
        assert (infos[script].external_attr >> 16) & 0o111, f"{script} is not executable once unzipped"
        r = subprocess.run(["bash", "-n", str(tmp_path / script)], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        assert "@" + "LAB_NAME@" not in (tmp_path / script).read_text()
    wheel = [n for n in names if re.fullmatch(r"wheels/dtrain_lab-[^/]+-py3-none-any\.whl", n)]
    assert len(wheel) == 1
    with zipfile.ZipFile(tmp_path / wheel[0]) as w:
        inside = set(w.namelist())
    assert {"dtrain_lab/grading/autograder.py", "dtrain_lab/grading/messages.toml", "dtrain_lab/i18n/messages.toml",
            "dtrain_lab/sandbox/supervisor.py"} <= inside
    assert not [n for n in inside if n.startswith(("tests/", "solutions/", "labs/"))]
    # the CPU build of torch comes from PyTorch's own index, at exactly the version the course pins
    pins = dict(re.findall(r'"(torch|deepspeed)==([^"]+)"', (ROOT / "pyproject.toml").read_text()))
    assert "https://download.pytorch.org/whl/cpu" in setup
    assert re.search(r'--index-url "\$TORCH_INDEX" "torch==' + re.escape(pins["torch"]) + '"', setup), setup
    assert f'"deepspeed=={pins["deepspeed"]}"' in setup and "wheels/*.whl" in setup
    assert "chmod 700" in setup and "grading/checks" in setup        # references unreadable to the submission's user
    assert config["lab"] == "lab_10" and config["name"] == "lab_10_deadlocks" and not config["allow_unsandboxed"]
    assert config["exercises"] == [e.id for e in registry.all_exercises() if e.lab == "lab_10"]
    with zipfile.ZipFile(built["open"]) as z:
        open_config = json.loads(z.read("autograder.json"))
    assert open_config["exercises"] == ["lab10.send_send"] and open_config["allow_unsandboxed"]


def run_autograder(built, tmp_path, zip_key, files: dict, env: dict | None = None, corrupt: bool = False):
    root = tmp_path / "autograder"
    (root / "submission").mkdir(parents=True)
    (root / "source").mkdir()
    with zipfile.ZipFile(built[zip_key]) as z:
        z.extractall(root / "source")
    if corrupt:
        (root / "source" / "autograder.json").write_text("{ not json")
    for name, data in files.items():
        path = root / "submission" / name
        path.write_bytes(data if isinstance(data, bytes) else data.encode())
    run_env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "AUTOGRADER_ROOT": str(root),
               "DTRAIN_AUTOGRADER_PYTHON": sys.executable, "PYTHONPATH": str(built["site"]), **(env or {})}
    r = subprocess.run(["/bin/bash", str(root / "source" / "run_autograder")], capture_output=True, text=True,
                       timeout=300, env=run_env, cwd=root)
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads((root / "results" / "results.json").read_text(encoding="utf-8"))
    check_gradescope(doc)
    return doc, r


def by_exercise(doc):
    return {t["extra_data"]["exercise"]: t for t in doc["tests"]}


def lab10_notebook(prefix: str = "") -> bytes:
    """One exercise solved (one launch on 2 ranks), one still the learner's stub (nothing launched);
    saved by an editor that writes a byte-order mark. ``prefix``: code the solved file starts with."""
    from lab10_cases import PROGRAMS

    return BOM + notebook(["%%writefile lab10_send_send.py\n" + prefix + PROGRAMS["send_send"]["solution"],
                           "%%writefile lab10_rank_branch.py\n" + PROGRAMS["rank_branch"]["learner"]]).encode()


@pytest.mark.timeout(300)
def test_run_autograder_grades_one_notebook_in_the_sandbox_with_the_wheel(built, tmp_path):
    if not caps.sandbox_probe().ok:
        pytest.skip(f"no sandbox on this machine: {caps.sandbox_probe().reason}")
    doc, _ = run_autograder(built, tmp_path, "lab10", {"lab_10_deadlocks.ipynb": lab10_notebook(), "notes.py": "x = 1\n"})
    tests = by_exercise(doc)
    lab10 = [e.id for e in registry.all_exercises() if e.lab == "lab_10"]
    assert set(lab10) <= set(tests)                                   # every exercise of the lab has a row
    assert tests["lab10.send_send"]["status"] == "passed" and tests["lab10.send_send"]["score"] == 1.0
    assert tests["lab10.send_send"]["extra_data"]["execution_time"] > 0
    assert tests["lab10.rank_branch"]["status"] == "failed" and "not attempted" in tests["lab10.rank_branch"]["output"]
    assert tests[""]["max_score"] == 0.0 and "notes.py" in tests[""]["output"]   # the stray file has a row
    assert doc["score"] == 1.0 and doc["tests"][0]["visibility"] == "visible"
    assert doc["extra_data"]["package"].startswith(str(built["site"])), "graded with the zip's own wheel"
    assert doc["extra_data"]["sandbox"]["mode"] == "namespaces"


def no_bwrap_path(tmp_path) -> str:
    """A PATH with the shell tools run_autograder uses and no bubblewrap (the container may still have
    the course's own; run with DTRAIN_CAPS=sandbox=0 for one whose kernel forbids namespaces)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("mkdir", "chmod", "cat", "python3"):
        found = shutil.which(tool)
        if found:
            (bin_dir / tool).symlink_to(found)
    return str(bin_dir)


@pytest.mark.timeout(300)
def test_without_a_sandbox_code_is_not_run_unless_the_instructor_allowed_it(built, tmp_path):
    """Where the container cannot sandbox: by default a launched exercise is not run (0 points, the reason
    in the results); built with --allow-unsandboxed it runs and every result says it was unprotected."""
    # a container whose seccomp profile forbids namespaces (Docker's default): the sandbox cannot be built
    path = {"PATH": no_bwrap_path(tmp_path), "DTRAIN_CAPS": "sandbox=0"}
    doc, _ = run_autograder(built, tmp_path / "refused", "lab10", {"lab.ipynb": lab10_notebook()}, env=path)
    assert doc["extra_data"]["sandbox"]["mode"] == "refused" and doc["score"] == 0
    assert "cannot run the grader's sandbox" in doc["output"]
    assert by_exercise(doc)["lab10.send_send"]["status"] == "failed"
    expect = refusal_expected()
    doc, _ = run_autograder(built, tmp_path / "open", "open", {"lab.ipynb": lab10_notebook(ATTACK)}, env=path)
    if expect is None:
        assert doc["extra_data"]["sandbox"]["mode"] == "unsandboxed"
        # graded as its own uid: the attack could neither write the results nor stop the grader
        assert "not protected" in doc["output"] and doc["score"] == 1.0, json.dumps(doc["tests"])[:3000]
        assert by_exercise(doc)["lab10.send_send"]["status"] == "passed"
    else:   # not root, or the course's Python not readable by other users: refused, saying why
        assert doc["extra_data"]["sandbox"]["mode"] == "refused" and doc["score"] == 0
        assert expect in doc["extra_data"]["sandbox"]["reason"], doc["extra_data"]["sandbox"]


# run at import, in every rank: forge a full-marks results.json and kill every process up to init
ATTACK = """
import json as _json, os as _os, signal as _signal
_root = _os.environ.get("AUTOGRADER_ROOT", "/autograder")
for _p in (_root + "/results/results.json", _root + "/results/../results/results.json"):
    try:
        with open(_p, "w") as _f:
            _json.dump({"score": 99, "output": "forged", "extra_data": {"sandbox": {"mode": "namespaces"}}}, _f)
    except OSError:
        pass
_pid = _os.getppid()
while _pid > 1:
    try:
        _next = int(open(f"/proc/{_pid}/stat").read().rsplit(")", 1)[1].split()[1])
        _os.kill(_pid, _signal.SIGKILL)
    except (OSError, ValueError):
        break
    _pid = _next
"""


def refusal_expected() -> str | None:
    """What the unsandboxed autograder must answer here: None where a rank running as another uid can
    read the course's Python (it is graded, as in Gradescope, whose setup.sh makes /opt/dtrain-lab
    readable by all), else words of its refusal (not root; or this Python lives where other users
    cannot read, e.g. pyenv under a 0700 /root)."""
    from dtrain_lab.sandbox import runas

    if os.geteuid() != 0:
        return "grader's own user"
    return None if runas.unreachable_as(runas.fresh_uid()) is None else "cannot read"


@pytest.mark.timeout(300)
def test_a_bom_env_is_graded_as_without_it(built, tmp_path):
    if not LAB11:
        pytest.skip("lab 11 is not in the grader's registry yet")
    text = env_solutions()["lab11_roce.env"]["solution"]
    plain, _ = run_autograder(built, tmp_path / "a", "roce", {"my_answer.env": text})
    bom, _ = run_autograder(built, tmp_path / "b", "roce", {"my_answer.env": BOM + text.encode()})
    assert [t["status"] for t in plain["tests"]] == [t["status"] for t in bom["tests"]] == ["passed"]
    assert bom["score"] == 1.0


@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", ["none", "several", "malformed", "bad_name", "grader_config", "no_python"])
def test_bad_submissions_score_zero_with_a_valid_results_json(built, tmp_path, case):
    from lab10_cases import PROGRAMS

    nb = notebook(["%%writefile lab10_send_send.py\n" + PROGRAMS["send_send"]["solution"]])
    files = {"none": {}, "several": {"a.ipynb": nb, "b.ipynb": nb},
             "malformed": {"lab.ipynb": '{"cells": ['},
             "bad_name": {os.fsdecode(b"lab\xff.ipynb"): '{"cells": ['}}.get(case, {"lab.ipynb": nb})
    env = {"DTRAIN_AUTOGRADER_PYTHON": "/nonexistent/python"} if case == "no_python" else None
    doc, r = run_autograder(built, tmp_path, "lab10", files, env=env, corrupt=case == "grader_config")
    assert doc["score"] == 0, doc
    text = doc["output"] + " ".join(t["output"] for t in doc["tests"])
    expected = {"none": "No submission was found", "several": "upload exactly one",
                "malformed": "not a valid notebook", "bad_name": "lab\ufffd.ipynb: not a valid notebook",
                "grader_config": "The autograder failed",
                "no_python": "The autograder failed"}[case]
    assert expected in text, text
    if case in ("none", "several", "malformed", "bad_name"):   # and still a row, at 0, for every exercise of the lab
        assert {e.id for e in registry.all_exercises() if e.lab == "lab_10"} <= set(by_exercise(doc))


def test_outputs_are_cut_to_64_kib_on_a_character_boundary():
    long = "死锁" * 40000 + "end"                           # 240 kB of 3-byte characters
    cut = gradebook.truncate(long)
    assert len(cut.encode("utf-8")) <= 64 * 1024 and cut.startswith("死锁") and "bytes cut" in cut
    v = {"exercise": "lab10.send_send", "passed": False, "score": 0.0, "max_score": 1, "outcome": "wrong",
         "feedback": long, "elapsed": 1.25}
    doc = gradebook.gradescope_json([v], lang="en")
    check_gradescope(doc)
    assert doc["tests"][0]["extra_data"]["execution_time"] == 1.25 and doc["execution_time"] == 1


def test_a_hidden_check_module_travels_outside_the_wheel(tmp_path):
    hidden = tmp_path / "my_private_checks.py"
    hidden.write_text("# instructor checks\n")
    out = autograder.build("lab10", tmp_path / "h.zip", exercises=["lab10.send_send"], lang="zh",
                           hidden_checks=[str(hidden)])
    with zipfile.ZipFile(out) as z:
        assert "hidden/my_private_checks.py" in z.namelist()
        config = json.loads(z.read("autograder.json"))
        with zipfile.ZipFile(z.open(next(n for n in z.namelist() if n.startswith("wheels/")))) as w:
            assert not [n for n in w.namelist() if "my_private_checks" in n]
    assert config["hidden_checks"] == ["my_private_checks"] and config["lang"] == "zh"
