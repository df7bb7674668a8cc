"""Attacks on the grader (issue 13, groups 1-3 and group 5's symlink): none scores, none leaves a
process running, none changes a file outside its sandbox, and feedback never carries what an attack
read. Each attack is a submission a dishonest learner could hand in; the grader runs it as it runs
any other. (Class runs and Gradescope, groups 4 and 6, are tested in test_classrun / test_autograder.)

Skipped where this machine cannot run the sandbox (a kernel that forbids unprivileged user namespaces,
or ``DTRAIN_CAPS=sandbox=0``): there the grader gives no grade at all, which test_grading checks."""
import json
import os
import time
import uuid
from pathlib import Path

import psutil
import pytest

from conftest import ROOT, new_tag, processes_with_tag
from dtrain_lab import caps
from dtrain_lab.grading import grade, grade_folder, registry
from dtrain_lab.grading.exercise import own_words
from dtrain_lab.sandbox import bwrap as sandbox

PROBE = caps.sandbox_probe()
pytestmark = pytest.mark.skipif(not PROBE.ok, reason=f"no sandbox on this machine: {PROBE.reason}")
_TAG = [""]


@pytest.fixture(autouse=True)
def _since_now():
    """Processes of this test's grades are counted from here (conftest.processes_with_tag)."""
    _TAG[0] = new_tag()


@pytest.fixture
def mode():
    """The sandbox every grade runs in (bubblewrap: the course's one sandbox builder)."""
    return "bwrap"
HEAD = "import os, sys, time, subprocess\nimport torch\nimport torch.distributed as dist\n"


def submit(tmp_path: Path, name: str, code: str) -> Path:
    path = tmp_path / name / "submission.py"
    path.parent.mkdir(parents=True)
    path.write_text(HEAD + code)
    return path


def survivors(verdict, *markers: str) -> list:
    """Processes still alive from this test's grades (in this test process's tree, where the grader's
    processes and anything that escaped them are), or anywhere with a marker in their command line."""
    left = [(p.pid, " ".join(p.cmdline())[:100]) for p in processes_with_tag(_TAG[0])]
    for p in psutil.process_iter(["cmdline"]):
        try:
            if p.status() == psutil.STATUS_ZOMBIE:
                continue
            cmd = " ".join(p.info["cmdline"] or [])
            if any(m in cmd for m in markers):
                left.append((p.pid, cmd[:100]))
        except (psutil.Error, OSError):
            continue
    return left


def assert_failed_and_clean(v, *markers, grace=6.0, mode=None):
    assert not v.passed and v.score == 0, v.feedback
    if mode is not None:
        assert {r["mode"] for r in v.details["runs"]} == {mode}, v.details["runs"]
    deadline = time.monotonic() + grace
    while survivors(v, *markers) and time.monotonic() < deadline:
        time.sleep(0.3)
    assert not survivors(v, *markers), survivors(v, *markers)
    assert len(v.feedback) <= 17_000


GRADER_FILES = sorted((ROOT / "dtrain_lab" / "grading").rglob("*.py")) + [ROOT / "dtrain_lab" / "grading" / "messages.toml"]


# ------------------------------------------------------------------ group 1: the checks are out of reach
@pytest.mark.timeout(200)
def test_success_record_then_os_exit(tmp_path):
    """Forge the result and the 'done' event in the rank's own result files, then os._exit(0): the value
    is checked outside like any other, and it is wrong (the rank never had its peers' losses)."""
    code = '''
import json
from dtrain_lab.grading import channel
from dtrain_lab.grading.lab10 import local_loss


def run():
    io = os.environ["DTRAIN_GRADE_IO"]
    channel.write(os.path.join(io, "result"), local_loss())            # "the right answer"
    with open(os.path.join(io, "events"), "a") as f:
        f.write(json.dumps({"ev": "done", "t": time.time()}) + "\\n")
    sys.stdout.flush()
    time.sleep(2)     # let the peer leave the harness's barrier first: an exit right after it can reset
    os._exit(0)       # the peer's connection, and the job then ends as a crash instead (still no pass)
'''
    v = grade("lab10.rank_branch", submit(tmp_path, "forge", code), lang="en")
    assert v.outcome in ("wrong", "crash"), v.feedback
    if v.outcome == "wrong":
        assert "mean loss over all ranks should be" in v.feedback, v.feedback
    assert_failed_and_clean(v)


