"""The figures drawn from recorded runs (dtrain_lab.figures) are stored in the lessons as SVG, and a
stored figure is a pure function of the data the run recorded and of the language:

* every stored figure, redrawn from the inputs stored beside it (the output's metadata), gives the
  same SVG text in its language; the zh and en notebooks hold the same inputs;
* with every capability probe flipped (the caps-flipped CI leg: no CJK font, other core counts, ...)
  the SVG is the same: a figure never asks the probes, it uses the course's own font;
* every glyph is a path of the packaged Noto Sans CJK SC, whatever font the session configured;
* the figures module stays in the course layer (never the launcher or the grader), and no technique
  code imports it.

nbval compares the SVG of a fresh run with the stored one too (image/svg+xml is not in its skip
list): that checks the run recorded the same data; this file checks the drawing."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import warnings

import pytest

from conftest import ROOT
from dtrain_lab import caps, figures
from dtrain_lab.figures import METADATA_KEY

# lesson stem -> the figures it stores (in both languages)
EXPECTED = {
    "01_collective_communication": ["ring_all_reduce"],
    "02_data_parallel": ["ddp_buckets"],
    "05_zero_fsdp": ["zero_shards"],
    "07_model_tensor_parallel": ["megatron_mlp"],
    "09_checkpoint_recovery": ["restarts"],
    "10_hangs_and_deadlocks": ["hang_waits", "hang_waits"],
    "11_nccl_networking": ["nccl_paths"],
    "12_multinode_clusters": ["rendezvous"],
    "13_context_expert_parallel": ["ring_attention", "moe_dispatch"],
}


def stored(lang: str) -> list[tuple[str, str, dict, str]]:
    """(lesson stem, figure name, inputs, SVG) of every figure stored in lessons/<lang>/."""
    out = []
    for path in sorted((ROOT / "lessons" / lang).glob("*.ipynb")):
        for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
            for o in cell.get("outputs", []):
                meta = o.get("metadata", {}).get(METADATA_KEY)
                if meta is not None:
                    svg = o["data"]["image/svg+xml"]
                    out.append((path.stem, meta["name"], meta["inputs"], "".join(svg) if isinstance(svg, list) else svg))
    return out


ALL = {lang: stored(lang) for lang in ("en", "zh")}


def test_every_lesson_stores_its_figures_in_both_languages():
    for lang, figs in ALL.items():
        have: dict[str, list[str]] = {}
        for stem, name, _, _ in figs:
            have.setdefault(stem, []).append(name)
        for stem, names in EXPECTED.items():
            assert have.get(stem) == names, f"lessons/{lang}/{stem}: figures {have.get(stem)}, expected {names}"
    # the same recorded data in both languages: one run's records, two sets of labels
    assert [(s, n, i) for s, n, i, _ in ALL["en"]] == [(s, n, i) for s, n, i, _ in ALL["zh"]]


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_stored_figures_redraw_exactly_from_their_inputs(lang):
    assert ALL[lang], "no stored figure found"
    for stem, name, inputs, svg in ALL[lang]:
        with warnings.catch_warnings():
            warnings.simplefilter("error")        # a missing glyph warns: it must not happen
            fresh = figures.svg(name, inputs, lang)
        assert fresh == svg, f"lessons/{lang}/{stem}: figure {name} differs from a redraw of its inputs"


def test_every_stored_figure_has_a_png_copy_for_an_untrusted_notebook():
    """JupyterLab shows SVG only in trusted outputs; a cloned lesson's outputs are not, so each stored
    figure also carries a PNG (its size is the SVG's, drawn from the same inputs; the bytes may differ
    across machines, so only the SVG is compared exactly)."""
    import base64
    import struct

    for lang in ("en", "zh"):
        for path in sorted((ROOT / "lessons" / lang).glob("*.ipynb")):
            for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
                for o in cell.get("outputs", []):
                    meta = o.get("metadata", {}).get(METADATA_KEY)
                    if meta is None:
                        continue
                    assert "image/png" in o["data"], f"{path.relative_to(ROOT)}: {meta['name']} has no PNG copy"
                    stored_png = base64.b64decode(o["data"]["image/png"])
                    fresh = base64.b64decode(figures.png(meta["name"], meta["inputs"], lang))
                    assert stored_png[:8] == b"\x89PNG\r\n\x1a\n"
                    assert struct.unpack(">II", stored_png[16:24]) == struct.unpack(">II", fresh[16:24])
                    assert b"Software" not in stored_png[:200]


_REDRAW = """
import json, sys
from dtrain_lab import figures
for lang, name, inputs in json.load(sys.stdin):
    sys.stdout.write(json.dumps(figures.svg(name, inputs, lang)) + "\\n")
