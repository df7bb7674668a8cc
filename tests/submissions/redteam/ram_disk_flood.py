"""Red-team attack (issue 13, class 3 "flood"; the brief's (d)): fill what a rank can write.

Bounded on purpose (it runs on a shared machine): it shows the limits, it does not hit them.
1. RAM: inside the rank's sandbox, ``/dev`` (bwrap's ``--dev``) and the empty folder that hides
   ``dtrain_lab/grading/checks`` (``--tmpfs`` without ``--size``) are tmpfs mounts the sandbox
   user owns, each as large as half the host's RAM; the rank writes 3 x 100 MiB into each (more
   than its 128 MiB /tmp), and reports ``statvfs`` of every mount it can write.
2. Host disk: every file of ``/grade/out`` and stdout/stderr lie in the grader's job folder on
   the host disk; each may grow to RLIMIT_FSIZE (128 MiB): 7 x 128 MiB per rank.
The report is the first line of stdout (read it with DTRAIN_KEEP_GRADE_DIRS=1).
"""
import json
import os
import signal
import sys

import dtrain_lab

CHECKS = os.path.join(os.path.dirname(dtrain_lab.__file__), "grading", "checks")
MB = 1 << 20


def fill(folder, files, mb):
    done = 0
    for i in range(files):
        try:
            with open(os.path.join(folder, f"redteam_fill{i}"), "wb") as f:
                for _ in range(mb):
                    f.write(b"\0" * MB)
                    done += 1
        except OSError as exc:
            return [done, str(exc)[:80]]
    return [done, "ok"]


def run():
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)     # a write past FSIZE fails instead of killing
    report = {"mounts": {}, "fill": {}}
    for path in ("/", "/dev", CHECKS, "/tmp", os.environ.get("HOME", "/"), "/dev/shm", "/shared", "/grade/out"):
        st = os.statvfs(path)
        report["mounts"][path] = {"size_mb": st.f_blocks * st.f_frsize // MB,
                                  "writable": os.access(path, os.W_OK)}
    for folder in ("/dev", CHECKS):
        report["fill"][folder] = fill(folder, 3, 100)
    print("REDTEAM_REPORT " + json.dumps(report), flush=True)
    out = os.environ["DTRAIN_GRADE_IO"]
    for name in ("trace", "stack", "error"):
        report["fill"][name] = fill_one(os.path.join(out, name), 130)
    chunk = b"y" * MB
    for stream in (sys.stdout.buffer, sys.stderr.buffer):
        for _ in range(130):
            try:
                stream.write(chunk)
                stream.flush()
            except OSError:
                break
    return 0.0


def fill_one(path, mb):
    done = 0
    try:
        with open(path, "wb") as f:
            for _ in range(mb):
                f.write(b"z" * MB)
                done += 1
    except OSError as exc:
        return [done, str(exc)[:80]]
    return [done, "ok"]