@pytest.mark.timeout(200)
def test_registry_hidden_checks_and_grader_files_are_out_of_reach(mode, tmp_path):
    """Clear the registry and the hidden checks, import the checks, append to the grader's files: inside
    the sandbox none of it exists or is writable, and the instructor's hidden check still applies."""
    def hidden(run, rank, result):
        return [] if type(result) is float else [own_words("the result must be a Python float", "结果必须是 float")]

    registry.add_hidden_check("lab10.rank_branch", hidden)
    code = '''
import glob
from dtrain_lab.grading.lab10 import local_loss

TRIED = []


def attempt(what, fn):
    try:
        fn()
        TRIED.append(what + ": done")
    except BaseException as exc:
        TRIED.append(what + ": " + type(exc).__name__)


def clear():
    from dtrain_lab.grading import registry
    registry._REGISTRY.clear()
    registry.get("lab10.rank_branch").hidden.clear()


def append_everywhere():
    import dtrain_lab
    for path in glob.glob(os.path.dirname(dtrain_lab.__file__) + "/grading/**/*.py", recursive=True):
        with open(path, "a") as f:
            f.write("\\nPASS_EVERYTHING = True\\n")


def run():
    attempt("clear", clear)
    attempt("import checks", lambda: __import__("dtrain_lab.grading.checks.lab10"))
    attempt("append", append_everywhere)
    loss = torch.tensor([local_loss()])
    dist.all_reduce(loss)
    return loss / dist.get_world_size()          # a tensor, which the hidden check refuses
'''
    try:
        v = grade("lab10.rank_branch", submit(tmp_path, "registry", code), lang="en")
    finally:
        registry.get("lab10.rank_branch").hidden.remove(hidden)
    assert v.outcome == "wrong" and "must be a Python float" in v.feedback, v.feedback
    assert not [p for p in GRADER_FILES if "PASS_EVERYTHING" in p.read_text(encoding="utf-8")]
    assert_failed_and_clean(v, mode=mode)


@pytest.mark.timeout(200)
def test_patched_collectives_do_not_fake_communication(tmp_path):
    """Replace dist.all_reduce after the tracer is installed by one that does nothing (the trace still
    shows an all-reduce on every rank): the answer needs the peers' private losses, so it is wrong."""
    code = '''
from dtrain_lab.grading.lab10 import local_loss


def run():
    traced = dist.all_reduce
    dist.all_reduce = lambda t, *a, **k: (traced(torch.zeros(1)), None)[1]   # a real, empty collective
    loss = torch.tensor([local_loss()])
    dist.all_reduce(loss)
    return loss.item()
'''
    v = grade("lab10.rank_branch", submit(tmp_path, "patch", code), lang="en")
    assert v.outcome == "wrong" and "mean loss over all ranks" in v.feedback, v.feedback
    assert_failed_and_clean(v)


@pytest.mark.timeout(200)
def test_reference_solutions_cannot_be_imported_or_read(tmp_path):
    """The lab's reference (checks), the solution notebooks and the course's own ZeRO are not there."""
    code = f'''
import glob, importlib, math
from dtrain_lab.grading.lab05 import bounds_cases


def shard_bounds(numel, rank, world_size):
    found = []
    for name in ("dtrain_lab.grading.checks.lab05", "dtrain_lab.parallel.zero"):
        try:
            ref = importlib.import_module(name)
            return ref.reference_bounds(numel, rank, world_size)
        except Exception as exc:
            found.append(type(exc).__name__)
    src = glob.glob("{ROOT}/solutions/**/*.md", recursive=True)
    raise RuntimeError("nothing to copy: " + repr(found) + " " + repr(src))


def run():
    return bounds_cases(shard_bounds)
'''
    v = grade("lab05.shard_bounds", submit(tmp_path, "reference", code), lang="en")
    assert v.outcome == "wrong" and "nothing to copy: ['ModuleNotFoundError', 'ImportError'] []" in v.feedback, v.feedback
    assert_failed_and_clean(v)


