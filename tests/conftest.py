"""Shared test helpers. Multi-process tests launch through dtrain_lab.launch (one launch, many
checks) and every one of them has a timeout (pytest-timeout; see pyproject.toml)."""
import json
import os
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

import dtrain_lab
from dtrain_lab.sandbox import contain

ROOT = Path(__file__).resolve().parent.parent
WORKERS = Path(__file__).resolve().parent / "workers"


# The planner's dry runs are kept on disk between processes (dtrain_lab.planner.dryrun): one folder per test
# run, made by the first process (the xdist controller; its workers and notebook kernels inherit it), so a
# run neither reads what an earlier one measured nor leaves anything in the home folder.
if "DTRAIN_CACHE_DIR" not in os.environ:
    import atexit
    import shutil
    import tempfile

    os.environ["DTRAIN_CACHE_DIR"] = _CACHE = tempfile.mkdtemp(prefix="dtrain-test-cache-")
    atexit.register(shutil.rmtree, _CACHE, True)


DURATIONS = Path(__file__).resolve().parent / "durations.json"
UNKNOWN_FILE_SECONDS = 30.0   # a file not measured yet (new): early rather than last


def pytest_collection_modifyitems(config, items):
    """Longest files first, by their seconds in the last measured run (tests/durations.json, written by
    ``make durations``). ``make test`` runs with ``--dist loadfile --no-loadscope-reorder``: each file
    goes whole to one worker in this order, so the workers finish together (longest processing time
    first) instead of one running a long notebook alone at the end. Order only: nothing reads these
    figures as a limit, and a stale file only makes the schedule worse."""
    try:
        seconds = json.loads(DURATIONS.read_text())
    except (OSError, ValueError):
        return
    first: dict[str, int] = {}
    for i, item in enumerate(items):
        first.setdefault(item.nodeid.split("::")[0], i)

    def key(item):
        f = item.nodeid.split("::")[0]
        return -seconds.get(f, UNKNOWN_FILE_SECONDS), first[f]

    items.sort(key=key)   # stable: a file's tests keep their order


def _kernel_start_with_one_more_try() -> None:
    """nbval starts a notebook's kernel once and waits 60 s for it; when that fails, every cell of the
    notebook is an error. Under a full machine a kernel failed to come up once in CI's caps-flipped leg
    ("Kernel didn't respond in 60 seconds"; nbval sends the kernel's stderr to /dev/null, so why is not
    known; a ZMQ port taken between jupyter_client choosing it and the kernel binding it would do it).
    The start is tried once more, and the first failure is printed: the notebook is still run whole."""
    try:
        import nbval.kernel as nbk
    except ImportError:
        return
    first_try = nbk.start_new_kernel

    def start_new_kernel(*args, **kwargs):
        try:
            return first_try(*args, **kwargs)
        except RuntimeError as exc:
            print(f"\nnbval: a kernel did not start ({exc}); starting it once more", flush=True)
            return first_try(*args, **kwargs)

    nbk.start_new_kernel = start_new_kernel


_kernel_start_with_one_more_try()


ZYGOTE = Path(__file__).resolve().parent / "kernel_zygote.py"
_zygote: dict = {}


def _zygote_socket() -> str | None:
    """This test process's kernel zygote (tests/kernel_zygote.py), started at its first notebook: the
    path of its socket, or None where there is none (off, or it did not start)."""
    import kernel_zygote

    if "socket" in _zygote:
        if _zygote["socket"] is None or kernel_zygote._own(os.environ) == _zygote["env"]:
            return _zygote["socket"]
        # this process's environment changed since its zygote started (a test set a variable, as
        # dtrain_lab.parallel.deepspeed_lab does): kernels would start afresh, so a zygote for it
        _zygote.pop("stop")()
        _zygote.clear()
    _zygote["socket"] = None
    if os.environ.get("DTRAIN_TEST_KERNEL_ZYGOTE", "1").strip() == "0" or not sys.platform.startswith("linux"):
        return None
    import select
    import subprocess
    import tempfile

    path = os.path.join(tempfile.mkdtemp(prefix="dtrain-kz-"), "s")
    os.environ[kernel_zygote.ENV_SOCKET] = path   # before it starts: its environment is the kernels' own
    proc = subprocess.Popen([sys.executable, str(ZYGOTE), "serve", path], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, cwd=str(ROOT))
    ready, _, _ = select.select([proc.stdout], [], [], 120.0)
    if not ready or proc.stdout.readline() != b"ready\n":
        print("\nkernel zygote: did not start; notebook kernels start as fresh processes", flush=True)
        proc.kill()
        proc.wait()
        del os.environ[kernel_zygote.ENV_SOCKET]
        return None
    _zygote["proc"] = proc   # it ends when its stdin closes: when this process ends, or here
    _zygote["socket"] = path
    _zygote["env"] = kernel_zygote._own(os.environ)

    def stop():
        proc.stdin.close()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        proc.stdout.close()

    import atexit

    atexit.register(stop)
    _zygote["stop"] = stop
    return path


def _kernels_from_a_zygote() -> None:
    """nbval's kernels (``--nbval-current-env``) start through tests/kernel_zygote.py's client."""
    try:
        import nbval.kernel as nbk
    except ImportError:
        return
    plain = nbk.NbvalKernelspecManager.get_kernel_spec

    def get_kernel_spec(self, kernel_name):
        spec = plain(self, kernel_name)
        if (kernel_name == nbk.CURRENT_ENV_KERNEL_NAME and spec.argv[1:3] == ["-m", "ipykernel_launcher"]
                and _zygote_socket()):
            spec.argv = [sys.executable, "-I", "-S", str(ZYGOTE), *spec.argv[3:]]
        return spec

    nbk.NbvalKernelspecManager.get_kernel_spec = get_kernel_spec


