"""`make lab` (the README's first command) really starts JupyterLab with the course's kernel."""
import json
import os
import re
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request

import pytest

from conftest import ROOT


def get(url: str) -> str:
    """GET with retries: the URL is printed a moment before the socket accepts connections."""
    deadline = time.monotonic() + 30
    while True:
        try:
            with urllib.request.urlopen(url, timeout=20) as resp:
                assert resp.status == 200
                return resp.read().decode()
        except urllib.error.URLError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


@pytest.mark.timeout(120)
def test_make_lab_serves_the_course():
    token = "dtrain-test"
    with socket.socket() as s:  # a free port (with port 0 each address family gets its own port)
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        ["make", "-s", "lab", f"LAB_ARGS=--no-browser --ServerApp.ip=127.0.0.1 --ServerApp.port={port} --ServerApp.port_retries=0 --IdentityProvider.token={token}"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    url = None
    lines = []
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and url is None:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            m = re.search(r"(http://127\.0\.0\.1:\d+)/lab", line)
            if m:
                url = m.group(1)
        assert url, "JupyterLab did not start:\n" + "".join(lines[-30:])
        specs = get(f"{url}/api/kernelspecs?token={token}")
        assert "python3" in specs
        listing = get(f"{url}/api/contents/lessons/en?token={token}")
        assert "00_torchrun_process_group.ipynb" in listing
        # the landing page is the course's start page, not the Launcher at the repo root
        with urllib.request.urlopen(f"{url}/?token={token}", timeout=20) as resp:
            assert resp.geturl().split("?")[0].endswith("/lab/tree/lessons/START_HERE.ipynb"), resp.geturl()
        lessons = json.loads(get(f"{url}/api/contents/lessons?token={token}"))
        names = {c["name"] for c in lessons["content"]}
        assert {"zh", "en", "START_HERE.ipynb"} <= names and "_source" not in names, names
        root = {c["name"] for c in json.loads(get(f"{url}/api/contents?token={token}"))["content"]}
        assert "lessons" in root and not any(n.endswith(".egg-info") for n in root), root
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
