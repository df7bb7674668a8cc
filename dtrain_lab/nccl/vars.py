"""The environment variables NCCL, PyTorch distributed and Gloo read, loaded from ``vars.toml``.

The table itself is data (``dtrain_lab/nccl/vars.toml``: every entry with the URL of the official
page it was taken from, its type, default, status and both descriptions); this module only loads it
into frozen :class:`EnvVar` records and exposes the names the linter and the lessons use: ``VARS``,
``NOT_VARIABLES``, ``DANGEROUS``, ``ALGORITHMS``, ``PROTOCOLS``, ``SUBSYSTEMS``, ``PREFIXES``,
``BUILD_NAMES``, ``TYPES``, ``STATUSES``, ``OWNERS`` and the source URLs (``NCCL_ENV``, ...).
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from dtrain_lab import i18n

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

TABLE = Path(__file__).with_name("vars.toml")
TYPES = ("bool", "int", "enum", "str", "list", "path", "seconds")
STATUSES = ("current", "deprecated", "renamed", "removed")
OWNERS = ("nccl", "pytorch", "gloo")


@dataclass(frozen=True)
class EnvVar:
    """One variable of the table; ``zh`` / ``en`` say what it does (:meth:`describe` picks one)."""

    name: str
    owner: str
    type: str
    zh: str
    en: str
    source: str
    zh_from: str = ""
    default: str | None = None
    default_source: str | None = None
    status: str = "current"
    replacement: str | None = None
    status_key: str | None = None           # catalogue message saying what the docs say about the status
    choices: tuple[str, ...] = ()            # enum values / list tokens, as the docs spell them
    deprecated_choices: tuple[str, ...] = ()  # values the docs keep only for compatibility
    case_insensitive: bool = False           # only where the docs say "not case sensitive"
    lo: int | None = None                    # inclusive bounds of an int
    hi: int | None = None
    since: str | None = None                 # first NCCL version, as the docs give it
    debugging: bool = False
    check: str | None = None
    empty_ok: bool = False                   # an empty value means something (else: "treated as unset")
    no_tilde: bool = False                   # the docs say "~" is not accepted in this path
    secret: bool = False                     # never echo the value

    def describe(self, lang: str | None = None) -> str:
        """What the variable does, in ``lang`` (default: the learner's language)."""
        return getattr(self, lang or i18n.get_lang())   # the entry's own zh / en fields


@dataclass(frozen=True)
class Pointer:
    """A name that needs a message of its own (a non-variable, a dangerous variable): the catalogue
    ``key`` of that message and the ``source`` it rests on."""

    key: str
    source: str


def _load() -> dict:
    with open(TABLE, "rb") as f:
        return tomllib.load(f)


def _entry(name: str, raw: dict) -> EnvVar:
    raw = dict(raw)
    for k in ("choices", "deprecated_choices"):
        if k in raw:
            raw[k] = tuple(raw[k])
    return EnvVar(name=name, **raw)


_DATA = _load()
SOURCES: dict[str, str] = dict(_DATA["sources"])
VARS: dict[str, EnvVar] = {name: _entry(name, raw) for name, raw in _DATA["var"].items()}
NOT_VARIABLES: dict[str, Pointer] = {n: Pointer(**p) for n, p in _DATA["not_variables"].items()}
DANGEROUS: dict[str, Pointer] = {n: Pointer(**p) for n, p in _DATA["dangerous"].items()}
SUBSYSTEMS: tuple[str, ...] = tuple(_DATA["vocabulary"]["subsystems"])
ALGORITHMS: tuple[str, ...] = tuple(_DATA["vocabulary"]["algorithms"])
PROTOCOLS: tuple[str, ...] = tuple(_DATA["vocabulary"]["protocols"])
PREFIXES: tuple[str, ...] = tuple(_DATA["vocabulary"]["prefixes"])
BUILD_NAMES = frozenset(_DATA["vocabulary"]["build_names"])

NCCL_ENV = SOURCES["nccl_env"]
NCCL_LOGGING = SOURCES["nccl_logging"]
NCCL_NET_TROUBLESHOOTING = SOURCES["nccl_net_troubleshooting"]
NCCL_RUNTIME_TROUBLESHOOTING = SOURCES["nccl_runtime_troubleshooting"]
PT_NCCL_ENV = SOURCES["pt_nccl_env"]
PT_DISTRIBUTED = SOURCES["pt_distributed"]
PT_DEBUG_ENV = SOURCES["pt_debug_env"]
PT_TORCHRUN = SOURCES["pt_torchrun"]
PT_PGNCCL_HPP = SOURCES["pt_pgnccl_hpp"]
PT_PGNCCL_CPP = SOURCES["pt_pgnccl_cpp"]
PT_FLIGHT_RECORDER_HPP = SOURCES["pt_flight_recorder_hpp"]
PT_C10D_UTILS_HPP = SOURCES["pt_c10d_utils_hpp"]
DOCKER_ENV_FILE = SOURCES["docker_env_file"]
# Where the timeout fact comes from (init_process_group's documentation).
NOT_VARIABLES_SOURCE = PT_DISTRIBUTED
