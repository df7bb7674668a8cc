"""One message catalogue, zh and en, for every message a learner sees.

Messages live in data files beside the code that owns them: every ``messages.toml`` under
``dtrain_lab/`` (``jobs/messages.toml``, ``parallel/messages.toml``, ...). One entry::

    [launch_ok]
    en = "✓ all {nproc} ranks finished (exit code 0)"
    zh = "✓ {nproc} 个 rank 全部正常结束（退出码 0）"
    zh_from = "3be0c4bd5a"      # hash of the English the Chinese was written from

Code asks for a message by key, never by text, and never branches on the language:

* :func:`tr` ``(key, lang=None, **fields)``: one language (default: the learner's);
* :func:`both` ``(key, **fields)``: both, the learner's first (errors raised by library code);
* :class:`LabError` ``(key, **fields)``: a learner-facing error, bilingual;
* :func:`pick` ``({"zh": ..., "en": ...})``: a value that is data, not a sentence (a title stored
  with an exercise): the learner's language of it.

The tests (``tests/test_i18n.py``) check that every key the code names exists, every key is used,
both languages have the same ``{placeholders}``, and that no Chinese text is older than its English:
``zh_from`` must equal the hash of the current ``en``. After editing an English text, update the
Chinese and run ``python -m dtrain_lab.i18n rehash KEY``; ``python -m dtrain_lab.i18n stale`` lists
what needs a translator.

Why not gettext/Babel: a learner-facing error here is shown in *both* languages at once (the learner's
first), and a notebook switches language at run time; gettext binds one language per process through
the locale and keys messages by their English text, so every English edit would change the key in
code as well. Babel's extraction, ``.po``/``.mo`` compilation and fuzzy matching would add a build
step and a dependency for what ~100 lines and a test do here: keyed entries, both languages side by
side in one reviewable file, and a hash that flags a stale translation exactly as Babel's "fuzzy"
flag would.

The language is chosen once, in a notebook's setup cell (``set_lang("zh")``) or by the
``DTRAIN_LANG`` environment variable; every rank a launch starts inherits it.
"""
from __future__ import annotations

import hashlib
import locale
import os
import string
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

LANGS = ("zh", "en")
PACKAGE_DIR = Path(__file__).resolve().parent.parent

_catalogue: dict[str, dict[str, str]] | None = None
_origin: dict[str, Path] = {}


def english_hash(text: str) -> str:
    return hashlib.sha1(text.encode("utf-8")).hexdigest()[:10]


def catalogue_files() -> list[Path]:
    return sorted(p for p in PACKAGE_DIR.rglob("messages.toml") if "__pycache__" not in p.parts)


def catalogue() -> dict[str, dict[str, str]]:
    """Every message: ``{key: {"en": ..., "zh": ..., "zh_from": ...}}``, loaded once."""
    global _catalogue
    if _catalogue is None:
        merged: dict[str, dict[str, str]] = {}
        for path in catalogue_files():
            with open(path, "rb") as f:
                table = tomllib.load(f)
            for key, entry in table.items():
                if key in merged:
                    raise RuntimeError(f"message key {key!r} defined twice: {_origin[key]} and {path}")
                merged[key] = entry
                _origin[key] = path
        _catalogue = merged
    return _catalogue


def origin(key: str) -> Path:
    catalogue()
    return _origin[key]


def placeholders(text: str) -> set[str]:
    """The field names of a format string (``{rank}``, ``{limit:g}`` -> {"rank", "limit"})."""
    return {name.split(".")[0].split("[")[0] for _, name, _, _ in string.Formatter().parse(text)
            if name is not None}


def _default_lang() -> str:
    env = os.environ.get("DTRAIN_LANG", "").strip().lower()
    if env in LANGS:
        return env
    try:
        loc = (locale.getlocale()[0] or os.environ.get("LANG", "")).lower()
    except ValueError:  # pragma: no cover - exotic locales
        loc = os.environ.get("LANG", "").lower()
    return "zh" if loc.startswith("zh") else "en"


_lang = _default_lang()


def set_lang(lang: str) -> str:
    """Select the learner's language ("zh" or "en") for this process and every job it launches."""
    global _lang
    lang = str(lang).strip().lower()
    if lang not in LANGS:
        raise ValueError(f"lang must be one of {LANGS} / 语言只能是 {LANGS}: {lang!r}")
    _lang = lang
    os.environ["DTRAIN_LANG"] = lang  # launched ranks inherit it
    return lang


def get_lang() -> str:
    return _lang


def other(lang: str) -> str:
    return "en" if lang == "zh" else "zh"


def tr(key: str, lang: str | None = None, **fields) -> str:
    """The message ``key`` in ``lang`` (default: the current language), formatted with ``fields``.

    A field that is itself a :class:`LabError` (e.g. the reason a checkpoint was skipped) is
    rendered in the same language, so each half of a bilingual message stays in one language.
    """
    lang = lang or _lang
    entry = catalogue()[key]
    fields = {k: v.message(lang) if isinstance(v, LabError) else v for k, v in fields.items()}
    return entry[lang].format(**fields)


def both(key: str, **fields) -> str:
    """The message in both languages, the learner's first: for errors raised in library code."""
    return f"{tr(key, _lang, **fields)}\n{tr(key, other(_lang), **fields)}"


def rendered(key: str, **fields) -> dict[str, str]:
    """``{"zh": ..., "en": ...}``: the message rendered in each language (stored in a report)."""
    return {lang: tr(key, lang, **fields) for lang in LANGS}


def pick(value: dict, lang: str | None = None) -> str:
    """The learner's language of a ``{"zh": ..., "en": ...}`` value (data such as a title)."""
    return value[lang or _lang]


class LabError(ValueError):
    """A learner-facing error: its message is bilingual, learner's language first; no traceback wall
    is needed to understand it."""

    def __init__(self, key: str, **fields):
        self.key = key
        self.fields = fields
        super().__init__(both(key, **fields))

    def message(self, lang: str | None = None) -> str:
        return tr(self.key, lang, **self.fields)


def stale() -> list[str]:
    """Keys whose Chinese was written from an English that has since changed."""
    return sorted(k for k, e in catalogue().items() if e.get("zh_from") != english_hash(e["en"]))


def rehash(keys: list[str]) -> list[str]:
    """Record that the Chinese of ``keys`` now matches their English (rewrites ``zh_from`` in place)."""
    import re

    done = []
    for key in keys:
        path = origin(key)
        text = path.read_text(encoding="utf-8")
        new = english_hash(catalogue()[key]["en"])
        pattern = re.compile(r"(^\[" + re.escape(key) + r"\]\n(?:(?!^\[).*\n)*?zh_from = )\"[0-9a-f]*\"", re.M)
        text, n = pattern.subn(lambda m, new=new: m.group(1) + f'"{new}"', text)
        if n == 1:
            path.write_text(text, encoding="utf-8")
            done.append(key)
    return done


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m dtrain_lab.i18n")
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("stale", help="list keys whose Chinese is older than their English")
    r = sub.add_parser("rehash", help="mark the Chinese of KEY as written from the current English")
    r.add_argument("keys", nargs="+")
    args = ap.parse_args(argv)
    if args.cmd == "stale":
        for k in stale():
            print(f"{k}  ({origin(k).relative_to(PACKAGE_DIR.parent)})")
        return 0
    done = rehash(args.keys)
    print(f"rehashed {len(done)}: {', '.join(done)}")
    return 0 if len(done) == len(args.keys) else 1


if __name__ == "__main__":
    sys.exit(main())
