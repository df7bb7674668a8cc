"""The grader's OS sandbox, proven from inside: a probe program runs as a submission on 2 ranks and
reports what it can see and do; the test compares with what the sandbox promises
(dtrain_lab/grading/sandbox.py). One launch answers most questions. Skipped, with the reason,
where this machine cannot build the sandbox (no bubblewrap, or user namespaces not allowed)."""
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
from dtrain_lab.grading import channel, runner, sandbox

PROBE = sandbox.probe()
pytestmark = pytest.mark.skipif(not PROBE.ok, reason=f"no sandbox on this machine: {PROBE.reason}")
# bubblewrap, and the fallback where it is missing (util-linux unshare + nsbox.py): each where it works here
MODES = [pytest.param(m, marks=pytest.mark.skipif(not sandbox.probe(m).ok, reason=f"{m}: {sandbox.probe(m).reason}"))
         for m in ("bwrap", "unshare")]

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
@pytest.mark.parametrize("mode", MODES)
def test_inside_the_sandbox(mode, tmp_path, monkeypatch):
    import json

    monkeypatch.setenv("C1_GRADER_SECRET", "must-not-leak")
    seen = {}

    def watch():   # the rank processes, seen from the host while they run
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not seen.get("done"):
            for p in psutil.process_iter(["cmdline", "uids"]):
                try:
                    cmd = p.info["cmdline"] or []
                    harness = cmd[1:3] == ["-m", "dtrain_lab.grading.harness"] or \
                        p.name().startswith(runner.ZYGOTE_RANK_PREFIX)   # a rank the zygote started
                    if harness:   # this job's, by its id (other tests' graders may run at the same time)
                        seen.setdefault("uids", set()).add((p.environ().get("DTRAIN_JOB_ID"), p.info["uids"].real))
                except (psutil.Error, TypeError):
                    pass
            time.sleep(0.2)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    res, inputs = run_probe(tmp_path, mode=mode, shared=True)
    seen["done"] = True
    watcher.join()
    assert res.ok, [(r.code, r.stderr[-2000:]) for r in res.ranks]
    for r, ro in enumerate(res.ranks):
        out = json.loads(ro.result)
        # no root, no capabilities, no way back to privileges
        assert out["uid"] == out["euid"] == sandbox.SANDBOX_UID and int(out["cap_eff"], 16) == 0, out
        assert out["userns"][0] != "ok", out["userns"]        # no nested user namespace for the submission
        assert out["no_new_privs"] == "1" and int(out["cap_prm"], 16) == 0, out
        # what the kernel shows of its environment (the job sweep reads it) is its own, nothing of the
        # grader's: also for a rank forked from the zygote, which rewrites the block it inherited
        # (Python itself adds LC_CTYPE to its copy when it coerces the C locale at start-up)
        shown = set(out["shown_env"]) - {"DTRAIN_PAD"}
        assert shown <= set(out["env"]) and set(out["env"]) - shown <= {"LC_CTYPE"}, set(out["shown_env"]) ^ set(out["env"])
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
        job = Path(res.job_dir).name
        assert {uid for j, uid in seen.get("uids", ()) if j == job} == {sandbox.SANDBOX_UID}, seen
    # with bubblewrap every rank entered its sandbox from the zygote (grading/zygote.py): no fallback here
    assert res.zygote == (mode == "bwrap"), res.zygote_error
    # ... and its supervisor was forked into the job's outer sandbox by the supervisor server
    assert res.served == (mode == "bwrap")


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
    sandbox.probe.cache_clear()
    try:
        with monkeypatch.context() as m:
            m.setattr(sandbox.shutil, "which", lambda name: None)
            p = sandbox.probe()
            assert not p.ok and "bubblewrap" in p.reason
    finally:
        sandbox.probe.cache_clear()
    assert sandbox.probe().ok


def test_job_folder_is_gone_after_the_run(tmp_path):
    res, _ = run_probe(tmp_path, world=1)
    assert res.ok and not Path(res.job_dir).exists()
    # an exercise that does not ask for /shared gets no folder the ranks could pass data through
    out = json.loads(res.ranks[0].result)
    assert out["shared_fill"][0] == "FileNotFoundError", out["shared_fill"]


@pytest.mark.timeout(300)
@pytest.mark.skipif(not sandbox.probe("bwrap").ok, reason="the zygote enters bubblewrap sandboxes only")
def test_where_entering_fails_the_ranks_start_as_fresh_processes(tmp_path, monkeypatch):
    """The zygote is a saving, never a condition: a placeholder sandbox that cannot start makes the
    supervisor fall back to a fresh python per rank (as before the zygote), and say why."""
    monkeypatch.setattr(runner, "_PLACEHOLDER", ["/nonexistent/placeholder"])
    res, _ = run_probe(tmp_path, mode="bwrap", shared=True)
    assert res.ok and not res.zygote and not res.served, [(r.code, r.stderr[-2000:]) for r in res.ranks]
    assert "placeholder sandbox did not start" in res.zygote_error, res.zygote_error
    monkeypatch.undo()
    monkeypatch.setenv("DTRAIN_GRADE_ZYGOTE", "0")   # and the switch turns it off
    (tmp_path / "off").mkdir()
    res, _ = run_probe(tmp_path / "off", mode="bwrap", shared=True)
    assert res.ok and not res.zygote and not res.zygote_error


@pytest.mark.timeout(120)
@pytest.mark.skipif(not sandbox.probe("bwrap").ok, reason="the supervisor server serves bubblewrap jobs only")
def test_the_supervisor_server_ends_with_the_grader(tmp_path):
    """A grader that dies without any cleanup leaves no supervisor server (dtrain_lab.grading.supervisors)."""
    probe = tmp_path / "probe.py"
    probe.write_text("def run():\n    return 1\n")
    code = (f"import time\nfrom pathlib import Path\nfrom dtrain_lab.grading import runner, channel, supervisors\n"
            f"spec = runner.JobSpec(exercise='test.probe', entry='run', submission=Path({str(probe)!r}), world_size=2, "
            f"inputs=[channel.encode(0)] * 2, timeout=60)\nres = runner.run(spec)\n"
            f"print(res.ok, res.served, supervisors.server_pid(), flush=True)\ntime.sleep(120)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=str(ROOT))
    ok, served, pid = proc.stdout.readline().split()
    assert ok == "True" and served == "True", (ok, served)
    server = psutil.Process(int(pid))
    assert server.ppid() == proc.pid
    proc.kill()
    proc.wait()
    assert ended(server, 20), "the supervisor server outlived the grader"