_kernels_from_a_zygote()


# Every test process is a child subreaper (dtrain_lab.sandbox.contain): a process that escapes its job's
# tree (its init died before it) is re-parented here instead of to init, so the survivor checks below see
# it, whatever its environment, process group or session says.
contain.subreaper(True)
_TAGS: dict[str, set] = {}


def _tree() -> list[psutil.Process]:
    try:
        return psutil.Process().children(recursive=True)
    except psutil.Error:
        return []


def new_tag() -> str:
    """A tag for a job of this test: the processes of this test process's tree from then on are its
    (those already there are not; no clock is compared, /proc's start times are whole seconds apart)."""
    t = uuid.uuid4().hex
    _TAGS[t] = {p.pid for p in _tree()}
    return t


def _servers() -> set[int]:
    """This process's own fork servers, which outlive jobs by design (their jobs' processes do not)."""
    from dtrain_lab.jobs import agents
    from dtrain_lab.sandbox import supervisors

    zygote = _zygote.get("proc")
    return (set(agents.server_pids()) | ({supervisors.server_pid()} - {None})
            | ({zygote.pid} if zygote is not None and zygote.poll() is None else set()))


def processes_with_tag(tag: str) -> list[psutil.Process]:
    """Live processes of this test process's tree (where every process a job lets escape lands)
    started since ``tag`` was made, other than this process's fork servers."""
    if tag not in _TAGS:   # a tag of its own making would count every earlier test's leftovers as this job's
        raise KeyError(f"{tag!r} was not made by new_tag()")
    before = _TAGS[tag]
    servers = _servers()
    found = []
    for p in _tree():
        try:
            if p.pid not in servers and p.pid not in before and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p)
        except psutil.Error:
            continue
    return found


def ended(process: psutil.Process, within: float) -> bool:
    """Whether ``process`` is gone (or a zombie: its parent died, and it waits to be reaped) within
    ``within`` seconds."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            if process.status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.2)
    return False


def assert_no_survivors(tag: str, grace: float = 3.0) -> None:
    deadline = time.monotonic() + grace
    while True:
        left = processes_with_tag(tag)
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert not left, f"processes survived the job: {[(p.pid, p.cmdline()[:4]) for p in left]}"


@pytest.fixture
def tag() -> str:
    return new_tag()


@pytest.fixture
def run():
    """launch() with a unique tag in the ranks' environment; checks no process survives."""
    tags = []

    def _run(target, *a, env=None, **kw):
        t = new_tag()
        tags.append(t)
        env = dict(env or {}, DTRAIN_TEST_TAG=t)
        kw.setdefault("quiet", True)
        result = dtrain_lab.launch(str(target), *a, env=env, **kw)
        result.tag = t
        return result

    yield _run
    for t in tags:
        assert_no_survivors(t)


def _box():
    from dtrain_lab import caps

    return None if caps.sandbox_probe().ok else False


def grade(*args, **kw):
    """``dtrain_lab.grading.grade`` as the product runs it on this machine: in the sandbox where it can
    run, else without it (a learner's self-check; a CI leg forces that with DTRAIN_CAPS=sandbox=0)."""
    from dtrain_lab.grading import grade as _grade

    kw.setdefault("sandbox", _box())
    return _grade(*args, **kw)


def grade_notebook(*args, **kw):
    """``dtrain_lab.grading.grade_notebook`` as :func:`grade` runs it here."""
    from dtrain_lab.grading import grade_notebook as _grade_notebook

    kw.setdefault("sandbox", _box())
    return _grade_notebook(*args, **kw)


def lab_programs(lab: str, source_name: str) -> dict:
    """``{exercise id: {"solution": code, "learner": code}}`` from the ``%%writefile <lab>_*.py`` cells of
    ``solutions/_source/<source_name>`` (``lab`` is the exercise prefix, e.g. ``"lab09"``)."""
    from dtrain_lab import authoring

    return authoring.lab_programs(lab, ROOT / "solutions" / "_source" / source_name)


def submit(folder, ex_id: str, code: str, tag: str):
    """Write ``code`` as exercise ``ex_id``'s file in a fresh subfolder ``tag`` of ``folder``."""
    from dtrain_lab.grading import registry

    path = folder / tag / registry.get(ex_id).filename
    path.parent.mkdir()
    path.write_text(code)
    return path


def job_metrics(result, n: int, *, last: bool = True) -> dict:
    """``{rank: metrics}`` of a finished ``n``-rank launch, after asserting it ran to the end: the job
    succeeded, every rank reported, and (``last``) every rank reached its final report."""
    assert result.ok, result.summary() + "\n" + "\n".join(x.output[-3000:] for x in result.ranks)
    assert sorted(result.metrics) == list(range(n))
    if last:
        assert all(m.get("last") is True for m in result.metrics.values())
    return result.metrics


# ``make test-fast`` (DTRAIN_TEST_FAST=1): the in-process tier, the files the Makefile lists. They launch
# no job (no torchrun, no forked ranks, no graded run): a call that would start one fails the test, so
# the list cannot drift into slow tests.


def _no_launch(*_a, **_k):
    raise AssertionError("make test-fast runs only in-process tests: this test launches a job (add it to make test)")


if os.environ.get("DTRAIN_TEST_FAST") == "1":
    import dtrain_lab.jobs.launch as _launch_module
    from dtrain_lab.grading import runner as _runner

    _launch_module.launch = _no_launch
    dtrain_lab.launch = _no_launch
    _runner.run = _no_launch
    os.fork = _no_launch   # tests/forkjob.py's ranks, and any other forked job
