"""A learner's pass over the lessons in a real browser: JupyterLab (started by `make lab`) in headless
Chromium, each lesson opened, run to the end (``--run``) or shown as stored, and a screenshot taken of
every figure in its outputs (stored SVG and live plots alike).

    .venv/bin/python tools/browser_pass.py [--run] [--lang en,zh] [LESSON_STEM ...]

Screenshots go to ``build/screenshots/<lang>/<lesson>-<n>.png`` (``build/`` is not committed: they
hold this machine's measured plots), with ``index.txt`` listing each figure's size. They are for a
person to look at: readable labels, no tofu (□), nothing overlapping, a sensible size. A lesson that
stops with an error is reported and the pass goes on. Without the notebooks saved (autosave off), the
stored outputs are left alone. Needs chromium, chromedriver and selenium, like tests/test_browser.py.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from lab_server import JS_OPEN, JS_STATE, TOKEN, chrome_options, lab_env, make_lab  # noqa: E402

OUT = ROOT / "build" / "screenshots"
FIGURES = ".jp-OutputArea-output.jp-RenderedSVG, .jp-OutputArea-output.jp-RenderedImage"


def lessons_with_figures(lang: str) -> list[str]:
    """Lessons whose stored outputs hold an image (the figures a static reader sees)."""
    out = []
    for path in sorted((ROOT / "lessons" / lang).glob("*.ipynb")):
        nb = json.loads(path.read_text(encoding="utf-8"))
        if any(k.startswith("image/") for c in nb["cells"] for o in c.get("outputs", []) for k in o.get("data", {})):
            out.append(path.stem)
    return out


def wait_for(predicate, seconds: float):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.5)
    return None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("lessons", nargs="*", help="lesson stems (default: every lesson with a stored figure)")
    ap.add_argument("--lang", default="en,zh")
    ap.add_argument("--run", action="store_true", help="run each lesson to the end before the screenshots")
    ap.add_argument("--timeout", type=float, default=300, help="seconds for one lesson to run")
    args = ap.parse_args(argv)
    chromium = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    driver_bin = shutil.which("chromedriver")
    if not (chromium and driver_bin):
        print("no chromium/chromedriver on PATH: nothing to do")
        return 2
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    env = lab_env(tempfile.mkdtemp(prefix="lab-settings-"), tempfile.mkdtemp(prefix="ws-"))
    opts = chrome_options(chromium, width=1280)
    index, problems = [], []
    with make_lab("--LabApp.expose_app_in_browser=True", env=env) as url:
        driver = webdriver.Chrome(service=Service(driver_bin), options=opts)
        try:
            driver.get(f"{url}/?token={TOKEN}")
            wait_for(lambda: driver.execute_script("return !!(window.jupyterapp && window.jupyterapp.shell)"), 60)
            for lang in args.lang.split(","):
                folder = OUT / lang
                folder.mkdir(parents=True, exist_ok=True)
                for stem in args.lessons or lessons_with_figures(lang):
                    path = f"lessons/{lang}/{stem}.ipynb"
                    driver.execute_script(JS_OPEN, path)
                    def opened(path=path):
                        driver.execute_script(JS_OPEN, path)   # again: brings it forward if the start page took focus
                        s = json.loads(driver.execute_script(JS_STATE) or "null")
                        return s if s and s["path"] == path and s["status"] == "idle" else None
                    st = wait_for(opened, 90)
                    if not st:
                        problems.append(f"{path}: did not open ({driver.execute_script(JS_STATE)})")
                        continue
                    if args.run:
                        driver.execute_script("window.jupyterapp.commands.execute('notebook:run-all-cells');")

                        def done():
                            s = json.loads(driver.execute_script(JS_STATE) or "null")
                            for c in (s or {}).get("cells", []):
                                c["error"] = next((f"{o['ename']}: {o['evalue']}" for o in c["outputs"]
                                                   if o["output_type"] == "error"), None)
                            if s and any(c["error"] for c in s["cells"]):
                                return s
                            return s if s and s["status"] == "idle" and all(c["count"] is not None for c in s["cells"]) else None
                        s = wait_for(done, args.timeout)
                        if not s:
                            problems.append(f"{path}: did not finish in {args.timeout:g} s")
                        elif any(c["error"] for c in s["cells"]):
                            problems.append(f"{path}: {next(c['error'] for c in s['cells'] if c['error'])}")
                    time.sleep(2)          # let the last outputs render
                    shown = driver.execute_script(
                        "return Array.from(window.jupyterapp.shell.currentWidget.node.querySelectorAll(arguments[0]));",
                        FIGURES)
                    for n, el in enumerate([e for e in shown if e.size["width"] and e.size["height"]], 1):
                        driver.execute_script("arguments[0].scrollIntoView({block: 'center'});", el)
                        time.sleep(0.3)
                        shot = folder / f"{stem}-{n}.png"
                        el.screenshot(str(shot))
                        index.append(f"{lang}/{shot.name}\t{el.size['width']}x{el.size['height']}")
                    print(f"{path}: {sum(1 for i in index if i.startswith(f'{lang}/{stem}-'))} figures", flush=True)
        finally:
            driver.quit()
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "index.txt").write_text("\n".join(index) + "\n")
    for p in problems:
        print("problem:", p)
    print(f"{len(index)} screenshots in {OUT.relative_to(ROOT)}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
