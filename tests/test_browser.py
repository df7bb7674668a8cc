"""The course in a real browser: headless Chromium (Debian's chromium + chromium-driver, which .ci/run
installs) on JupyterLab started by `make lab`, driven through Selenium.

What a learner meets: the landing page is the course's start page; lesson 00 runs to the end with no
error; a widget renders once and answers a change; a zh plot draws Chinese with the course's font; a
lesson not yet run shows its stored figure (tools/browser_pass.py screenshots every figure for a person
to look at).
The notebook is run in the browser and never saved (autosave off in a throw-away settings folder),
so the stored reference outputs are left alone.
"""
from __future__ import annotations

import json
import shutil
import time

import pytest

from lab_server import JS_OPEN, JS_STATE, TOKEN, chrome_options, lab_env, make_lab

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
DRIVER = shutil.which("chromedriver")

pytestmark = [
    pytest.mark.skipif(not (CHROMIUM and DRIVER),
                       reason="no Chromium here: the browser test needs chromium and chromium-driver "
                              "(Debian/Ubuntu: apt-get install chromium chromium-driver; .ci/run installs them)"),
]

LESSON = "lessons/en/00_torchrun_process_group.ipynb"
# appended to the open lesson (never saved): a widget and a plot, in Chinese
PROBE = """\
import warnings
import matplotlib.pyplot as plt
from matplotlib import font_manager
from dtrain_lab import set_lang, viz
set_lang("zh")
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    ax = viz.plot_alpha_beta(5e-6, 1e-9)
    ax.figure.canvas.draw()
    plt.show()
print("title:", ax.get_title())
print("font:", font_manager.findfont(ax.title.get_fontproperties()).rsplit("/", 1)[-1])
print("glyph warnings:", sum("Glyph" in str(w.message) for w in caught))
viz.zero_memory_widget()"""

FIGURE_LESSON = "lessons/zh/01_collective_communication.ipynb"   # stores the ring all-reduce figure

# JavaScript run in the page: JS_OPEN, JS_STATE (lab_server) and these
JS_FIGURES = """
const panel = window.jupyterapp.shell.currentWidget;
if (!panel || !panel.context || panel.context.path !== arguments[0]) return null;
const imgs = Array.from(panel.node.querySelectorAll('.jp-OutputArea-output.jp-RenderedImage img'));
const sizes = imgs.filter(i => i.complete && i.naturalWidth > 0).map(i => [i.naturalWidth, i.naturalHeight]);
return sizes.length ? sizes : null;
"""
JS_APPEND_AND_RUN = """
const panel = window.jupyterapp.shell.currentWidget;
const nb = panel.content;
nb.activeCellIndex = nb.widgets.length - 1;
window.jupyterapp.commands.execute('notebook:insert-cell-below').then(() => {
  nb.activeCell.model.sharedModel.setSource(arguments[0]);
  return window.jupyterapp.commands.execute('notebook:run-cell');
});
"""


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (pip install -e '.[dev]')")
    from selenium.webdriver.chrome.service import Service

    env = lab_env(tmp_path_factory.mktemp("lab-settings"), tmp_path_factory.mktemp("ws"))
    opts = chrome_options(CHROMIUM)
    with make_lab("--LabApp.expose_app_in_browser=True", env=env) as url:
        driver = webdriver.Chrome(service=Service(DRIVER), options=opts)
        try:
            yield driver, url
        finally:
            driver.quit()


def wait_for(predicate, seconds: float, what: str):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.25)
    raise AssertionError(f"timed out after {seconds:g} s waiting for {what}")


def state(driver) -> dict | None:
    raw = driver.execute_script(JS_STATE)
    return json.loads(raw) if raw else None


