"""What the linter reports (:class:`Finding`) and how it reads values the way their readers do."""
from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass, field

from dtrain_lab import i18n
from dtrain_lab.nccl.vars import EnvVar

SEVERITIES = ("error", "warning", "info")
SEVERITY_RANK = {s: i for i, s in enumerate(SEVERITIES)}


@dataclass(frozen=True)
class Finding:
    """One thing the linter noticed about ``var``.

    The message is the catalogue entry ``key`` formatted with ``fields`` (:meth:`message` in one
    language, :meth:`rendered` in both); ``suggestion`` is the name (or value) to use instead, if
    any; ``source`` the official page the finding rests on.
    """

    var: str
    severity: str  # "error" | "warning" | "info"
    code: str
    key: str
    fields: Mapping = field(default_factory=dict, hash=False)
    suggestion: str | None = None
    source: str | None = None

    def __post_init__(self):
        if self.severity not in SEVERITIES:
            raise ValueError(f"severity must be one of {SEVERITIES}: {self.severity!r}")

    def message(self, lang: str | None = None) -> str:
        return i18n.tr(self.key, lang, **self.fields)

    def rendered(self) -> dict[str, str]:
        """``{"zh": ..., "en": ...}``: the message in each language."""
        return i18n.rendered(self.key, **self.fields)

    def to_dict(self) -> dict:
        """JSON-ready: the message is rendered in both languages, the fields are not repeated."""
        return {"var": self.var, "severity": self.severity, "code": self.code, "key": self.key,
                "message": self.rendered(), "suggestion": self.suggestion, "source": self.source}


def finding(var: str, severity: str, code: str, key: str, /, *, suggestion: str | None = None,
            source: str | None = None, **fields) -> Finding:
    return Finding(var, severity, code, key, fields, suggestion=suggestion, source=source)


def shown(entry: EnvVar | None, value: str) -> str:
    """The value as it may appear in a message: secrets are never echoed."""
    return "'<hidden>'" if entry is not None and entry.secret else repr(value)


def suggest(word: str, candidates, cutoff: float = 0.85) -> list[str]:
    # 0.85 keeps real typos (NCCL_DEUBG -> NCCL_DEBUG is 0.90) and drops loose look-alikes
    # (NCCL_RINGS -> NCCL_MAX_NRINGS is 0.80).
    return difflib.get_close_matches(word, list(candidates), n=3, cutoff=cutoff)


# ------------------------------------------------------------------------------------ value parsing
# PyTorch's c10d reads its boolean variables with getCvarBool, which accepts these spellings in any
# case (torch/csrc/distributed/c10d/Utils.hpp). NCCL's documentation only defines 0 and 1.
PT_TRUE = ("1", "y", "yes", "t", "true")
PT_FALSE = ("0", "n", "no", "f", "false")
_PT_CVAR_PREFIXES = ("TORCH_NCCL_", "TORCH_FR_", "TORCH_GLOO_", "NCCL_")


def uses_cvar_bool(entry: EnvVar) -> bool:
    return entry.owner == "pytorch" and entry.name.startswith(_PT_CVAR_PREFIXES)


def parse_int(entry: EnvVar, value: str) -> int | None:
    # NCCL parses integers with strtoll(value, NULL, 0): decimal or 0x-hexadecimal.
    try:
        return int(value, 0 if entry.owner == "nccl" else 10)
    except ValueError:
        try:
            return int(value, 10)  # "010": Python's base 0 refuses leading zeros
        except ValueError:
            return None


def truth(entry: EnvVar | None, value: str | None) -> bool | None:
    """True/False for a boolean-looking value, None when unset or not a boolean."""
    if value is None:
        return None
    v = value.strip().lower()
    if entry is not None and uses_cvar_bool(entry):
        return True if v in PT_TRUE else False if v in PT_FALSE else None
    return True if v == "1" else False if v == "0" else None


def as_int(entry: EnvVar, value: str | None) -> int | None:
    return None if value is None else parse_int(entry, value.strip())