# ------------------------------------------------------------------ group 2: no communication
NO_COMMUNICATION = {
    # every rank recomputes "every rank's data" from the generator the contract exposes (the seed is unknown)
    "lab10.rank_branch": '''
from dtrain_lab.grading.lab10 import make_inputs


def run():
    world = dist.get_world_size()
    return sum(i["loss"] for i in make_inputs(0, world)) / world
''',
    "lab10.uneven_batches": '''
from dtrain_lab.grading.lab10 import local_batches, make_inputs


def run():
    try:
        return sum(sum(local_batches(r)) for r in range(dist.get_world_size()))   # another rank's: refused
    except ValueError:
        return sum(sum(i["batches"]) for i in make_inputs(0, dist.get_world_size()))
''',
    "lab10.send_send": '''
from dtrain_lab.grading.lab10 import make_inputs, MESSAGE_NUMEL


def run():
    peer = make_inputs(0, 2)[1 - dist.get_rank()]["message"]
    t = torch.full((MESSAGE_NUMEL,), float(peer["fill"]))
    for i, v in peer["spots"]:
        t[i] = v
    dist.barrier()
    return t
''',
    # the literal answer, and a race: a barrier before the write, readers that sleep
    "lab10.barrier_rank0": '''
from dtrain_lab.grading.lab10 import checkpoint_path, write_checkpoint

PATH = checkpoint_path()


def run():
    dist.barrier()
    if dist.get_rank() == 0:
        write_checkpoint(PATH)
    else:
        time.sleep(1.0)
    try:
        return open(PATH).read()
    except OSError:
        return "step 100 checkpoint"
''',
    # decoy all-reduces of zeros, the gradient of "the global batch" recomputed locally
    "lab02.sync": '''
from dtrain_lab.grading.lab02 import train, make_inputs, lab_model
import torch.nn.functional as F


def sync_gradients(params, buckets, group=None):
    world, rank = dist.get_world_size(), dist.get_rank()
    for bucket in buckets:
        dist.all_reduce(torch.zeros(sum(params[i].numel() for i in bucket)))   # what the trace wants to see
    inputs = make_inputs(0, world)
    step = sync_gradients.step = getattr(sync_gradients, "step", -1) + 1
    model = lab_model()
    with torch.no_grad():
        for p, q in zip(model.parameters(), params):
            p.copy_(q)
    x = torch.cat([i["x"][step] for i in inputs])
    y = torch.cat([i["y"][step] for i in inputs])
    F.mse_loss(model(x), y).backward()
    for p, q in zip(params, model.parameters()):
        p.grad.copy_(q.grad)


def run():
    return train(sync_gradients)
''',
}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("ex_id", sorted(NO_COMMUNICATION))
def test_answers_without_communication_are_wrong(ex_id, tmp_path):
    v = grade(ex_id, submit(tmp_path, "nocomm", NO_COMMUNICATION[ex_id]), lang="en")
    assert v.outcome in ("wrong", "crash"), v.feedback
    assert_failed_and_clean(v)


# ------------------------------------------------------------------ group 3: the sandbox
@pytest.mark.timeout(200)
def test_secrets_are_not_readable_and_nothing_leaks_through_feedback(mode, tmp_path):
    """~/.ssh, a classmate's submission and the instructor's hidden-check source, read and leaked
    through the result (quoted in feedback) and through an exception message."""
    secret = f"SECRET-{uuid.uuid4().hex}"
    classmate = tmp_path / "bob" / "lab10_rank_branch.py"
    classmate.parent.mkdir()
    classmate.write_text(f"# {secret}\n")
    hidden = tmp_path / "instructor_hidden.py"
    hidden.write_text(f"# {secret}\n")
    ssh = Path.home() / ".ssh"
    code = f'''
def read(path):
    try:
        return open(path).read()
    except OSError as exc:
        return type(exc).__name__


def run():
    found = [read(p) for p in ({str(classmate)!r}, {str(hidden)!r}, {str(ssh / "id_rsa")!r}, "/etc/shadow",
                               {str(ROOT / "solutions" / "_source" / "lab_10_deadlocks.md")!r})]
    if dist.get_rank() == 1:
        raise RuntimeError("leak: " + " | ".join(found) * 1000)
    return " | ".join(found)
'''
    v = grade("lab10.rank_branch", submit(tmp_path, "leak", code), lang="en")
    assert secret not in v.feedback and secret not in json.dumps(v.details)
    assert "FileNotFoundError" in v.feedback and "BEGIN SOLUTION" not in v.feedback
    assert_failed_and_clean(v, mode=mode)


