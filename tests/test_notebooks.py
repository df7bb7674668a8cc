"""Notebook structure: zh/en parity, generated from their sources, labs in sync with solutions.

(Executing every notebook is nbval's job: `make test` passes lessons/zh and lessons/en to it.)"""
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT
from dtrain_lab import authoring

KINDS = ("lessons", "labs", "solutions")
HAN = re.compile(r"[\u4e00-\u9fff]")
LETTER = re.compile(r"[A-Za-z\u4e00-\u9fff]")
SETUP_LANG = re.compile(r"""set_lang\(\s*["'](zh|en)["']\s*\)""")


def notebooks(kind, lang):
    return sorted((ROOT / kind / lang).glob("*.ipynb"))


def load(path):
    return json.loads(path.read_text(encoding="utf-8"))


def prose(md: str) -> str:
    """Markdown without code, formulas, links and HTML: the words a reader reads."""
    md = re.sub(r"```.*?```", " ", md, flags=re.S)
    md = re.sub(r"`[^`]*`", " ", md)
    md = re.sub(r"\$\$.*?\$\$|\$[^$]*\$", " ", md, flags=re.S)
    md = re.sub(r"\]\([^)]*\)", "]", md)
    md = re.sub(r"<[^>]+>", " ", md)
    return md


def han_ratio(text: str) -> float:
    letters = LETTER.findall(text)
    return len(HAN.findall(text)) / max(1, len(letters))


def test_there_are_lessons():
    assert len(notebooks("lessons", "en")) >= 2


@pytest.mark.parametrize("kind", KINDS)
def test_same_notebooks_in_both_languages(kind):
    zh = [p.name for p in notebooks(kind, "zh")]
    en = [p.name for p in notebooks(kind, "en")]
    assert zh == en
    for name in zh:
        assert re.match(r"^\d\d[a-z]?_[a-z0-9_]+\.ipynb$", name) or re.match(r"^lab_\d\d_[a-z0-9_]+\.ipynb$", name), name


def pairs():
    for kind in KINDS:
        for zh in notebooks(kind, "zh"):
            yield pytest.param(zh, ROOT / kind / "en" / zh.name, id=f"{kind}/{zh.stem}")


@pytest.mark.parametrize("zh_path,en_path", list(pairs()))
def test_parity(zh_path, en_path):
    zh, en = load(zh_path), load(en_path)
    assert [c["cell_type"] for c in zh["cells"]] == [c["cell_type"] for c in en["cells"]], "cells do not pair up"
    setup_seen = 0
    for i, (a, b) in enumerate(zip(zh["cells"], en["cells"])):
        sa, sb = "".join(a["source"]), "".join(b["source"])
        if a["cell_type"] == "code":
            if sa != sb:
                # the one allowed difference: the setup cell selecting the language
                assert SETUP_LANG.sub("LANG", sa) == SETUP_LANG.sub("LANG", sb), f"code cell {i} differs"
                assert SETUP_LANG.search(sa).group(1) == "zh" and SETUP_LANG.search(sb).group(1) == "en"
                setup_seen += 1
        else:
            assert authoring.headings(sa) == authoring.headings(sb), (
                f"markdown cell {i}: headings differ (zh {authoring.headings(sa)}, en {authoring.headings(sb)})")
            pz, pe = prose(sa), prose(sb)
            if len(LETTER.findall(pz)) >= 4:
                assert han_ratio(pz) > 0.3, f"markdown cell {i} of the zh notebook is not Chinese: {sa[:80]!r}"
            assert han_ratio(pe) < 0.02, f"markdown cell {i} of the en notebook contains Chinese: {sb[:80]!r}"
    assert setup_seen == 1, "exactly one setup cell must select the language"
    assert zh["metadata"]["dtrain_lab"]["lang"] == "zh" and en["metadata"]["dtrain_lab"]["lang"] == "en"


