"""JupyterLab started the way a learner starts it, `make lab` (for test_make_lab and test_browser)."""
from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request

from conftest import ROOT

TOKEN = "dtrain-test"


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


@contextlib.contextmanager
def make_lab(*extra: str, env: dict | None = None):
    """Run `make lab` on a free loopback port; yields the server's base URL (token: TOKEN)."""
    with socket.socket() as s:  # a free port (with port 0 each address family gets its own port)
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    args = ["--no-browser", "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}", "--ServerApp.port_retries=0",
            f"--IdentityProvider.token={TOKEN}", *extra]
    proc = subprocess.Popen(["make", "-s", "lab", "LAB_ARGS=" + " ".join(args)], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            env={**os.environ, **(env or {})})
    url, lines = None, []
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
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


# ------------------------------------------------------------------ JupyterLab in headless Chromium
# (tests/test_browser.py and tools/browser_pass.py; window.jupyterapp: LabApp.expose_app_in_browser)
JS_OPEN = "window.jupyterapp.commands.execute('docmanager:open', {path: arguments[0]});"
JS_STATE = """
const panel = window.jupyterapp.shell.currentWidget;
if (!panel || !panel.content || !panel.content.model || !panel.sessionContext.session) return null;
const kernel = panel.sessionContext.session.kernel;
const cells = [];
const model = panel.content.model;
for (let i = 0; i < model.cells.length; i++) {
  const c = model.cells.get(i);
  if (c.type !== 'code') continue;
  const outs = [];
  for (let j = 0; j < c.outputs.length; j++) outs.push(c.outputs.get(j).toJSON());
  cells.push({count: c.executionCount, outputs: outs});
}
return JSON.stringify({path: panel.context.path, status: kernel ? kernel.status : null, cells: cells});
"""


def lab_env(settings, workspaces) -> dict:
    """JupyterLab's settings for a browser run: notebooks never saved (autosave off: the stored outputs
    stay as they are) and every cell rendered, not only those in view (no windowing)."""
    import json
    from pathlib import Path

    for plugin, name, value in (("docmanager-extension", "plugin", {"autosave": False}),
                                ("notebook-extension", "tracker", {"windowingMode": "none"})):
        folder = Path(settings) / "@jupyterlab" / plugin
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{name}.jupyterlab-settings").write_text(json.dumps(value))
    return {"JUPYTERLAB_SETTINGS_DIR": str(settings), "JUPYTERLAB_WORKSPACES_DIR": str(workspaces)}


def chrome_options(binary: str, width: int = 1400):
    """Headless Chromium, as root in a container too."""
    from selenium.webdriver.chrome.options import Options

    opts = Options()
    opts.binary_location = binary
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", f"--window-size={width},1000"):
        opts.add_argument(arg)
    return opts