@pytest.mark.timeout(300)
def test_a_learner_in_the_browser(browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    driver, url = browser
    started = time.monotonic()
    # 1. the landing page is the course: the start page, rendered, in both languages
    driver.get(f"{url}/?token={TOKEN}")
    assert "/lab/tree/lessons/START_HERE.ipynb" in driver.current_url
    page = wait_for(lambda: "从这里开始" in driver.find_element(By.TAG_NAME, "body").text and
                    driver.find_element(By.TAG_NAME, "body").text, 60, "the start page")
    assert "start here" in page and "00 · torchrun" in page
    wait_for(lambda: driver.execute_script("return !!(window.jupyterapp && window.jupyterapp.shell)"), 30, "the app")

    # 2. lesson 00 runs to the end: every code cell executed, no error output
    driver.execute_script(JS_OPEN, LESSON)
    wait_for(lambda: (s := state(driver)) and s["path"] == LESSON and s["status"] == "idle", 60, "lesson 00's kernel")
    driver.execute_script("window.jupyterapp.commands.execute('notebook:run-all-cells');")

    def finished():
        s = state(driver)
        if s and any(o["output_type"] == "error" for c in s["cells"] for o in c["outputs"]):
            return s   # Run All stops at an error: report it now
        return s if s and s["status"] == "idle" and all(c["count"] is not None for c in s["cells"]) else None
    try:
        done = wait_for(finished, 180, "lesson 00 to run to the end")
    except AssertionError as e:
        s = state(driver)
        raise AssertionError(f"{e}; kernel {s and s['status']}, execution counts "
                             f"{s and [c['count'] for c in s['cells']]}") from None
    errors = [o for c in done["cells"] for o in c["outputs"] if o["output_type"] == "error"]
    assert not errors, errors[0]
    ran = time.monotonic() - started

    # 3. a widget renders once and answers a change; 4. a zh plot draws Chinese with the course's font
    driver.execute_script(JS_APPEND_AND_RUN, PROBE)
    last = wait_for(lambda: (s := finished()) and len(s["cells"]) == len(done["cells"]) + 1 and
                    s["cells"][-1]["count"] is not None and s["cells"][-1], 60, "the probe cell")
    text = "".join(o.get("text", "") for o in last["outputs"] if o["output_type"] == "stream")
    assert "title: 环形 All-Reduce 的 α-β 模型" in text and "font: NotoSansCJK-Regular.ttc" in text, text
    assert "glyph warnings: 0" in text, text
    assert any("image/png" in o.get("data", {}) for o in last["outputs"]), "the plot did not render"
    cell = driver.find_elements(By.CSS_SELECTOR, ".jp-Notebook .jp-CodeCell")[-1]
    boxes = wait_for(lambda: cell.find_elements(By.CSS_SELECTOR, ".jp-OutputArea-output .widget-vbox"), 30,
                     "the widget")
    assert len([b for b in boxes if b.find_elements(By.TAG_NAME, "select")]) == 1, "the widget appears more than once"
    assert cell.find_elements(By.CSS_SELECTOR, "img"), "no image in the plot's output"
    widget_text = boxes[0].text
    assert "参数量" in widget_text and "7B" in widget_text and "1.750 GB" in widget_text, widget_text
    Select(boxes[0].find_element(By.TAG_NAME, "select")).select_by_visible_text("fp32")
    wait_for(lambda: "3.500 GB" in boxes[0].text, 20, "the widget to follow the change to fp32")

    # 5. a stored figure shows as it is in a lesson the learner has not run (untrusted outputs: the PNG
    #    copy; JupyterLab renders SVG only in trusted outputs), with its real size
    driver.execute_script(JS_OPEN, FIGURE_LESSON)

    def figure_shown():
        driver.execute_script(JS_OPEN, FIGURE_LESSON)    # brings it forward again if another tab took focus
        return driver.execute_script(JS_FIGURES, FIGURE_LESSON)
    sizes = wait_for(figure_shown, 60, "the stored figure of " + FIGURE_LESSON)
    assert all(w >= 600 and h >= 200 for w, h in sizes), sizes
    print(f"lesson 00 ran to the end {ran:.1f} s after the landing page; whole test {time.monotonic() - started:.1f} s")