@pytest.mark.parametrize("kind", KINDS)
def test_notebooks_are_generated_from_their_sources(kind):
    for src in authoring.sources(kind):
        for lang, nb in authoring.build(src, kind).items():
            path = authoring.notebook_path(src, lang, kind)
            assert path.exists(), f"{path} missing: run `make notebooks`"
            stored = load(path)
            want = [(c.cell_type, c.source, c.metadata.get("tags", [])) for c in nb.cells]
            have = [(c["cell_type"], "".join(c["source"]), c.get("metadata", {}).get("tags", [])) for c in stored["cells"]]
            assert have == want, f"{path.relative_to(ROOT)} is out of date with {src.relative_to(ROOT)}: run `make notebooks`"
    # and every notebook has a source
    stems = {s.stem for s in authoring.sources(kind)}
    for lang in ("zh", "en"):
        for nb in notebooks(kind, lang):
            assert nb.stem in stems, f"{nb} has no source in {kind}/_source"


def test_lessons_start_with_goals_and_end_with_summary_and_exercises():
    for path in notebooks("lessons", "en"):
        cells = load(path)["cells"]
        md = ["".join(c["source"]) for c in cells if c["cell_type"] == "markdown"]
        assert "You will be able to" in md[0], path.name
        tail = "\n".join(md[-3:])
        assert "## Summary" in tail and "## Exercises" in tail, path.name
    for path in notebooks("lessons", "zh"):
        md = ["".join(c["source"]) for c in load(path)["cells"] if c["cell_type"] == "markdown"]
        assert "学完本课" in md[0], path.name
        tail = "\n".join(md[-3:])
        assert "## 小结" in tail and "## 练习" in tail, path.name


def test_stored_outputs_hold_no_measurements():
    """What a run measures is never stored, and nothing stored is an empty placeholder: cells that
    measure are tagged nbval-ignore-output (cell metadata, not a comment in the learner's code) and
    stored empty; elsewhere no elapsed time or PID (the measured-* patterns nbval removes), no empty
    display, no plot's "<Figure size ...>" text without its image, no execution timestamps."""
    patterns = authoring.measured_patterns()
    assert len(patterns) >= 2, "tests/nbval_sanitize.cfg lost its measured-* sections"
    for kind in KINDS:
        for lang in ("zh", "en"):
            for path in notebooks(kind, lang):
                assert "widgets" not in load(path)["metadata"], f"{path}: a saved widget state (random model ids)"
                for i, cell in enumerate(load(path)["cells"]):
                    if cell["cell_type"] != "code":
                        continue
                    where = f"{path.relative_to(ROOT)} cell {i}"
                    src = "".join(cell["source"])
                    assert not re.search(r"^\s*#\s*NBVAL_", src, re.M), \
                        f"{where}: an nbval comment in the learner's code (use a cell tag)"
                    assert "execution" not in cell.get("metadata", {}), f"{where}: execution timestamps stored"
                    if "nbval-ignore-output" in cell.get("metadata", {}).get("tags", []):
                        assert cell["outputs"] == [], f"{where}: measured output stored"
                    for out in cell["outputs"]:
                        assert out.get("output_type") != "error", f"{where}: stored error output"
                        texts = ["".join(out.get("text", ""))]
                        if "data" in out:
                            data = out["data"]
                            assert data, f"{where}: an empty display stored"
                            plain = "".join(data.get("text/plain", ""))
                            texts.append(plain)
                            assert not (plain.startswith("<Figure size") and not any(k.startswith("image/") for k in data)), \
                                f"{where}: a plot stored without its image"
                        for text in texts:
                            for rx, _ in patterns:
                                assert not rx.search(text), f"{where}: stored measurement {rx.search(text).group(0)!r}"


def test_cleaning_strips_what_a_run_measures():
    import nbformat

    nb = nbformat.v4.new_notebook()
    kept = nbformat.v4.new_code_cell("launch(...)")
    kept.metadata["execution"] = {"iopub.execute_input": "2030-01-01T00:00:00Z"}
    kept.outputs = [nbformat.v4.new_output("display_data", data={}),
                    nbformat.v4.new_output("display_data", data={"text/plain": ""}),
                    nbformat.v4.new_output("stream", name="stdout", text="I am rank 0 (local rank 0), pid 4242, "
                                           "backend gloo\n✓ ok\n  [6.0 s, start-up 5.1 s]\n")]
    measured = nbformat.v4.new_code_cell("time_it()")
    measured.metadata["tags"] = ["nbval-ignore-output"]
    measured.outputs = [nbformat.v4.new_output("stream", name="stdout", text="0.123 s\n")]
    nb.cells = [kept, measured]
    authoring.clean_outputs(nb)
    assert [o["output_type"] for o in kept.outputs] == ["stream"]
    assert kept.outputs[0]["text"] == "I am rank 0 (local rank 0), backend gloo\n✓ ok\n"
    assert "execution" not in kept.metadata and measured.outputs == []