@pytest.mark.timeout(200)
def test_a_double_forked_env_i_daemon_dies_with_the_grade(mode, tmp_path):
    """`env -i setsid` twice forked (no job id left in its environment), waiting for the grader to end and
    then rewriting a results file: it dies with the sandbox, and the file is not even visible to it."""
    results = tmp_path / "results.json"
    results.write_text('{"score": 0}')
    marker = f"{time.time_ns() % 10**9}.{os.getpid()}"
    code = f'''
from dtrain_lab.grading.lab10 import local_loss


def run():
    script = "sleep {marker}; echo '{{\\\\"score\\\\": 100}}' > {results}"
    subprocess.Popen(["env", "-i", "setsid", "sh", "-c", "(" + script + ") &"], start_new_session=True)
    time.sleep(1)
    return local_loss()
'''
    v = grade("lab10.rank_branch", submit(tmp_path, "daemon", code), lang="en")
    assert_failed_and_clean(v, f"sleep {marker}", mode=mode)
    time.sleep(1)
    assert results.read_text() == '{"score": 0}'


@pytest.mark.timeout(300)
def test_a_notebook_cannot_rewrite_a_classmates_notebook(tmp_path):
    folder = tmp_path / "class"
    folder.mkdir()
    bob = folder / "bob.ipynb"
    good = (ROOT / "tests" / "submissions" / "lab10" / "rank_branch_wrong.py").read_text()
    attack = f'''import os, json
from dtrain_lab.grading.lab10 import local_loss


def run():
    for path in ({str(bob)!r}, "../bob.ipynb", os.path.expanduser("~/bob.ipynb")):
        try:
            with open(path, "w") as f:
                f.write("{{}}")
        except OSError:
            pass
    return local_loss()
'''

    def notebook(source):
        return json.dumps({"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": [
            {"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None,
             "source": "%%writefile lab10_rank_branch.py\n" + source}]})

    (folder / "alice.ipynb").write_text(notebook(attack))
    bob.write_text(notebook(good))
    before = bob.read_text()
    results = grade_folder(folder, lang="en")
    assert bob.read_text() == before
    assert [v.outcome for v in results["bob.ipynb"]] == ["wrong"] and not results["alice.ipynb"][0].passed


@pytest.mark.timeout(300)
def test_output_flood_and_huge_feedback_are_capped(mode, tmp_path, monkeypatch):
    """Gigabytes of output in a few seconds, a 40 MB result and a 40 MB exception: the logs stop at the
    sandbox's file-size limit, feedback stays short, and the job folder never holds more."""
    monkeypatch.setenv("DTRAIN_KEEP_GRADE_DIRS", "1")
    code = '''
def run():
    if dist.get_rank() == 0:
        line = "x" * 1_000_000 + "\\n"
        try:
            for _ in range(3000):                   # 3 GB
                sys.stdout.write(line)
        except OSError:
            pass
        return "y" * 40_000_000
    raise ValueError("z" * 40_000_000)
'''
    t0 = time.monotonic()
    v = grade("lab10.rank_branch", submit(tmp_path, "flood", code), lang="en")
    assert time.monotonic() - t0 < 120 and len(v.feedback) < 5000, (len(v.feedback), v.feedback[:500])
    assert "zzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzz" * 10 not in v.feedback
    for run in v.details["runs"]:
        job = Path(os.environ.get("DTRAIN_RUN_DIR") or "/tmp") / f"dtrain_grade-{os.getuid()}" / run["job"]
        if job.exists():
            sizes = [p.stat().st_size for p in job.rglob("*") if p.is_file()]
            assert max(sizes) <= sandbox.Limits().file_mb << 20 and sum(sizes) < 3 * (sandbox.Limits().file_mb << 20)
            import shutil
            shutil.rmtree(job, ignore_errors=True)
    assert_failed_and_clean(v, mode=mode)


# ------------------------------------------------------------------ group 5: symlinks
def test_a_symlinked_submission_is_refused(tmp_path):
    target = tmp_path / "elsewhere.py"
    target.write_text("def run():\n    return 1\n")
    link = tmp_path / "lab10_rank_branch.py"
    link.symlink_to(target)
    v = grade("lab10.rank_branch", link, lang="en")
    assert v.outcome == "error" and "symbolic link" in v.feedback
    env_ids = [e.id for e in registry.all_exercises() if e.static_check is not None]
    for ex_id in env_ids[:1]:
        env_target = tmp_path / "real.env"
        env_target.write_text("NCCL_DEBUG=WARN\n")
        env_link = tmp_path / registry.get(ex_id).filename
        env_link.symlink_to(env_target)
        v = grade(ex_id, env_link, lang="en")
        assert v.outcome == "error" and not v.passed, v.feedback