"""


def test_figures_are_the_same_with_every_capability_flipped():
    """In a fresh process with DTRAIN_CAPS as the caps-flipped CI leg sets it (cjk_font=0 among them)."""
    flip = ",".join(f"{k}={int(v)}" for k, v in sorted(caps.flipped().items()))
    jobs = [(lang, name, inputs) for lang in ALL for _, name, inputs, _ in ALL[lang]]
    env = {**os.environ, caps.ENV: flip}
    done = subprocess.run([sys.executable, "-c", _REDRAW], input=json.dumps(jobs), env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    fresh = [json.loads(line) for line in done.stdout.splitlines()]
    want = [svg for lang in ALL for *_, svg in ALL[lang]]
    assert len(fresh) == len(want)
    for (lang, name, _), a, b in zip(jobs, fresh, want):
        assert a == b, f"{name} ({lang}) changes with DTRAIN_CAPS={flip}"


def _packaged_postscript_name() -> str:
    from matplotlib import font_manager

    return font_manager.get_font(font_manager.findfont(
        font_manager.FontProperties(family=[figures.font()]), fallback_to_default=False)).postscript_name


def test_figures_use_only_the_packaged_font():
    import noto_cjk_sans_otc
    from matplotlib import font_manager

    found = font_manager.findfont(font_manager.FontProperties(family=[figures.font()]), fallback_to_default=False)
    assert os.path.samefile(found, noto_cjk_sans_otc.FONT_PATH)
    ps = _packaged_postscript_name()
    assert ps.startswith("NotoSansCJK")
    for lang, figs in ALL.items():
        for stem, name, _, svg in figs:
            glyphs = set(re.findall(r'<path id="([^"]+)-[0-9a-f]+"', svg))
            assert glyphs == {ps}, f"lessons/{lang}/{stem}: {name} draws glyphs of {sorted(glyphs)}, not only {ps}"
            assert "<text" not in svg and "font-family" not in svg   # glyphs are paths: no font left to the reader


def test_a_session_font_or_style_does_not_reach_the_figures():
    """viz.setup_fonts, a learner's rcParams or a system CJK font configured for live plots change nothing."""
    import matplotlib

    _, name, inputs, svg = ALL["zh"][0]
    with matplotlib.rc_context({"font.family": ["DejaVu Sans"], "font.size": 15, "svg.fonttype": "none",
                                "svg.hashsalt": None, "axes.facecolor": "black"}):
        assert figures.svg(name, inputs, "zh") == svg


def test_the_figures_module_stays_in_the_course_layer():
    from test_architecture import PKG, _files, _imports, _module_name

    forbidden = ("dtrain_lab.jobs", "dtrain_lab.grading", "dtrain_lab.demos", "dtrain_lab.sandbox", "dtrain_lab.cli")
    bad = [f"{p.relative_to(ROOT)}:{line} imports {mod}" for p in sorted((PKG / "figures").glob("*.py"))
           for line, mod in _imports(p) if mod.startswith(forbidden) or mod == "dtrain_lab"]
    assert not bad, bad
    users = [f"{p.relative_to(ROOT)} imports {mod}" for p in _files()
             if _module_name(p).split(".")[1:2]
             and _module_name(p).split(".")[1] in ("comm", "parallel", "resilience", "nccl", "planner", "models", "data")
             for _, mod in _imports(p) if mod.startswith("dtrain_lab.figures")]
    assert not users, f"technique and base code must not draw: {users}"
