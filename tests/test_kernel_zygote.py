"""The tests' notebook kernels are forked from a zygote (tests/kernel_zygote.py). A forked kernel must
show a notebook what a fresh one shows, take an interrupt, die with its client, and start its agent
servers from the zygote, which end with it."""
import collections
import os
import signal
import sys
import time

import psutil
import pytest

import conftest

nbk = pytest.importorskip("nbval.kernel")

# what a notebook can see of the process it runs in
PROBE = r"""
import json, os, signal, sys
from ipykernel.kernelapp import IPKernelApp
print(json.dumps({
    "cwd": os.getcwd(), "path": sys.path, "argv0": os.path.basename(sys.argv[0]), "main": __name__,
    "env": sorted(k for k in os.environ if k not in ("JPY_SESSION_NAME", "DTRAIN_TEST_KERNEL_SOCKET")),
    "handlers": {s: str(signal.getsignal(getattr(signal, s))) for s in
                 ("SIGINT", "SIGTERM", "SIGCHLD", "SIGPIPE", "SIGHUP", "SIGUSR1", "SIGXFSZ")},
    "session_leader": os.getsid(0) == os.getpid(),
    "fds": sorted(os.readlink("/proc/self/fd/" + fd).split(":")[0] for fd in os.listdir("/proc/self/fd")
                  if os.path.lexists("/proc/self/fd/" + fd)),
    "pid": os.getpid(), "ppid": os.getppid(),
    "parent_handle": IPKernelApp.instance().parent_handle == int(os.environ.get("JPY_PARENT_PID") or -1),
    "poller": type(IPKernelApp.instance().poller).__name__,
}))
"""


def _kernel(cwd, env=None):
    kw = {"cwd": str(cwd), "stderr": open(os.devnull, "w")}
    if env is not None:
        kw["env"] = env
    return nbk.start_new_kernel(kernel_name=nbk.CURRENT_ENV_KERNEL_NAME, **kw)


def _run(kc, code: str, timeout: float = 60.0) -> tuple[str, dict]:
    """``code``'s stdout, and its execute reply's content."""
    out = []
    msg_id = kc.execute(code)
    reply = kc.get_shell_msg(timeout=timeout)
    while True:
        msg = kc.get_iopub_msg(timeout=timeout)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "stream" and msg["content"]["name"] == "stdout":
            out.append(msg["content"]["text"])
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            break
    return "".join(out), reply["content"]


def _probe(kc) -> dict:
    import json

    out, reply = _run(kc, PROBE)
    assert reply["status"] == "ok", reply
    return json.loads(out)


def _stop(km, kc):
    kc.stop_channels()
    km.shutdown_kernel(now=False)


def test_a_forked_kernel_shows_a_notebook_what_a_fresh_one_does(tmp_path):
    assert conftest._zygote_socket(), "no kernel zygote in this test process"
    zygote = conftest._zygote["proc"].pid
    km, kc = _kernel(tmp_path)
    try:
        forked = _probe(kc)
        # the same environment but one variable that torch reads when it is imported: a fresh kernel
        fresh_env = dict(os.environ, OMP_NUM_THREADS="1")
        km2, kc2 = _kernel(tmp_path, env=fresh_env)
        try:
            fresh = _probe(kc2)
        finally:
            _stop(km2, kc2)
    finally:
        _stop(km, kc)
    assert forked["ppid"] == zygote and fresh["ppid"] != zygote
    assert fresh["env"] == sorted(forked["env"] + ["OMP_NUM_THREADS"])
    for key in ("cwd", "path", "argv0", "main", "handlers", "session_leader", "parent_handle", "poller"):
        assert forked[key] == fresh[key], key
    assert forked["parent_handle"] and forked["poller"] == "ParentPollerUnix"

    def fds(probe):   # IPython's history database opens and closes a journal as it writes
        return collections.Counter(f for f in probe["fds"] if "history.sqlite" not in f)

    assert fds(forked) - fds(fresh) == collections.Counter({"socket": 1}) and not fds(fresh) - fds(forked)
    assert forked["cwd"] == str(tmp_path)


def test_a_forked_kernel_is_interrupted_and_dies_with_its_client(tmp_path):
    assert conftest._zygote_socket()
    km, kc = _kernel(tmp_path)
    try:
        pid = _probe(kc)["pid"]
        msg_id = kc.execute("import time; time.sleep(120)")
        time.sleep(1.0)
        km.interrupt_kernel()   # SIGINT to the client's process group: relayed to the kernel's
        reply = kc.get_shell_msg(timeout=30)
        assert reply["parent_header"]["msg_id"] == msg_id
        assert reply["content"]["status"] == "error" and reply["content"]["ename"] == "KeyboardInterrupt"
        kernel = psutil.Process(pid)
        km.provisioner.process.send_signal(signal.SIGKILL)   # jupyter_client's last resort: the client dies
        assert conftest.ended(kernel, 10.0), "the kernel outlived its client"
    finally:
        kc.stop_channels()
        km.cleanup_resources()


def test_a_forked_kernels_agent_server_comes_from_the_zygote_and_ends_with_it(tmp_path):
    assert conftest._zygote_socket()
    zygote = conftest._zygote["proc"].pid
    km, kc = _kernel(tmp_path)
    try:
        out, reply = _run(kc, "import os\n"
                              "from dtrain_lab.jobs import agents\n"
                              "s = agents._Server({k: v for k, v in os.environ.items() if not k.startswith('DTRAIN_')})\n"
                              "print(s.proc.pid, type(s.proc).__name__, s.alive())")
        assert reply["status"] == "ok", reply
        pid, kind, alive = out.split()
        assert kind == "_ForkedServer" and alive == "True"
        server = psutil.Process(int(pid))
        assert server.ppid() == zygote
        assert server.cmdline() == psutil.Process(zygote).cmdline()   # a fork, not a new Python
    finally:
        _stop(km, kc)
    assert conftest.ended(server, 15.0), "the agent server outlived its kernel"
    assert sys.platform.startswith("linux")