def test_source_parser_rejects_broken_sources():
    with pytest.raises(authoring.SourceError):
        authoring.parse("%% md\n%% en\nonly english\n%% setup\nx=1\n")
    with pytest.raises(authoring.SourceError):
        authoring.parse("%% code\nx = 1\n")  # no setup cell
    with pytest.raises(authoring.SourceError):
        authoring.parse("%% setup\nx=1\n%% en\nstray\n")
    code = "x = 0\n### BEGIN SOLUTION\nx = 42\n### END SOLUTION\n### BEGIN STUB\n# YOUR CODE HERE\n### END STUB\nprint(x)"
    assert authoring.render(code, "solution") == "x = 0\nx = 42\nprint(x)"
    assert authoring.render(code, "learner") == "x = 0\n# YOUR CODE HERE\nprint(x)"
    with pytest.raises(authoring.SourceError):
        authoring.render("### BEGIN SOLUTION\nx = 1\n", "learner")
    cells = authoring.parse("%% setup\nset_lang('{LANG}')\n%% md\n%% en\nHi\n%% zh\n你好\n%% code\nprint(1)\n")
    assert [c.kind for c in cells] == ["setup", "md", "code"]
    assert cells[0].source("zh") == "set_lang('zh')"
    # headings pair up: same count and level in both languages (a code block's '#' is no heading)
    with pytest.raises(authoring.SourceError, match="headings differ"):
        authoring.parse("%% setup\nx=1\n%% md\n%% en\n## 2. Title\ntext\n%% zh\n正文\n")
    with pytest.raises(authoring.SourceError, match="headings differ"):
        authoring.parse("%% setup\nx=1\n%% md\n%% en\n## A\n%% zh\n### 甲\n")
    authoring.parse("%% setup\nx=1\n%% md\n%% en\n## A\n```\n# comment\n```\n%% zh\n## 甲\n")
    # nbval's cell tags ride on the code cell's marker and end up in the cell's metadata
    src = "%% setup\nx=1\n%% code nbval-ignore-output\nmeasure()\n"
    cells = authoring.parse(src)
    assert cells[1].tags == ("nbval-ignore-output",) and cells[1].source("en") == "measure()"
    nb = authoring.to_notebook(cells, "en", "x.md")
    assert nb.cells[1].metadata["tags"] == ["nbval-ignore-output"] and nb.cells[0].metadata["tags"] == ["setup"]
    with pytest.raises(authoring.SourceError, match="unknown cell tag"):
        authoring.parse("%% setup\nx=1\n%% code nbval-ignore\nmeasure()\n")
    with pytest.raises(authoring.SourceError, match="only code cells"):
        authoring.parse("%% setup\nx=1\n%% md nbval-skip\n%% en\nA\n%% zh\n甲\n")


def test_environment_yml_agrees_with_pyproject():
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "gen_environment.py"), "--check"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_start_page_is_current_and_links_every_lesson_and_lab():
    """lessons/START_HERE.ipynb (where `make lab` opens) says where to begin in each language."""
    stored = load(authoring.START_PAGE)
    want = authoring.start_page()
    assert ["".join(c["source"]) for c in stored["cells"]] == [c.source for c in want.cells], \
        "lessons/START_HERE.ipynb is out of date: run `python -m dtrain_lab.authoring build --keep-outputs`"
    for cell, lang in zip(stored["cells"], ("zh", "en")):
        text = "".join(cell["source"])
        links = re.findall(r"\]\(([^)]+\.ipynb)\)", text)
        assert all((authoring.START_PAGE.parent / link).resolve().is_file() for link in links), links
        names = {Path(link).name for link in links}
        assert {p.name for p in notebooks("lessons", lang)} | {p.name for p in notebooks("labs", lang)} <= names
        assert all(link.startswith((f"{lang}/", f"../labs/{lang}/")) for link in links)
