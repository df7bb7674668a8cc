"""The one message catalogue: every key named exists, every key is used, both languages carry the same
placeholders, no Chinese text is older than its English, and nothing outside dtrain_lab.i18n keeps
its own table of translations or branches on the language."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from dtrain_lab import i18n
from dtrain_lab.authoring import parse

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "dtrain_lab"
# functions whose first argument is a catalogue key
KEY_CALLS = {"tr", "both", "LabError", "rendered", "msg", "warn_once", "say", "problem", "fail"}
LANG_CONSTS = {"zh", "en"}


def _library_files() -> list[Path]:
    return sorted(p for p in PKG.rglob("*.py") if "__pycache__" not in p.parts)


def _notebook_code() -> list[tuple[str, str]]:
    """(name, code) of every code cell of the lessons' and labs' sources."""
    out = []
    for src in sorted(ROOT.glob("lessons/_source/*.md")) + sorted(ROOT.glob("solutions/_source/*.md")):
        for c in parse(src.read_text(encoding="utf-8"), str(src)):
            if c.kind != "md":
                out.append((f"{src.name}:{c.line}", c.text["*"]))
    return out


def _trees():
    for p in _library_files():
        yield str(p.relative_to(ROOT)), ast.parse(p.read_text(encoding="utf-8"))
    for name, code in _notebook_code():
        try:
            yield name, ast.parse("\n".join(line for line in code.split("\n") if not line.startswith(("%", "!"))))
        except SyntaxError:
            continue


def _call_name(node: ast.Call) -> str | None:
    f = node.func
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None


def _key_calls():
    for name, tree in _trees():
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and _call_name(node) in KEY_CALLS and node.args:
                yield name, node


def test_catalogue_loads_and_every_entry_has_both_languages():
    cat = i18n.catalogue()
    assert len(cat) > 100
    for key, entry in cat.items():
        assert re.fullmatch(r"[a-z0-9_]+", key), key
        assert set(entry) == {"en", "zh", "zh_from"}, (key, sorted(entry))
        assert entry["en"].strip() and entry["zh"].strip(), key
        assert not re.search(r"[\u4e00-\u9fff]", entry["en"]), f"{key}: Chinese in the English text"


def test_chinese_text_is_chinese():
    # a zh text may be a bare format string or an identifier (a table row), but a sentence must be Chinese
    for key, entry in i18n.catalogue().items():
        if len(re.findall(r"[A-Za-z]+", entry["zh"])) > 6:
            assert re.search(r"[\u4e00-\u9fff]", entry["zh"]), f"{key}: zh is not Chinese: {entry['zh']!r}"


def test_placeholders_match_in_both_languages():
    bad = {k: (i18n.placeholders(e["en"]), i18n.placeholders(e["zh"]))
           for k, e in i18n.catalogue().items() if i18n.placeholders(e["en"]) != i18n.placeholders(e["zh"])}
    assert not bad, f"placeholders differ between en and zh: {bad}"


def test_no_chinese_text_is_stale():
    stale = i18n.stale()
    assert not stale, (f"the English of {stale} changed after its Chinese was written: update the Chinese, "
                       f"then `python -m dtrain_lab.i18n rehash KEY`")


def test_stale_detection_and_rehash(tmp_path, monkeypatch):
    table = tmp_path / "messages.toml"
    table.write_text('[demo_key]\nen = "new English"\nzh = "旧的中文"\nzh_from = "0000000000"\n', encoding="utf-8")
    monkeypatch.setattr(i18n, "PACKAGE_DIR", tmp_path)
    monkeypatch.setattr(i18n, "_catalogue", None)
    assert i18n.stale() == ["demo_key"]
    assert i18n.rehash(["demo_key"]) == ["demo_key"]
    monkeypatch.setattr(i18n, "_catalogue", None)
    assert i18n.stale() == []
    monkeypatch.setattr(i18n, "_catalogue", None)


def test_every_named_key_exists():
    cat = i18n.catalogue()
    missing = []
    for name, node in _key_calls():
        arg = node.args[0]
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            if arg.value not in cat:
                missing.append(f"{name}:{node.lineno} {arg.value!r}")
    assert not missing, f"keys named in code but not in any messages.toml: {missing}"


def test_every_key_is_used():
    # a key counts as used where its literal appears in library code or a notebook's code (dynamic keys
    # are written out as literals, e.g. in a tuple, so that this test and a reader can find them)
    literals: set[str] = set()
    for _, tree in _trees():
        literals |= {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    unused = sorted(set(i18n.catalogue()) - literals)
    assert not unused, f"keys no code uses (delete them): {unused}"


def _is_lang_const(node) -> bool:
    return isinstance(node, ast.Constant) and node.value in LANG_CONSTS


def test_no_language_branches_or_private_tables_outside_the_catalogue():
    """The language is a parameter of the catalogue, never a branch in code; no module keeps a dict
    of translations of its own."""
    found = []
    for path in _library_files():
        if path.parent == PKG / "i18n":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        rel = path.relative_to(ROOT)
        for node in ast.walk(tree):
            if isinstance(node, ast.Compare) and any(_is_lang_const(x) for x in [node.left, *node.comparators]):
                found.append(f"{rel}:{node.lineno} compares with a language name")
            if isinstance(node, ast.IfExp) and isinstance(node.test, ast.Compare) and \
                    any(_is_lang_const(x) for x in [node.test.left, *node.test.comparators]):
                found.append(f"{rel}:{node.lineno} chooses text by language")
            if isinstance(node, ast.Dict):
                keys = {k.value for k in node.keys if isinstance(k, ast.Constant)}
                if LANG_CONSTS <= keys:
                    found.append(f"{rel}:{node.lineno} a private {{'zh': ..., 'en': ...}} table")
            if isinstance(node, ast.Call) and _call_name(node) == "zip" and node.args and \
                    isinstance(node.args[0], (ast.Tuple, ast.List)) and \
                    {getattr(e, "value", None) for e in node.args[0].elts} == LANG_CONSTS:
                found.append(f"{rel}:{node.lineno} a private table zipped onto ('en', 'zh')")
            if isinstance(node, ast.DictComp) and any(
                    isinstance(g.iter, (ast.Tuple, ast.List)) and
                    {getattr(e, "value", None) for e in g.iter.elts} == LANG_CONSTS for g in node.generators):
                found.append(f"{rel}:{node.lineno} a private table built per language")
            if isinstance(node, ast.Call) and _call_name(node) == "dict" and \
                    LANG_CONSTS <= {k.arg for k in node.keywords}:
                found.append(f"{rel}:{node.lineno} a private dict(zh=..., en=...) table")
            if isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for t in targets:
                    if isinstance(t, ast.Name) and re.search(r"_(zh|en)$", t.id):
                        found.append(f"{rel}:{node.lineno} a per-language variable {t.id}")
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and \
                    re.search(r"_(zh|en)$", node.target.id):
                found.append(f"{rel}:{node.lineno} a per-language field {node.target.id}")
    assert not found, "messages must go through dtrain_lab.i18n:\n" + "\n".join(found)


@pytest.mark.parametrize("lang", i18n.LANGS)
def test_labError_renders_each_language(lang):
    err = i18n.LabError("bad_nproc", value=0)
    assert err.message(lang) == i18n.tr("bad_nproc", lang, value=0)
    assert err.message("zh") in str(err) and err.message("en") in str(err)
