"""NCCL / PyTorch-distributed environment: a linter for settings and a doctor for the machine.

* ``lint_env(mapping)`` checks environment variables (``os.environ`` or an ``.env`` file read with
  ``parse_env_file``) against the knowledge base in ``dtrain_lab.nccl.vars``: unknown names with a
  did-you-mean, names nothing reads (``NCCL_TIMEOUT``), renamed / deprecated / removed variables,
  invalid values and contradictory combinations. Every finding is bilingual and, where it rests on
  a document, carries the URL of that document.
* ``doctor()`` inspects the machine the way NCCL will see it: GPUs, network interfaces, /dev/shm,
  ulimits, versions; ``format_doctor`` prints it.
* ``main_lint`` / ``main_doctor`` are the ``dtrain-lab nccl lint|doctor`` commands.

Only variables of the NCCL, PyTorch-distributed and Gloo families are inspected (see
``nccl_vars.PREFIXES``); PATH, HOME and the like are never looked at.
"""
from __future__ import annotations

import argparse
import difflib
import ipaddress
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

from dtrain_lab import i18n
from dtrain_lab.nccl.vars import (ALGORITHMS, BUILD_NAMES, NCCL_ENV, NCCL_LOGGING, NCCL_NET_TROUBLESHOOTING,
                        NCCL_RUNTIME_TROUBLESHOOTING, NOT_VARIABLES, NOT_VARIABLES_SOURCE, PREFIXES,
                        PROTOCOLS, PT_C10D_UTILS_HPP, PT_DEBUG_ENV, PT_DISTRIBUTED,
                        PT_FLIGHT_RECORDER_HPP, PT_NCCL_ENV, PT_PGNCCL_HPP, SUBSYSTEMS, VARS,
                        EnvVar)

__all__ = ["Finding", "EnvFileError", "lint_env", "parse_env_file", "doctor", "format_doctor",
           "main_lint", "main_doctor", "VARS", "SEVERITIES"]

SEVERITIES = ("error", "warning", "info")
_RANK = {s: i for i, s in enumerate(SEVERITIES)}


# ======================================================================================= findings
@dataclass(frozen=True)
class Finding:
    """One thing ``lint_env`` noticed. ``suggestion`` is the name (or value) to use instead, if any;
    ``source`` the official page the finding rests on."""

    var: str
    severity: str  # "error" | "warning" | "info"
    code: str
    message_zh: str
    message_en: str
    suggestion: str | None = None
    source: str | None = None

    def __post_init__(self):
        if self.severity not in SEVERITIES:
            raise ValueError(f"severity must be one of {SEVERITIES}: {self.severity!r}")

    def message(self, lang: str | None = None) -> str:
        return self.message_zh if (lang or i18n.get_lang()) == "zh" else self.message_en

    def to_dict(self) -> dict:
        return asdict(self)


def _f(var, severity, code, zh, en, *, suggestion=None, source=None) -> Finding:
    return Finding(var, severity, code, zh, en, suggestion=suggestion, source=source)


def _shown(entry: EnvVar | None, value: str) -> str:
    """The value as it may appear in a message: secrets are never echoed."""
    return "'<hidden>'" if entry is not None and entry.secret else repr(value)


def _family(name: str) -> tuple[str, str]:
    """(zh, en) name of the documentation a variable name belongs to."""
    if name.startswith("NCCL_"):
        return "NCCL", "NCCL"
    if name.startswith("GLOO_"):
        return "Gloo（PyTorch）", "Gloo (PyTorch)"
    return "PyTorch", "PyTorch"


def _suggest(word: str, candidates, cutoff: float = 0.85) -> list[str]:
    # 0.85 keeps real typos (NCCL_DEUBG -> NCCL_DEBUG is 0.90) and drops loose look-alikes
    # (NCCL_RINGS -> NCCL_MAX_NRINGS is 0.80).
    return difflib.get_close_matches(word, list(candidates), n=3, cutoff=cutoff)


# =================================================================================== value parsing
# PyTorch's c10d reads its boolean variables with getCvarBool, which accepts these spellings in any
# case (torch/csrc/distributed/c10d/Utils.hpp). NCCL's documentation only defines 0 and 1.
_PT_TRUE = ("1", "y", "yes", "t", "true")
_PT_FALSE = ("0", "n", "no", "f", "false")
_PT_CVAR_PREFIXES = ("TORCH_NCCL_", "TORCH_FR_", "TORCH_GLOO_", "NCCL_")


def _uses_cvar_bool(entry: EnvVar) -> bool:
    return entry.owner == "pytorch" and entry.name.startswith(_PT_CVAR_PREFIXES)


def _parse_int(entry: EnvVar, value: str) -> int | None:
    # NCCL parses integers with strtoll(value, NULL, 0): decimal or 0x-hexadecimal.
    try:
        return int(value, 0 if entry.owner == "nccl" else 10)
    except ValueError:
        try:
            return int(value, 10)  # "010": Python's base 0 refuses leading zeros
        except ValueError:
            return None


def _truth(entry: EnvVar | None, value: str | None) -> bool | None:
    """True/False for a boolean-looking value, None when unset or not a boolean."""
    if value is None:
        return None
    v = value.strip().lower()
    if entry is not None and _uses_cvar_bool(entry):
        return True if v in _PT_TRUE else False if v in _PT_FALSE else None
    return True if v == "1" else False if v == "0" else None


def _as_int(entry: EnvVar, value: str | None) -> int | None:
    return None if value is None else _parse_int(entry, value.strip())


# ==================================================================================== value checks
def _check_bool(e: EnvVar, var: str, value: str) -> list[Finding]:
    if _uses_cvar_bool(e):
        if value.lower() in _PT_TRUE + _PT_FALSE:
            return []
        return [_f(var, "error", "invalid-value",
                   f"{var}={value!r} 不是有效的布尔值：PyTorch 只接受 1/0、true/false、yes/no、y/n、t/f，"
                   f"其他值会在读取时直接报错。",
                   f"{var}={value!r} is not a boolean PyTorch accepts (1/0, true/false, yes/no, y/n, t/f); "
                   f"anything else raises an error when it is read.",
                   suggestion="1", source=PT_C10D_UTILS_HPP)]
    if value in ("0", "1"):
        return []
    hint = "1" if value.lower() in _PT_TRUE + ("on", "enable", "enabled") else \
        "0" if value.lower() in _PT_FALSE + ("off", "disable", "disabled") else None
    hint_zh = {"1": "想表示开启请写 1。", "0": "想表示关闭请写 0。"}.get(hint, "")
    hint_en = f" Write {hint} instead." if hint else ""
    return [_f(var, "error", "invalid-value",
               f"{var}={_shown(e, value)} 不是有效值：文档只定义了 0 和 1。{hint_zh}",
               f"{var}={_shown(e, value)} is not a valid value: the documentation only defines 0 and 1.{hint_en}",
               suggestion=hint, source=e.source)]


def _check_int(e: EnvVar, var: str, value: str) -> list[Finding]:
    n = _parse_int(e, value)
    if n is None:
        return [_f(var, "error", "invalid-value",
                   f"{var}={_shown(e, value)} 必须是整数。",
                   f"{var}={_shown(e, value)} must be an integer.", source=e.source)]
    if e.check == "ib_timeout":
        return []  # its range is checked by _chk_ib_timeout, which knows what 0 and >= 32 mean
    lo_ok = e.lo is None or n >= e.lo
    hi_ok = e.hi is None or n <= e.hi
    if lo_ok and hi_ok:
        return []
    rng = f"{'' if e.lo is None else e.lo}..{'' if e.hi is None else e.hi}"
    if e.lo is not None and e.hi is None:
        rng_zh, rng_en = f"≥ {e.lo}", f">= {e.lo}"
    elif e.lo is None:
        rng_zh, rng_en = f"≤ {e.hi}", f"<= {e.hi}"
    else:
        rng_zh = rng_en = rng
    return [_f(var, "error", "invalid-value",
               f"{var}={n} 超出了文档给出的取值范围（{rng_zh}）。",
               f"{var}={n} is outside the documented range ({rng_en}).", source=e.source)]


def _deprecated_value(e: EnvVar, var: str, value: str) -> Finding:
    if e.check == "path_level":
        return _f(var, "warning", "deprecated-value",
                  f"{var}={value}：整数写法只是为兼容旧版本保留的，官方不推荐（各数字对应的路径类型随版本变过），"
                  f"请改用字符串：0=LOC、1=PIX、2=PXB、3=PHB、4 及以上=SYS。",
                  f"{var}={value}: integer levels are kept for backward compatibility only and the docs "
                  f"discourage them (their meaning changed over time); use the string form: 0=LOC, 1=PIX, "
                  f"2=PXB, 3=PHB, 4 and above=SYS.",
                  suggestion=_LEGACY_LEVEL_NAME.get(value, "SYS"), source=e.source)
    if var == "NCCL_LAUNCH_MODE":
        return _f(var, "warning", "deprecated-value",
                  f"{var}=GROUP 自 NCCL 2.9 起已弃用，将来的版本可能删除；默认的 PARALLEL 即可。",
                  f"{var}=GROUP is deprecated since NCCL 2.9 and may be removed; the default PARALLEL is fine.",
                  suggestion="PARALLEL", source=e.source)
    return _f(var, "warning", "deprecated-value",
              f"{var} 的取值 {value} 只在旧版本中有效，请查阅文档换成当前的写法。",
              f"{var}: the value {value} is only valid in old versions; see the docs for the current one.",
              source=e.source)


_LEGACY_LEVEL_NAME = {"0": "LOC", "1": "PIX", "2": "PXB", "3": "PHB", "4": "SYS"}


def _check_choice(e: EnvVar, var: str, value: str) -> list[Finding]:
    if value in e.choices:
        return []
    if value in e.deprecated_choices:
        return [_deprecated_value(e, var, value)]
    by_upper = {c.upper(): c for c in e.choices + e.deprecated_choices}
    canon = by_upper.get(value.upper())
    if canon is not None:
        if canon in e.deprecated_choices:
            return [_deprecated_value(e, var, canon)]
        if e.case_insensitive:
            return []
        return [_f(var, "warning", "spelling",
                   f"{var}={value!r}：文档里这个取值写作 {canon}，没有说明是否区分大小写，保险起见请按文档的写法。",
                   f"{var}={value!r}: the documentation spells this value {canon} and does not say the "
                   f"variable is case-insensitive; use the documented spelling.",
                   suggestion=canon, source=e.source)]
    close = _suggest(value.upper(), by_upper, cutoff=0.6)
    hint_zh = f"你是不是想写 {by_upper[close[0]]}？" if close else ""
    hint_en = f" Did you mean {by_upper[close[0]]}?" if close else ""
    allowed = ", ".join(e.choices)
    return [_f(var, "error", "invalid-value",
               f"{var}={_shown(e, value)} 不是有效值，可选值：{allowed}。{hint_zh}",
               f"{var}={_shown(e, value)} is not a valid value; allowed: {allowed}.{hint_en}",
               suggestion=by_upper[close[0]] if close else None, source=e.source)]


def _split_items(value: str) -> tuple[bool, list[str]]:
    """NCCL's list syntax: an optional leading ^ (exclude list), then comma-separated items."""
    exclude = value.startswith("^")
    return exclude, (value[1:] if exclude else value).split(",")


def _empty_item(var: str, source: str) -> Finding:
    return _f(var, "error", "invalid-value",
              f"{var} 的列表里有空项（多了逗号？）。", f"{var} has an empty item in its list (a stray comma?).",
              source=source)


def _chk_ifname(e: EnvVar, var: str, value: str) -> list[Finding]:
    out = []
    exclude, items = _split_items(value)
    for item in items:
        name = item[1:] if item.startswith("=") else item
        if not name:
            out.append(_empty_item(var, e.source))
        elif "^" in name:
            out.append(_f(var, "warning", "invalid-value",
                          f"{var}={value!r}：^ 只能放在整个列表的最前面，表示“排除下列网卡”；同一个列表里不能既包含又排除。",
                          f"{var}={value!r}: ^ only works at the very start of the list (\"exclude all of "
                          f"these\"); one list cannot both include and exclude.", source=e.source))
        elif name == "lo" and not exclude and var == "NCCL_SOCKET_IFNAME":
            out.append(_f(var, "info", "loopback",
                          f"{var} 选中了回环网卡 lo：只有本机上的进程能连进来，单机多卡可以，多机训练一定连不上。",
                          f"{var} selects the loopback interface lo: only processes on this machine can "
                          f"connect. Fine on one machine, multi-node jobs cannot work.", source=e.source))
    return out


def _chk_hca(e: EnvVar, var: str, value: str) -> list[Finding]:
    out = []
    _, items = _split_items(value)
    exact = items[0].startswith("=") if items else False
    for item in items:
        item = item[1:] if item.startswith("=") else item
        fields = item.split(":")
        if not item:
            out.append(_empty_item(var, e.source))
            continue
        if len(fields) > 4 or not fields[0]:
            out.append(_f(var, "error", "invalid-value",
                          f"{var} 的一项 {item!r} 格式不对，应为 <hca>[:<port>[:<rail>[:<plane>]]]。",
                          f"{var}: item {item!r} is malformed; expected <hca>[:<port>[:<rail>[:<plane>]]].",
                          source=e.source))
            continue
        for field in fields[1:]:
            if field and not re.fullmatch(r"-?\d+", field):
                out.append(_f(var, "error", "invalid-value",
                              f"{var} 的一项 {item!r} 中 {field!r} 不是数字（端口、rail、plane 都应为整数）。",
                              f"{var}: in {item!r}, {field!r} is not a number (port, rail and plane are integers).",
                              source=e.source))
    if not exact and any(re.search(r"\d$", i.split(":")[0]) for i in items if i):
        out.append(_f(var, "info", "prefix-match",
                      f"{var}={value!r} 没有用 = 前缀，会按前缀匹配：例如 mlx5_1 还会选中 mlx5_10 到 mlx5_19。"
                      f"官方建议加上 =（例如 ={value.lstrip('^')}）做精确匹配。",
                      f"{var}={value!r} has no = prefix, so names match as prefixes: mlx5_1 also selects "
                      f"mlx5_10 to mlx5_19. The docs recommend adding = for exact matches.",
                      source=e.source))
    return out


def _chk_tokens(e: EnvVar, var: str, value: str, vocabulary, *, unknown_severity: str,
                allow_caret=True) -> list[Finding]:
    """A comma-separated list of words taken from ``vocabulary`` (optionally ^-prefixed)."""
    out = []
    exclude, items = _split_items(value) if allow_caret else (False, value.split(","))
    by_upper = {w.upper(): w for w in vocabulary}
    for item in items:
        word = item.lstrip("^").strip()
        if not word:
            out.append(_empty_item(var, e.source))
        elif word.upper() not in by_upper:
            close = _suggest(word.upper(), by_upper, cutoff=0.6)
            hint_zh = f"你是不是想写 {by_upper[close[0]]}？" if close else ""
            hint_en = f" Did you mean {by_upper[close[0]]}?" if close else ""
            out.append(_f(var, unknown_severity, "invalid-value",
                          f"{var} 里的 {word!r} 不是文档列出的名字（可选：{', '.join(vocabulary)}）。{hint_zh}",
                          f"{var}: {word!r} is not a documented name (choose from {', '.join(vocabulary)}).{hint_en}",
                          suggestion=by_upper[close[0]] if close else None, source=e.source))
        elif word != by_upper[word.upper()] and not e.case_insensitive:
            out.append(_f(var, "warning", "spelling",
                          f"{var} 里的 {word!r} 在文档里写作 {by_upper[word.upper()]}，请按文档的大写写法。",
                          f"{var}: {word!r} is spelled {by_upper[word.upper()]} in the documentation; use "
                          f"that spelling.", suggestion=by_upper[word.upper()], source=e.source))
    return out


def _chk_subsys(e, var, value):
    # An unknown subsystem only filters out nothing; newer NCCL versions add subsystems: a warning.
    return _chk_tokens(e, var, value, SUBSYSTEMS, unknown_severity="warning")


def _chk_levels(e, var, value):
    # The docs say unknown level names are ignored (so that site-wide settings survive upgrades).
    if value == "":
        return []
    return _chk_tokens(e, var, value, e.choices, unknown_severity="warning")


def _chk_algo_proto(e: EnvVar, var: str, value: str, vocabulary) -> list[Finding]:
    out = []
    entries = value.split(";")
    per_function = len(entries) > 1 or ":" in value
    for entry in entries:
        func, _, tokens = entry.rpartition(":")
        if ":" in entry and not re.fullmatch(r"[A-Za-z]+", func):
            out.append(_f(var, "error", "invalid-value",
                          f"{var} 的一项 {entry!r} 格式不对，应为 [函数名:]列表，例如 allreduce:tree。",
                          f"{var}: {entry!r} is malformed; expected [function:]list, e.g. allreduce:tree.",
                          source=e.source))
            continue
        for item in (tokens[1:] if tokens.startswith("^") else tokens).split(","):
            word = item.strip()
            if not word:
                out.append(_empty_item(var, e.source))
            elif word.lower() in {d.lower() for d in e.deprecated_choices}:
                out.append(_f(var, "warning", "deprecated-value",
                              f"{var} 里的 {word}：Collnet 只在 NCCL 2.5 到 2.13 有效，新版本请用 CollnetChain 或 CollnetDirect。",
                              f"{var}: {word} is only valid in NCCL 2.5 to 2.13; newer versions use "
                              f"CollnetChain or CollnetDirect.", suggestion="CollnetDirect", source=e.source))
            elif word.lower() not in {w.lower() for w in vocabulary}:
                close = _suggest(word.lower(), [w.lower() for w in vocabulary], cutoff=0.6)
                canon = next((w for w in vocabulary if close and w.lower() == close[0]), None)
                hint_zh = f"你是不是想写 {canon}？" if canon else ""
                hint_en = f" Did you mean {canon}?" if canon else ""
                out.append(_f(var, "error", "invalid-value",
                              f"{var} 里的 {word!r} 不是有效名字（可选：{', '.join(vocabulary)}，不区分大小写）。"
                              f"NCCL 2.24 起遇到不认识的名字会直接失败。{hint_zh}",
                              f"{var}: {word!r} is not a valid name (choose from {', '.join(vocabulary)}, "
                              f"case-insensitive); since NCCL 2.24 an unknown token makes NCCL fail.{hint_en}",
                              suggestion=canon, source=e.source))
            elif var == "NCCL_PROTO" and word.lower() == "ll128" and not tokens.startswith("^"):
                out.append(_f(var, "warning", "risky-value",
                              f"{var} 显式启用了 LL128：官方提醒在不支持 LL128 的平台上强制启用可能导致数据损坏，"
                              f"除非确认平台支持，否则别手动指定协议。",
                              f"{var} explicitly enables LL128: the docs warn that enabling LL128 on platforms "
                              f"that do not support it can corrupt data; avoid forcing protocols unless you know "
                              f"the platform supports it.", source=e.source))
    if per_function:
        out.append(_f(var, "info", "version-note",
                      f"{var} 用了按函数指定的写法（分号或 函数名:），需要 NCCL 2.24 及以上。",
                      f"{var} uses the per-function syntax (; or function:), which needs NCCL 2.24 or later.",
                      source=e.source))
    return out


def _chk_path_level(e, var, value):
    # The docs: integer levels are legacy, and "values greater than 4 will be interpreted as SYS".
    if value.isdigit():
        return [_deprecated_value(e, var, value)]
    return _check_choice(e, var, value)


def _chk_debug(e, var, value):
    if value.upper() == "ABORT":
        # NCCL's source knows an ABORT level, but the env page lists it only for NCCL_DEBUG_LEVELS and
        # NCCL_DEBUG_TIMESTAMP_LEVELS, not as a value of NCCL_DEBUG.
        return [_f(var, "warning", "undocumented-value",
                   "NCCL_DEBUG=ABORT 不是文档列出的取值（ABORT 只出现在 NCCL_DEBUG_LEVELS 等变量里）；"
                   "想看错误信息请用 WARN，排查问题用 INFO。",
                   "NCCL_DEBUG=ABORT is not a documented value (ABORT only appears for NCCL_DEBUG_LEVELS and "
                   "similar variables); use WARN to see errors, INFO to debug.", suggestion="WARN", source=e.source)]
    out = _check_choice(e, var, value)
    if out:
        return out
    if value == "ATTN":
        return [_f(var, "info", "version-note",
                   "NCCL_DEBUG=ATTN 需要 NCCL 2.32 及以上；更早的版本不认识 ATTN，会变成完全不打印调试信息。"
                   "混用版本的环境里，官方建议写 NCCL_DEBUG=WARN NCCL_DEBUG_LEVELS=ATTN。",
                   "NCCL_DEBUG=ATTN needs NCCL 2.32 or later; older versions do not know ATTN and print no "
                   "debug output at all. For mixed versions the docs suggest NCCL_DEBUG=WARN "
                   "NCCL_DEBUG_LEVELS=ATTN.", source=e.source)]
    return []


def _chk_debug_file(e, var, value):
    if value in ("/dev/stdout", "/dev/stderr") or "%p" in value or "%h" in value:
        return []
    return [_f(var, "info", "shared-log-file",
               f"{var}={value!r} 不含 %h（主机名）或 %p（进程号）：多进程作业里所有进程会写同一个文件，"
               f"输出可能丢失或错乱（文件还会被覆盖）。建议写成例如 nccl.%h.%p.log。",
               f"{var}={value!r} contains neither %h (hostname) nor %p (PID): in a multi-process job every "
               f"process writes the same file and output may be lost or corrupted. Use e.g. nccl.%h.%p.log.",
               suggestion="nccl.%h.%p.log", source=e.source)]


def _chk_ib_timeout(e, var, value):
    n = _parse_int(e, value)
    if n is None:
        return []  # already reported by _check_int
    if n < 0:
        return [_f(var, "error", "invalid-value", f"{var}={n} 不能为负数（取值 0-31）。",
                   f"{var}={n} cannot be negative (0-31).", source=e.source)]
    if n == 0 or n >= 32:
        return [_f(var, "warning", "infinite-timeout",
                   f"{var}={n} 表示无限超时：链路真的断了时，NCCL 会一直等下去而不是报错。文档给出的取值是 0-31，默认 20。",
                   f"{var}={n} means an infinite timeout: if a link really dies NCCL waits forever instead "
                   f"of failing. The documented values are 0-31, default 20.", suggestion="20", source=e.source)]
    return []


def _chk_gid_index(e, var, value):
    return [_f(var, "info", "version-note",
               f"NCCL 2.21 起会自动选择 GID，官方建议这种情况下不要再设置 {var}（旧版本的 RoCE v2 才需要用 show_gids 查出来手工设置）。",
               f"Since NCCL 2.21 the GID is selected automatically and the docs say {var} should not be set "
               f"(only older versions needed it set by hand, from show_gids, for RoCE v2).",
               source=NCCL_NET_TROUBLESHOOTING)]


def _chk_pow2(e, var, value):
    n = _parse_int(e, value)
    if n is None or n <= 0 or n & (n - 1) == 0:
        return []
    return [_f(var, "info", "not-power-of-2",
               f"{var}={n} 不是 2 的幂，文档建议使用 2 的幂。", f"{var}={n} is not a power of 2, which the docs recommend.",
               source=e.source)]


def _chk_net(e, var, value):
    if value.lower() in ("ib", "socket", "networkdirect"):
        return []
    return [_f(var, "info", "plugin-name",
               f"{var}={value!r} 不是内置网络（IB、Socket）的名字，必须与已安装的外部网络插件的名字完全一致（不区分大小写）。",
               f"{var}={value!r} is not an internal network (IB, Socket): it must match the name of an "
               f"installed external network plugin exactly (case-insensitive).", source=e.source)]


def _chk_cidr(e, var, value):
    try:
        ipaddress.ip_network(value, strict=False)
        return []
    except ValueError:
        return [_f(var, "error", "invalid-value", f"{var}={value!r} 不是合法的 CIDR 网段（例如 10.0.0.0/16）。",
                   f"{var}={value!r} is not a valid CIDR range (e.g. 10.0.0.0/16).", source=e.source)]


def _chk_host_port(e, var, value):
    m = re.fullmatch(r"(\[[0-9A-Fa-f:.]+\]|[^:\[\]]+):(\d+)", value)
    if m and 1 <= int(m.group(2)) <= 65535:
        return []
    return [_f(var, "error", "invalid-value",
               f"{var}={value!r} 应为 主机:端口（IPv6 地址要加方括号，例如 [::1]:28028）。",
               f"{var}={value!r} should be host:port (IPv6 addresses in brackets, e.g. [::1]:28028).",
               source=e.source)]


def _chk_positive_number(e, var, value):
    try:
        x = float(value)
    except ValueError:
        return [_f(var, "error", "invalid-value", f"{var}={value!r} 必须是正数。",
                   f"{var}={value!r} must be a positive number.", source=e.source)]
    if x <= 0:
        return [_f(var, "warning", "ignored-value",
                   f"{var}={value} 不大于 0，会被忽略并按 1 处理。", f"{var}={value} is not above 0; it is ignored and 1 is used.",
                   source=e.source)]
    return []


def _chk_psk(e, var, value):
    if value == "" or len(value) >= 32:
        return []
    return [_f(var, "error", "invalid-value",
               f"{var} 太短：非空的密钥至少要 32 个字符，否则会被拒绝（值不在这里显示）。",
               f"{var} is too short: a non-empty key must have at least 32 characters or it is rejected "
               f"(the value is not shown).", source=e.source)]


def _chk_cta_policy(e, var, value):
    if value in ("0", "1", "2"):
        return [_f(var, "info", "deprecated-value",
                   f"{var}={value} 是旧式写法（2.27 起），2.29 起可以写成 DEFAULT、EFFICIENCY 或 ZERO。",
                   f"{var}={value} is the legacy spelling (2.27); since 2.29 use DEFAULT, EFFICIENCY or ZERO.",
                   suggestion={"0": "DEFAULT", "1": "EFFICIENCY", "2": "ZERO"}[value], source=e.source)]
    bad = [p for p in value.split("|") if p not in ("DEFAULT", "EFFICIENCY", "ZERO")]
    if not bad:
        return []
    return [_f(var, "error", "invalid-value",
               f"{var}={value!r} 无效：可选 DEFAULT、EFFICIENCY、ZERO（可用 | 组合），或旧式的 0/1/2。",
               f"{var}={value!r} is invalid: use DEFAULT, EFFICIENCY, ZERO (combinable with |) or legacy 0/1/2.",
               source=e.source)]


def _chk_netdevs(e, var, value):
    if value in ("AUTO", "ALL") or re.fullmatch(r"MAX:[1-9]\d*", value):
        return []
    return [_f(var, "error", "invalid-value", f"{var}={value!r} 无效：可选 ALL 或 MAX:N（N 为正整数）。",
               f"{var}={value!r} is invalid: use ALL or MAX:N with N a positive integer.", source=e.source)]


def _chk_gloo_ifname(e, var, value):
    out = []
    items = value.split(",")
    if any(not i for i in items):
        out.append(_empty_item(var, e.source))
    if value.startswith("^") or any(i.startswith("=") for i in items):
        out.append(_f(var, "warning", "nccl-syntax",
                      f"{var}={value!r} 用了 ^ 或 = 前缀：这是 NCCL_SOCKET_IFNAME 的写法。PyTorch 文档里 GLOO_SOCKET_IFNAME "
                      f"只是逗号分隔的网卡名（例如 eth0,eth1）。",
                      f"{var}={value!r} uses ^ or = prefixes, which is NCCL_SOCKET_IFNAME syntax; PyTorch "
                      f"documents GLOO_SOCKET_IFNAME as plain comma-separated interface names (e.g. eth0,eth1).",
                      source=e.source))
    return out


def _chk_fr_alias(e, var, value):
    return [_f(var, "info", "alias-note",
               f"{var} 是 PyTorch 文档中的名字，ProcessGroupNCCL 仍会读取它；较新的 PyTorch 的 Flight Recorder 优先读取 "
               f"TORCH_FR_BUFFER_SIZE，并把 {var} 当作弃用别名（可能打印一次弃用警告）。无害，不需要改。",
               f"{var} is the name in the PyTorch docs and ProcessGroupNCCL still reads it; recent PyTorch's "
               f"Flight Recorder reads TORCH_FR_BUFFER_SIZE first and treats {var} as a deprecated alias (you "
               f"may see a one-time deprecation warning). Harmless; nothing to change.",
               source=PT_FLIGHT_RECORDER_HPP)]


_CHECKS = {
    "ifname": _chk_ifname, "hca": _chk_hca, "subsys": _chk_subsys, "levels": _chk_levels,
    "algo": lambda e, var, value: _chk_algo_proto(e, var, value, ALGORITHMS),
    "proto": lambda e, var, value: _chk_algo_proto(e, var, value, PROTOCOLS),
    "debug": _chk_debug, "debug_file": _chk_debug_file, "ib_timeout": _chk_ib_timeout,
    "gid_index": _chk_gid_index, "pow2": _chk_pow2, "net": _chk_net, "cidr": _chk_cidr,
    "host_port": _chk_host_port, "positive_number": _chk_positive_number, "psk": _chk_psk,
    "cta_policy": _chk_cta_policy, "netdevs": _chk_netdevs, "gloo_ifname": _chk_gloo_ifname,
    "fr_alias": _chk_fr_alias, "path_level": _chk_path_level,
}
# Checks that replace the generic per-type check instead of adding to it.
_REPLACES_TYPE_CHECK = {"algo", "proto", "subsys", "levels", "cta_policy", "netdevs", "psk",
                        "positive_number", "path_level", "debug"}


def _check_value(e: EnvVar, var: str, raw: str) -> list[Finding]:
    """Findings about the value of a known variable ``var`` (its entry is ``e``)."""
    out = []
    if raw == "" and not e.empty_ok:
        return [_f(var, "warning", "empty-value",
                   f"{var} 被设成了空字符串：有的组件当作没设置，有的会直接报错。不需要就删掉（unset）。",
                   f"{var} is set to an empty string: some components treat that as unset, others reject "
                   f"it. Unset it if you do not need it.", source=e.source)]
    value = raw.strip()
    if value != raw and not e.empty_ok:
        out.append(_f(var, "warning", "whitespace",
                      f"{var} 的值首尾有空白字符（{_shown(e, raw)}），很可能导致匹配不上，请去掉。",
                      f"{var}'s value has leading or trailing whitespace ({_shown(e, raw)}), which can keep "
                      f"it from matching; remove it.", source=e.source))
    if e.no_tilde and "~" in value:
        out.append(_f(var, "error", "invalid-value",
                      f"{var}={value!r}：NCCL 不会展开路径中的 ~，请写成绝对路径或相对路径。",
                      f"{var}={value!r}: NCCL does not expand ~ in this path; use an absolute or relative path.",
                      suggestion=value.replace("~", str(Path.home()), 1), source=e.source))
    if e.check not in _REPLACES_TYPE_CHECK and value != "":
        if e.type == "bool":
            out += _check_bool(e, var, value)
        elif e.type in ("int", "seconds"):
            out += _check_int(e, var, value)
        elif e.type == "enum":
            out += _check_choice(e, var, value)
        elif e.type == "list" and e.check is None and any(not i.strip() for i in value.split(",")):
            out.append(_empty_item(var, e.source))
    if e.check and not any(f.severity == "error" for f in out):
        out += _CHECKS[e.check](e, var, value)
    return out


# ======================================================================================= lint_env
def _relevant(name: str) -> bool:
    return name.upper().startswith(PREFIXES) or name.upper() in VARS or name.upper() in NOT_VARIABLES


def _check_name(name: str, value: str) -> list[Finding]:
    """Findings about one variable on its own: its name, status and value."""
    if name in BUILD_NAMES:
        return []
    if name.upper() in NOT_VARIABLES:
        zh, en = NOT_VARIABLES[name.upper()]
        return [_f(name, "error", "not-a-variable", zh, en, suggestion="init_process_group(timeout=...)",
                   source=NOT_VARIABLES_SOURCE)]
    if name not in VARS and name.upper() in VARS:
        right = name.upper()
        return [_f(name, "error", "wrong-case",
                   f"{name}：环境变量名区分大小写，读取的是 {right}，不是 {name}，所以这个设置不会生效。",
                   f"{name}: environment variable names are case-sensitive; what is read is {right}, not "
                   f"{name}, so this setting has no effect.", suggestion=right, source=VARS[right].source)]
    e = VARS.get(name)
    if e is None:
        fam_zh, fam_en = _family(name.upper())
        close = _suggest(name, VARS)
        if close:
            return [_f(name, "warning", "unknown-variable",
                       f"{name} 不在 {fam_zh} 文档列出的变量里，很可能根本没有组件读取它。你是不是想写 {' 或 '.join(close)}？",
                       f"{name} is not a documented {fam_en} variable, so most likely nothing reads it. Did you "
                       f"mean {' or '.join(close)}?", suggestion=close[0], source=VARS[close[0]].source)]
        return [_f(name, "info", "undocumented-variable",
                   f"{name} 不在本工具依据的 {fam_zh} 官方文档里：可能是未公开或只在某些版本存在的设置，也可能是拼写错误；它的值没有检查。",
                   f"{name} is not in the {fam_en} documentation this tool checks against: it may be an "
                   f"undocumented or version-specific setting, or a typo; its value was not checked.",
                   source=NCCL_ENV if name.startswith("NCCL_") else None)]

    out = []
    if e.status == "removed":
        return [_f(name, "error", "removed", f"{name}：{e.status_zh}", f"{name}: {e.status_en}",
                   suggestion=e.replacement, source=e.source)]
    if e.status == "renamed":
        if e.status_zh:
            zh, en = f"{name}：{e.status_zh}", f"{name}: {e.status_en}"
        else:  # PyTorch's renamed variables all behave the same way (c10d getCvar*)
            zh = (f"{name} 是 {e.replacement} 的旧名字。PyTorch 仍会读取它，但会打印弃用警告；两者都设置时以 "
                  f"{e.replacement} 为准。请改成 {e.replacement}。")
            en = (f"{name} is the old name of {e.replacement}. PyTorch still reads it but prints a "
                  f"deprecation warning; if both are set, {e.replacement} wins. Rename it to {e.replacement}.")
        out.append(_f(name, "warning", "renamed", zh, en, suggestion=e.replacement, source=e.source))
    elif e.status == "deprecated":
        out.append(_f(name, "warning", "deprecated", f"{name}：{e.status_zh}", f"{name}: {e.status_en}",
                      suggestion=e.replacement, source=e.source))
    # A renamed variable's value is parsed like its successor's.
    rules = VARS.get(e.replacement, e) if e.status == "renamed" and e.replacement else e
    if rules.type != e.type:
        rules = e
    out += _check_value(rules if rules is e else _with_name(rules, e), name, value)
    if e.debugging and e.status == "current":
        out.append(_f(name, "info", "debugging-variable",
                      f"{name} 属于 NCCL 文档里的 Debugging 类变量：做实验、排查问题时可以用，但官方建议问题解决后就删掉，"
                      f"不要留在生产脚本里（强行指定会妨碍 NCCL 自动选择最优设置，长期可能带来性能问题甚至故障）。",
                      f"{name} is one of NCCL's Debugging variables: fine for experiments or while debugging, "
                      f"but the docs advise removing it once the issue is solved rather than keeping it in "
                      f"production scripts (forcing it stops NCCL from choosing the best setting).",
                      source=e.source))
    return out


def _with_name(rules: EnvVar, old: EnvVar) -> EnvVar:
    # Use the successor's value rules but keep the old entry's identity in messages and sources.
    return EnvVar(**{**rules.__dict__, "name": old.name, "source": old.source, "debugging": False})


def _conflicts(env: dict[str, str]) -> list[Finding]:
    """Findings about combinations of variables."""
    out = []

    def val(name):
        v = env.get(name)
        return None if v is None else v.strip()

    def flag(name):
        return _truth(VARS[name], val(name))

    def num(name):
        return _as_int(VARS[name], val(name))

    # --- IB disabled, yet IB is configured or forced ---------------------------------------------
    if flag("NCCL_IB_DISABLE"):
        ib_set = sorted(n for n in env if n.startswith("NCCL_IB_") and n != "NCCL_IB_DISABLE" and n in VARS)
        if ib_set:
            out.append(_f("NCCL_IB_DISABLE", "warning", "conflict",
                          f"NCCL_IB_DISABLE=1 禁用了 IB/RoCE 传输，但同时设置了 {', '.join(ib_set)}：这些 IB 设置不会起作用。"
                          f"要么删掉它们，要么不要禁用 IB。",
                          f"NCCL_IB_DISABLE=1 disables the IB/RoCE transport, yet {', '.join(ib_set)} "
                          f"{'is' if len(ib_set) == 1 else 'are'} set: those IB settings have no effect. Remove "
                          f"them or do not disable IB.", source=NCCL_ENV))
        if (val("NCCL_NET") or "").lower() == "ib":
            out.append(_f("NCCL_NET", "warning", "conflict",
                          "NCCL_NET=IB 强制使用 IB 网络，而 NCCL_IB_DISABLE=1 又禁用了 IB，两者互相矛盾。",
                          "NCCL_NET=IB forces the IB network while NCCL_IB_DISABLE=1 disables it: the two "
                          "settings contradict each other.", source=NCCL_ENV))

    # --- P2P / SHM -------------------------------------------------------------------------------
    if flag("NCCL_P2P_DISABLE") and val("NCCL_P2P_LEVEL") is not None:
        out.append(_f("NCCL_P2P_LEVEL", "warning", "conflict",
                      "NCCL_P2P_DISABLE=1 已经完全禁用了 P2P，NCCL_P2P_LEVEL 不会再起作用；二者留一个即可。",
                      "NCCL_P2P_DISABLE=1 disables P2P entirely, so NCCL_P2P_LEVEL has no effect; keep one "
                      "of the two.", source=NCCL_ENV))
    if flag("NCCL_P2P_DISABLE") and flag("NCCL_SHM_DISABLE"):
        out.append(_f("NCCL_SHM_DISABLE", "info", "combination",
                      "P2P 和 SHM 都被禁用了：同一台机器上的 GPU 之间也只能走网络，通常会明显变慢。",
                      "Both P2P and SHM are disabled: even GPUs in the same machine must talk over the "
                      "network, which is typically much slower.", source=NCCL_ENV))

    # --- logging ---------------------------------------------------------------------------------
    debug = (val("NCCL_DEBUG") or "").upper()
    if val("NCCL_DEBUG_SUBSYS") is not None:
        if not debug:
            out.append(_f("NCCL_DEBUG_SUBSYS", "warning", "conflict",
                          "设置了 NCCL_DEBUG_SUBSYS 却没有设置 NCCL_DEBUG：子系统过滤的是 NCCL_DEBUG=INFO（或 TRACE）的输出，"
                          "不设 NCCL_DEBUG 就什么也看不到。请加上 NCCL_DEBUG=INFO。",
                          "NCCL_DEBUG_SUBSYS is set but NCCL_DEBUG is not: the subsystem filter applies to "
                          "NCCL_DEBUG=INFO (or TRACE) output, so nothing shows. Add NCCL_DEBUG=INFO.",
                          suggestion="NCCL_DEBUG=INFO", source=NCCL_LOGGING))
        elif debug in ("VERSION", "WARN", "ATTN"):
            out.append(_f("NCCL_DEBUG_SUBSYS", "info", "combination",
                          f"NCCL_DEBUG={debug} 时 NCCL_DEBUG_SUBSYS 没什么用：它过滤的是 INFO/TRACE 级别的输出。",
                          f"With NCCL_DEBUG={debug}, NCCL_DEBUG_SUBSYS does little: it filters INFO/TRACE output.",
                          source=NCCL_LOGGING))
    if val("NCCL_DEBUG_FILE") is not None and not debug:
        out.append(_f("NCCL_DEBUG_FILE", "info", "combination",
                      "设置了 NCCL_DEBUG_FILE 却没有设置 NCCL_DEBUG：没有日志可写，文件不会有内容。",
                      "NCCL_DEBUG_FILE is set without NCCL_DEBUG: there is no log to write.",
                      suggestion="NCCL_DEBUG=INFO", source=NCCL_ENV))

    # --- socket transport ------------------------------------------------------------------------
    threads, socks = num("NCCL_SOCKET_NTHREADS"), num("NCCL_NSOCKS_PERTHREAD")
    if threads and socks and threads * socks > 64:
        out.append(_f("NCCL_NSOCKS_PERTHREAD", "error", "conflict",
                      f"NCCL_SOCKET_NTHREADS × NCCL_NSOCKS_PERTHREAD = {threads} × {socks} = {threads * socks}，"
                      f"文档规定乘积不能超过 64。",
                      f"NCCL_SOCKET_NTHREADS * NCCL_NSOCKS_PERTHREAD = {threads} * {socks} = "
                      f"{threads * socks}; the docs say the product cannot exceed 64.", source=NCCL_ENV))

    # --- channels / CTAs -------------------------------------------------------------------------
    for lo_name, hi_name in (("NCCL_MIN_CTAS", "NCCL_MAX_CTAS"), ("NCCL_MIN_NCHANNELS", "NCCL_MAX_NCHANNELS")):
        lo, hi = num(lo_name), num(hi_name)
        if lo is not None and hi is not None and lo > hi:
            out.append(_f(lo_name, "warning", "conflict",
                          f"{lo_name}={lo} 大于 {hi_name}={hi}，最小值比最大值还大，二者互相矛盾。",
                          f"{lo_name}={lo} is larger than {hi_name}={hi}: the minimum exceeds the maximum.",
                          source=NCCL_ENV))
    for old, new, which_zh, which_en in (("NCCL_MAX_NCHANNELS", "NCCL_MAX_CTAS", "更小", "lower"),
                                         ("NCCL_MIN_NCHANNELS", "NCCL_MIN_CTAS", "更大", "higher")):
        if val(old) is not None and val(new) is not None:
            out.append(_f(old, "info", "combination",
                          f"{old} 和 {new} 同时设置了：NCCL 取更严格（{which_zh}）的那个。{old} 已弃用，只保留 {new} 即可。",
                          f"Both {old} and {new} are set: NCCL uses the more restrictive ({which_en}) value. "
                          f"{old} is deprecated; keep only {new}.", suggestion=new, source=NCCL_ENV))

    # --- old and new names of the same setting ---------------------------------------------------
    for e in VARS.values():
        if e.status != "renamed" or not e.replacement or val(e.name) is None or val(e.replacement) is None:
            continue
        old_v, new_v = val(e.name), val(e.replacement)
        same = old_v == new_v or (_truth(e, old_v) is not None and _truth(e, old_v) == _truth(e, new_v))
        if e.owner == "pytorch":
            winner_zh, winner_en = f"PyTorch 以 {e.replacement} 为准", f"PyTorch uses {e.replacement}"
        elif e.name in ("NCCL_MAX_NRINGS", "NCCL_MIN_NRINGS"):
            winner_zh, winner_en = f"NCCL 会忽略 {e.name}", f"NCCL ignores {e.name}"
        else:
            winner_zh, winner_en = f"请只保留 {e.replacement}", f"keep only {e.replacement}"
        if same:
            out.append(_f(e.name, "info", "duplicate",
                          f"{e.name} 和 {e.replacement} 设成了相同的值，删掉旧名字 {e.name} 即可。",
                          f"{e.name} and {e.replacement} have the same value; remove the old name {e.name}.",
                          suggestion=e.replacement, source=e.source))
        else:
            out.append(_f(e.name, "warning", "conflict",
                          f"旧名字 {e.name}={old_v!r} 和新名字 {e.replacement}={new_v!r} 同时设置且取值不同：{winner_zh}。"
                          f"请删掉旧名字，免得看配置的人被误导。",
                          f"The old name {e.name}={old_v!r} and the new name {e.replacement}={new_v!r} are both set "
                          f"with different values: {winner_en}. Remove the old name so the configuration is not "
                          f"misleading.", suggestion=e.replacement, source=e.source))
    fr_old, fr_new = val("TORCH_NCCL_TRACE_BUFFER_SIZE"), val("TORCH_FR_BUFFER_SIZE")
    if fr_old is not None and fr_new is not None and fr_old != fr_new:
        out.append(_f("TORCH_FR_BUFFER_SIZE", "warning", "conflict",
                      f"TORCH_NCCL_TRACE_BUFFER_SIZE={fr_old!r} 和 TORCH_FR_BUFFER_SIZE={fr_new!r} 取值不同：Flight Recorder "
                      f"用后者，ProcessGroupNCCL 用前者，两处设置会不一致。请设成相同的值。",
                      f"TORCH_NCCL_TRACE_BUFFER_SIZE={fr_old!r} and TORCH_FR_BUFFER_SIZE={fr_new!r} differ: the "
                      f"Flight Recorder uses the latter and ProcessGroupNCCL the former. Give them the same value.",
                      source=PT_FLIGHT_RECORDER_HPP))

    # --- PyTorch watchdog / flight recorder ------------------------------------------------------
    if flag("TORCH_NCCL_DUMP_ON_TIMEOUT"):
        size_name = "TORCH_NCCL_TRACE_BUFFER_SIZE" if val("TORCH_NCCL_TRACE_BUFFER_SIZE") is not None else \
            "TORCH_FR_BUFFER_SIZE"
        size = num(size_name)
        if val(size_name) is None:
            out.append(_f("TORCH_NCCL_DUMP_ON_TIMEOUT", "info", "combination",
                          "TORCH_NCCL_DUMP_ON_TIMEOUT 开启了，但没有设置 TORCH_NCCL_TRACE_BUFFER_SIZE。文档要求两者一起设置"
                          "（缓冲区大于 0），而它的默认值随 PyTorch 版本变化，建议显式设置，例如 2000。",
                          "TORCH_NCCL_DUMP_ON_TIMEOUT is on but TORCH_NCCL_TRACE_BUFFER_SIZE is not set. The docs "
                          "say it must be set together with a buffer size above 0, and the default changed "
                          "between PyTorch versions: set it explicitly, e.g. 2000.",
                          suggestion="TORCH_NCCL_TRACE_BUFFER_SIZE=2000", source=PT_NCCL_ENV))
        elif size == 0:
            out.append(_f("TORCH_NCCL_DUMP_ON_TIMEOUT", "warning", "conflict",
                          f"TORCH_NCCL_DUMP_ON_TIMEOUT 开启了，但 {size_name}=0 关掉了 flight recorder，超时时没有东西可落盘。"
                          f"请把它设为大于 0，例如 2000。",
                          f"TORCH_NCCL_DUMP_ON_TIMEOUT is on but {size_name}=0 disables the flight recorder, so "
                          f"there is nothing to dump. Set it above 0, e.g. 2000.",
                          suggestion=f"{size_name}=2000", source=VARS[size_name].source))
        if flag("TORCH_NCCL_ENABLE_MONITORING") is False:
            out.append(_f("TORCH_NCCL_ENABLE_MONITORING", "warning", "conflict",
                          "TORCH_NCCL_DUMP_ON_TIMEOUT 需要与 TORCH_NCCL_ENABLE_MONITORING=1 一起使用"
                          "（见 ProcessGroupNCCL.hpp 的说明），这里却把监控关掉了。",
                          "TORCH_NCCL_DUMP_ON_TIMEOUT must be set together with TORCH_NCCL_ENABLE_MONITORING=1 "
                          "(see ProcessGroupNCCL.hpp), but monitoring is turned off here.", source=PT_PGNCCL_HPP))
    if flag("TORCH_NCCL_DESYNC_DEBUG") and val("TORCH_NCCL_ASYNC_ERROR_HANDLING") == "0":
        out.append(_f("TORCH_NCCL_DESYNC_DEBUG", "warning", "conflict",
                      "TORCH_NCCL_DESYNC_DEBUG 需要配合 TORCH_NCCL_ASYNC_ERROR_HANDLING 使用（见 ProcessGroupNCCL.hpp），"
                      "而这里 TORCH_NCCL_ASYNC_ERROR_HANDLING=0 关掉了异步错误处理。",
                      "TORCH_NCCL_DESYNC_DEBUG must be set together with TORCH_NCCL_ASYNC_ERROR_HANDLING (see "
                      "ProcessGroupNCCL.hpp), but TORCH_NCCL_ASYNC_ERROR_HANDLING=0 turns it off.",
                      source=PT_PGNCCL_HPP))
    dist_debug = (val("TORCH_DISTRIBUTED_DEBUG") or "").upper()
    cpp_level = (val("TORCH_CPP_LOG_LEVEL") or "").upper()
    if dist_debug in ("INFO", "DETAIL") and cpp_level not in ("INFO", "0"):
        out.append(_f("TORCH_DISTRIBUTED_DEBUG", "info", "combination",
                      f"TORCH_DISTRIBUTED_DEBUG={dist_debug} 产生的调试日志要配合 TORCH_CPP_LOG_LEVEL=INFO 才能看到"
                      f"（DETAIL 的一致性检查不受影响）。",
                      f"The logs of TORCH_DISTRIBUTED_DEBUG={dist_debug} only show with TORCH_CPP_LOG_LEVEL=INFO "
                      f"(DETAIL's consistency checks run regardless).",
                      suggestion="TORCH_CPP_LOG_LEVEL=INFO", source=PT_DISTRIBUTED))

    # --- ranks -----------------------------------------------------------------------------------
    for r_name, w_name in (("RANK", "WORLD_SIZE"), ("LOCAL_RANK", "LOCAL_WORLD_SIZE")):
        r, w = num(r_name), num(w_name)
        if r is not None and w is not None and w >= 1 and r >= w:
            out.append(_f(r_name, "error", "conflict",
                          f"{r_name}={r} 必须小于 {w_name}={w}（rank 从 0 编号到 {w - 1}）。",
                          f"{r_name}={r} must be smaller than {w_name}={w} (ranks are numbered 0 to {w - 1}).",
                          source=VARS[r_name].source))
    return out


def lint_env(mapping: Mapping[str, str]) -> list[Finding]:
    """Check the NCCL / PyTorch-distributed / Gloo variables of ``mapping`` (e.g. ``os.environ``).

    Returns the findings, errors first. Variables of other families are ignored. A valid
    configuration such as ``{"NCCL_DEBUG": "INFO", "NCCL_SOCKET_IFNAME": "eth0",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}`` yields no error and no warning.
    """
    env = {str(k): str(v) for k, v in mapping.items() if _relevant(str(k))}
    findings = []
    for name in sorted(env):
        findings += _check_name(name, env[name])
    findings += _conflicts(env)
    # errors first, then warnings, then notes; stable within a severity
    return sorted(findings, key=lambda f: (_RANK[f.severity], f.var))


# ================================================================================ .env file parser
# The local zh/en catalogue of this module (i18n.py holds the course-wide one).
_MESSAGES = {
    "env_file_no_equals": {
        "en": "{path}, line {lineno}: expected KEY=VALUE (or export KEY=VALUE), got: {line}",
        "zh": "{path} 第 {lineno} 行：应为 KEY=VALUE（或 export KEY=VALUE），实际是：{line}",
    },
    "env_file_bad_name": {
        "en": "{path}, line {lineno}: {name!r} is not a valid variable name (letters, digits and _, not "
              "starting with a digit): {line}",
        "zh": "{path} 第 {lineno} 行：{name!r} 不是合法的变量名（只能用字母、数字和下划线，且不能以数字开头）：{line}",
    },
    "env_file_unterminated": {
        "en": "{path}, line {lineno}: the {quote} quote is never closed (values cannot span lines): {line}",
        "zh": "{path} 第 {lineno} 行：{quote} 引号没有闭合（值不能跨行）：{line}",
    },
    "env_file_trailing": {
        "en": "{path}, line {lineno}: unexpected text after the closing quote: {line}",
        "zh": "{path} 第 {lineno} 行：右引号后面还有多余的内容：{line}",
    },
    "env_file_unreadable": {
        "en": "Cannot read the env file {path}: {reason}",
        "zh": "无法读取 env 文件 {path}：{reason}",
    },
}


def _tr(key: str, lang: str | None = None, **fields) -> str:
    return _MESSAGES[key][lang or i18n.get_lang()].format(**fields)


class EnvFileError(i18n.LabError):
    """A malformed ``.env`` line (or an unreadable file): bilingual, learner's language first, like
    every ``LabError``; ``lineno`` and ``line`` say where."""

    def __init__(self, key: str, **fields):  # noqa: D107 - the catalogue is local (_MESSAGES)
        self.key = key
        self.fields = fields
        self.lineno = fields.get("lineno")
        self.line = fields.get("line")
        first = i18n.get_lang()
        second = "en" if first == "zh" else "zh"
        ValueError.__init__(self, f"{_tr(key, first, **fields)}\n{_tr(key, second, **fields)}")

    def message(self, lang: str | None = None) -> str:
        return _tr(self.key, lang, **self.fields)


_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_DQ_ESCAPES = {"n": "\n", "t": "\t", "\\": "\\", '"': '"', "$": "$", "`": "`"}


def _parse_value(rest: str, err) -> str:
    """The value part of one line: quoted ('...' literal, "..." with backslash escapes) or bare
    (an inline comment starts at a # preceded by whitespace)."""
    if rest[:1] in ("'", '"'):
        quote, out, i = rest[0], [], 1
        while i < len(rest):
            c = rest[i]
            if c == quote:
                tail = rest[i + 1:].strip()
                if tail and not tail.startswith("#"):
                    raise err("env_file_trailing")
                return "".join(out)
            if quote == '"' and c == "\\" and i + 1 < len(rest):
                nxt = rest[i + 1]
                out.append(_DQ_ESCAPES.get(nxt, "\\" + nxt))
                i += 2
                continue
            out.append(c)
            i += 1
        raise err("env_file_unterminated", quote=quote)
    m = re.search(r"\s#", rest)
    return (rest[:m.start()] if m else rest).strip()


def parse_env_file(path) -> dict[str, str]:
    """Read a ``.env`` file: ``KEY=VALUE`` or ``export KEY=VALUE`` lines, '...'/"..." quotes,
    ``#`` comments (whole-line, or after whitespace on a bare value), blank lines. A later
    assignment of the same key wins, as in a shell. Raises ``EnvFileError`` on a malformed line."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise EnvFileError("env_file_unreadable", path=str(path),
                           reason=exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)) from None
    result: dict[str, str] = {}
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue

        def err(key, _lineno=lineno, _line=line, **extra):
            return EnvFileError(key, path=str(path), lineno=_lineno, line=_line, **extra)

        body = line
        if re.match(r"export\s", body):
            body = body[len("export"):].lstrip()
        key, eq, rest = body.partition("=")
        key = key.strip()
        if not eq:
            raise err("env_file_no_equals")
        if not _NAME.fullmatch(key):
            raise err("env_file_bad_name", name=key)
        result[key] = _parse_value(rest.strip(), err)
    return result


# ========================================================================================= doctor
GIB = 1024 ** 3
_SHM_MIN = 1 * GIB           # NCCL's docs suggest --shm-size=1g for containers
_NOFILE_HINT = 32768         # NCCL's docs: a 144-rank job with 16 GIN contexts may need over 32K


def _cuda_available(torch) -> bool:
    # A CPU build, a missing driver or a broken one must never break the doctor.
    try:
        return bool(torch.cuda.is_available())
    except Exception:
        return False


def _torch_info() -> dict:
    info = {"version": None, "cuda_build": None, "cuda_available": False, "distributed": False,
            "nccl_available": False, "gloo_available": False, "nccl_version": None}
    try:
        import torch
    except Exception as exc:  # pragma: no cover - torch is a dependency
        info["error"] = repr(exc)
        return info
    info["version"] = torch.__version__
    info["cuda_build"] = getattr(torch.version, "cuda", None)
    info["cuda_available"] = _cuda_available(torch)
    try:
        import torch.distributed as dist

        info["distributed"] = bool(dist.is_available())
        if info["distributed"]:
            info["nccl_available"] = bool(dist.is_nccl_available())
            info["gloo_available"] = bool(dist.is_gloo_available())
    except Exception:
        pass
    if info["cuda_available"]:  # torch.cuda.nccl needs CUDA; never touch it on CPU machines
        try:
            v = torch.cuda.nccl.version()
            info["nccl_version"] = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
        except Exception:
            pass
    return info


def _gpu_info(cuda_available: bool) -> dict:
    info = {"count": 0, "devices": [], "nvidia_smi": shutil.which("nvidia-smi"), "topology": None}
    if cuda_available:
        try:
            import torch

            info["count"] = torch.cuda.device_count()
            for i in range(info["count"]):
                p = torch.cuda.get_device_properties(i)
                info["devices"].append({"index": i, "name": p.name,
                                        "memory_gib": round(p.total_memory / GIB, 1),
                                        "capability": f"{p.major}.{p.minor}"})
        except Exception as exc:
            info["error"] = repr(exc)
    if info["nvidia_smi"]:
        # The GPU/NIC connection matrix (NV#, PIX, PXB, PHB, SYS) NCCL's P2P/GDR levels refer to.
        try:
            r = subprocess.run([info["nvidia_smi"], "topo", "-m"], capture_output=True, text=True, timeout=20)
            info["topology"] = r.stdout.strip() if r.returncode == 0 else None
            if r.returncode != 0:
                info["topology_error"] = (r.stderr or r.stdout).strip()[:500]
        except (OSError, subprocess.SubprocessError) as exc:
            info["topology_error"] = repr(exc)
    return info


def _interface_kind(name: str, flags: str) -> str:
    if name == "lo" or "loopback" in flags:
        return "loopback"
    if name.startswith(("docker", "br-", "veth", "virbr", "cni", "flannel", "cali", "vxlan")):
        return "container"
    if name.startswith("ib"):
        return "infiniband"
    return "ethernet/other"


def _network_info() -> list[dict]:
    import socket

    import psutil

    try:
        addrs, stats = psutil.net_if_addrs(), psutil.net_if_stats()
    except Exception as exc:  # pragma: no cover - restricted sandboxes
        return [{"error": repr(exc)}]
    out = []
    for name in sorted(set(addrs) | set(stats)):
        st = stats.get(name)
        flags = getattr(st, "flags", "") or ""
        addresses = []
        for a in addrs.get(name, []):
            family = {socket.AF_INET: "ipv4", socket.AF_INET6: "ipv6"}.get(a.family)
            if family:
                addresses.append({"family": family, "address": a.address})
        kind = _interface_kind(name, flags)
        out.append({
            "name": name, "up": bool(st.isup) if st else None,
            "speed_mbps": (st.speed or None) if st else None, "mtu": st.mtu if st else None,
            "addresses": addresses, "kind": kind,
            # NCCL's docs: lo and docker* are not selected unless nothing else is available.
            "nccl_skips_by_default": name == "lo" or name.startswith("docker"),
        })
    return out


def _shm_info() -> dict | None:
    if not os.path.isdir("/dev/shm"):
        return None
    try:
        u = shutil.disk_usage("/dev/shm")
    except OSError:
        return None
    return {"path": "/dev/shm", "total_bytes": u.total, "free_bytes": u.free,
            "total_gib": round(u.total / GIB, 2), "free_gib": round(u.free / GIB, 2), "low": u.total < _SHM_MIN}


def _ulimits() -> dict:
    try:
        import resource
    except ImportError:  # pragma: no cover - Windows
        return {}

    def lim(which):
        soft, hard = resource.getrlimit(which)
        show = lambda x: "unlimited" if x == resource.RLIM_INFINITY else x  # noqa: E731
        return {"soft": show(soft), "hard": show(hard)}

    return {"memlock": lim(resource.RLIMIT_MEMLOCK), "nofile": lim(resource.RLIMIT_NOFILE),
            "stack": lim(resource.RLIMIT_STACK)}


def _ifname_matches(spec: str, name: str) -> bool:
    """Does NCCL_SOCKET_IFNAME ``spec`` select interface ``name`` (prefix, =exact, ^exclude)?
    The same parse as NCCL's: see :func:`nccl_list_selects`."""
    return nccl_list_selects(spec.strip(), name)


def nccl_list_selects(spec: str, name: str, port: int = -1) -> bool:
    """Does the NCCL device list ``spec`` (``NCCL_SOCKET_IFNAME``, ``NCCL_IB_HCA``) select device
    ``name`` (on ``port``; -1: any)? Exactly as NCCL parses it (``parseStringList`` and
    ``matchIfList`` in NCCL's src/misc/utils.cc, and their callers):

    * an optional leading ``^`` turns the list into an exclude list;
    * then an optional ``=`` makes *every* item an exact name (``=eth0,eth1``); an ``=`` in front
      of a later item is just a character of that item's name, so that item matches nothing;
    * items are comma-separated ``name[:port]``; without ``=`` a name is a prefix (``mlx5_1``
      also matches ``mlx5_10``); an item without a port matches every port.
    """
    exclude = spec.startswith("^")
    rest = spec[1:] if exclude else spec
    exact = rest.startswith("=")
    rest = rest[1:] if exact else rest
    items = []
    for raw in rest.split(","):
        prefix, colon, tail = raw.partition(":")
        if not prefix:
            continue
        m = re.match(r"\s*[+-]?\d+", tail) if colon else None
        items.append((prefix, int(m.group()) if m else (0 if colon else -1)))  # C's atoi: junk -> 0
    if not items:  # NCCL: an empty list matches everything
        hit = True
    else:
        hit = any((name == p if exact else name.startswith(p)) and (port == -1 or ip == -1 or ip == port)
                  for p, ip in items)
    return hit != exclude


def _rec(code, severity, zh, en, source=None) -> dict:
    return {"code": code, "severity": severity, "zh": zh, "en": en, "source": source}


def _recommend(r: dict, environ: Mapping[str, str]) -> list[dict]:
    recs = []
    t, g = r["torch"], r["gpus"]
    if not t["cuda_available"]:
        recs.append(_rec("no-gpu", "info",
                         "这台机器看不到 CUDA GPU：用不了 nccl 后端。CPU 上的分布式训练请用 gloo 后端。",
                         "No CUDA GPU is visible: the nccl backend cannot be used here. Use the gloo backend "
                         "for distributed CPU training.", PT_DISTRIBUTED))
    elif not t["nccl_available"]:
        recs.append(_rec("no-nccl", "warning",
                         "有 GPU，但这个 PyTorch 没有编译 NCCL 支持：GPU 训练用不了 nccl 后端，请安装带 CUDA 的 PyTorch。",
                         "GPUs are present but this PyTorch was built without NCCL: install a CUDA build of "
                         "PyTorch to use the nccl backend.", PT_DISTRIBUTED))
    if t["cuda_available"] and not g["nvidia_smi"]:
        recs.append(_rec("no-nvidia-smi", "info",
                         "找不到 nvidia-smi，无法查看 GPU 拓扑（nvidia-smi topo -m）。",
                         "nvidia-smi was not found, so the GPU topology (nvidia-smi topo -m) is unknown."))

    shm = r["shm"]
    if shm is None:
        recs.append(_rec("no-shm", "info", "没有 /dev/shm：NCCL 的共享内存传输依赖它（Linux 上才有）。",
                         "There is no /dev/shm: NCCL's shared-memory transport relies on it (Linux only).",
                         NCCL_RUNTIME_TROUBLESHOOTING))
    elif shm["low"]:
        recs.append(_rec("small-shm", "warning",
                         f"/dev/shm 只有 {shm['total_gib']} GiB：NCCL 在 /dev/shm 里创建共享内存段，空间不够时初始化会失败"
                         f"（日志里是 failed to extend /dev/shm/nccl-...）。Docker 默认给的共享内存很小，"
                         f"请加上 --shm-size=1g --ulimit memlock=-1（或更大）。",
                         f"/dev/shm has only {shm['total_gib']} GiB: NCCL creates shared-memory segments there and "
                         f"fails to initialize when it runs out (\"failed to extend /dev/shm/nccl-...\"). Docker's "
                         f"default is small: add --shm-size=1g --ulimit memlock=-1 (or more).",
                         NCCL_RUNTIME_TROUBLESHOOTING))

    lim = r["ulimits"]
    has_ib = os.path.isdir("/sys/class/infiniband") and bool(os.listdir("/sys/class/infiniband"))
    if lim and lim["memlock"]["soft"] != "unlimited" and (has_ib or t["cuda_available"]):
        recs.append(_rec("memlock", "warning" if has_ib else "info",
                         f"锁页内存上限（ulimit -l）是 {lim['memlock']['soft']} 字节：InfiniBand 注册锁页内存不够时会出现 "
                         f"ibv_reg_mr / ibv_create_qp 失败。官方建议在 /etc/security/limits.conf 里把 memlock 设为 unlimited"
                         f"（Docker 用 --ulimit memlock=-1）。",
                         f"The locked-memory limit (ulimit -l) is {lim['memlock']['soft']} bytes: InfiniBand fails "
                         f"with ibv_reg_mr / ibv_create_qp errors when it cannot pin enough memory. The docs "
                         f"recommend memlock unlimited in /etc/security/limits.conf (Docker: --ulimit memlock=-1).",
                         NCCL_NET_TROUBLESHOOTING))
    if lim and isinstance(lim["nofile"]["soft"], int) and lim["nofile"]["soft"] < _NOFILE_HINT:
        recs.append(_rec("nofile", "info",
                         f"每个进程最多能打开 {lim['nofile']['soft']} 个文件描述符（ulimit -n）。NCCL 规模大时会用很多文件描述符"
                         f"（文档举例：144 个 rank、16 个 GIN context 的作业每个进程需要 3.2 万个以上），大规模作业请调高。",
                         f"Each process may open {lim['nofile']['soft']} file descriptors (ulimit -n). NCCL uses many "
                         f"at scale (the docs' example: a 144-rank job with 16 GIN contexts needs over 32K per "
                         f"process); raise it for large jobs.", NCCL_RUNTIME_TROUBLESHOOTING))
    if lim and lim["stack"]["soft"] == "unlimited":
        recs.append(_rec("stack-unlimited", "warning",
                         "栈大小上限（ulimit -s）是 unlimited：由于 glibc 的特性，这反而会让 NCCL 后台线程的栈只有 2 MB，"
                         "官方见过因此崩溃。请改回 8192（ulimit -s 8192）。",
                         "The stack limit (ulimit -s) is unlimited: through a glibc quirk this shrinks NCCL's "
                         "background thread stacks to 2 MB, and crashes have been seen. Set it back to 8192 "
                         "(ulimit -s 8192).", NCCL_RUNTIME_TROUBLESHOOTING))

    nets = [n for n in r["network"] if "name" in n]
    up = [n for n in nets if n["up"]]
    usable = [n for n in up if n["kind"] not in ("loopback", "container")]
    if nets and not usable:
        recs.append(_rec("loopback-only", "warning",
                         "除了回环和容器网卡，没有处于 UP 状态的网卡：只能单机训练，多机通信无从谈起。",
                         "No interface other than loopback/container ones is up: single-machine jobs only, "
                         "multi-node communication is impossible.", NCCL_NET_TROUBLESHOOTING))
    nccl_if, gloo_if = environ.get("NCCL_SOCKET_IFNAME"), environ.get("GLOO_SOCKET_IFNAME")
    if len(usable) > 1 and not nccl_if:
        names = ", ".join(n["name"] for n in usable)
        recs.append(_rec("several-interfaces", "info",
                         f"有多块处于 UP 状态的网卡（{names}）。NCCL 会自动挑选，但 UP 却连不通其他节点的网卡可能导致初始化失败或卡住；"
                         f"多机训练时请用 NCCL_SOCKET_IFNAME（以及 GLOO_SOCKET_IFNAME）指定真正连着其他节点的那块。",
                         f"Several interfaces are up ({names}). NCCL picks one automatically, but an interface "
                         f"that is up yet cannot reach the other nodes can make initialization fail or hang; for "
                         f"multi-node jobs set NCCL_SOCKET_IFNAME (and GLOO_SOCKET_IFNAME) to the one that does.",
                         NCCL_NET_TROUBLESHOOTING))
    if any(n["name"].startswith("docker") for n in nets):
        recs.append(_rec("docker-bridge", "info",
                         "检测到 docker 网桥：NCCL 默认不会选 docker* 网卡（除非没有别的网卡），一般不用管。",
                         "A docker bridge is present: NCCL does not select docker* interfaces by default (unless "
                         "nothing else exists), so it usually needs no action.", NCCL_ENV))
    if nccl_if and nets and not any(_ifname_matches(nccl_if, n["name"]) for n in up):
        recs.append(_rec("ifname-no-match", "warning",
                         f"NCCL_SOCKET_IFNAME={nccl_if!r} 在本机匹配不到任何 UP 状态的网卡，NCCL 会找不到可用的网卡。",
                         f"NCCL_SOCKET_IFNAME={nccl_if!r} matches no interface that is up on this machine, so NCCL "
                         f"will find no usable interface.", NCCL_ENV))
    if gloo_if and nets:
        missing = [i for i in gloo_if.split(",") if i and i not in {n["name"] for n in nets}]
        if missing:
            recs.append(_rec("gloo-ifname-missing", "warning",
                             f"GLOO_SOCKET_IFNAME 里的 {', '.join(missing)} 在本机不存在。",
                             f"GLOO_SOCKET_IFNAME names {', '.join(missing)}, which do not exist on this machine.",
                             PT_DISTRIBUTED))
    bad = [f for f in r["env"]["findings"] if f["severity"] in ("error", "warning")]
    if bad:
        recs.append(_rec("env-findings", "warning",
                         f"当前环境变量里有 {len(bad)} 个问题（错误或警告），运行 dtrain-lab nccl lint 查看详情。",
                         f"The current environment has {len(bad)} problem(s) (errors or warnings); run "
                         f"dtrain-lab nccl lint for details."))
    return recs


def doctor(environ: Mapping[str, str] | None = None) -> dict:
    """Inspect this machine the way NCCL / torch.distributed will see it.

    Keys: ``torch`` (versions, CUDA/NCCL/Gloo availability, NCCL version), ``gpus`` (devices,
    ``nvidia-smi topo -m``), ``network`` (interfaces: up, speed, addresses, kind), ``shm``
    (/dev/shm size), ``ulimits`` (memlock, nofile, stack), ``env`` (the relevant variables and
    their lint findings) and ``recommendations`` (bilingual dicts: code, severity, zh, en, source).
    Safe on CPU-only machines: CUDA APIs are only touched when CUDA is available.
    """
    environ = os.environ if environ is None else environ
    t = _torch_info()
    env_vars = {k: ("<hidden>" if k in VARS and VARS[k].secret else v)
                for k, v in sorted(environ.items()) if _relevant(k)}
    report = {
        "python": sys.version.split()[0],
        "platform": sys.platform,
        "torch": t,
        "gpus": _gpu_info(t["cuda_available"]),
        "network": _network_info(),
        "shm": _shm_info(),
        "ulimits": _ulimits(),
        "env": {"vars": env_vars, "findings": [f.to_dict() for f in lint_env(environ)]},
    }
    report["recommendations"] = _recommend(report, environ)
    return report


_H = {  # headings of format_doctor
    "torch": ("PyTorch 与 NCCL", "PyTorch and NCCL"), "gpus": ("GPU", "GPUs"),
    "network": ("网卡", "Network interfaces"), "shm": ("共享内存 /dev/shm", "Shared memory /dev/shm"),
    "ulimits": ("资源限制（ulimit）", "Resource limits (ulimit)"),
    "env": ("相关环境变量", "Relevant environment variables"), "recs": ("建议", "Recommendations"),
    "none": ("（无）", "(none)"), "yes": ("是", "yes"), "no": ("否", "no"),
    "skip": ("NCCL 默认不选", "skipped by NCCL by default"),
}


def format_doctor(report: dict, lang: str | None = None) -> str:
    """``doctor()``'s report as text for a terminal, in ``lang`` (default: the learner's language)."""
    zh = (lang or i18n.get_lang()) == "zh"

    def h(key):
        return _H[key][0 if zh else 1]

    yn = lambda b: h("yes") if b else h("no")  # noqa: E731
    t, g = report["torch"], report["gpus"]
    lines = [f"== {h('torch')} ==",
             f"  torch {t['version']}  (CUDA build: {t['cuda_build'] or '-'}, "
             f"CUDA available: {yn(t['cuda_available'])})",
             f"  nccl backend: {yn(t['nccl_available'])}   gloo backend: {yn(t['gloo_available'])}   "
             f"NCCL version: {t['nccl_version'] or '-'}",
             f"== {h('gpus')} ==", f"  count: {g['count']}"]
    for d in g["devices"]:
        lines.append(f"  [{d['index']}] {d['name']}  {d['memory_gib']} GiB  sm_{d['capability'].replace('.', '')}")
    if g.get("topology"):
        lines += ["  nvidia-smi topo -m:"] + ["    " + x for x in g["topology"].splitlines()]
    lines.append(f"== {h('network')} ==")
    for n in report["network"]:
        if "name" not in n:
            continue
        addrs = ", ".join(a["address"] for a in n["addresses"]) or "-"
        speed = f"{n['speed_mbps']} Mb/s" if n["speed_mbps"] else "-"
        note = f"  ({h('skip')})" if n["nccl_skips_by_default"] else ""
        lines.append(f"  {n['name']:<12} {'UP' if n['up'] else 'down':<5} {n['kind']:<15} {speed:<11} {addrs}{note}")
    shm = report["shm"]
    lines.append(f"== {h('shm')} ==")
    lines.append(f"  {shm['total_gib']} GiB total, {shm['free_gib']} GiB free" if shm else f"  {h('none')}")
    lines.append(f"== {h('ulimits')} ==")
    for k, v in report["ulimits"].items():
        lines.append(f"  {k:<8} soft={v['soft']}  hard={v['hard']}")
    lines.append(f"== {h('env')} ==")
    lines += [f"  {k}={v}" for k, v in report["env"]["vars"].items()] or [f"  {h('none')}"]
    lines.append(f"== {h('recs')} ==")
    if not report["recommendations"]:
        lines.append(f"  {h('none')}")
    for rec in report["recommendations"]:
        lines.append(f"  {_ICON[rec['severity']]} {rec['zh'] if zh else rec['en']}")
        if rec.get("source"):
            lines.append(f"      {rec['source']}")
    return "\n".join(lines)


# ============================================================================================ CLI
_ICON = {"error": "✗", "warning": "!", "info": "·"}
_CLI = {
    "lint_desc": ("检查 NCCL / PyTorch distributed / Gloo 相关的环境变量",
                  "check NCCL / PyTorch-distributed / Gloo environment variables"),
    "doctor_desc": ("检查本机的 GPU、网卡、/dev/shm 和 ulimit", "inspect GPUs, network, /dev/shm and ulimits"),
    "file": ("检查这个 .env 文件，而不是当前环境", "check this .env file instead of the current environment"),
    "json": ("输出 JSON", "print JSON"), "lang": ("提示语言", "message language"),
    "strict": ("有警告也返回 1", "exit 1 on warnings too"),
    "clean": ("没有发现问题。", "No problems found."),
    "summary": ("{error} 个错误，{warning} 个警告，{info} 条提示（检查了 {n} 个相关变量）",
                "{error} error(s), {warning} warning(s), {info} note(s) ({n} relevant variable(s) checked)"),
    "none_relevant": ("没有找到 NCCL / PyTorch distributed / Gloo 相关的环境变量。",
                      "No NCCL / PyTorch-distributed / Gloo variables found."),
}


def _c(key: str, zh: bool) -> str:
    return _CLI[key][0 if zh else 1]


def _parser(prog: str, desc: str, zh: bool) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=prog, description=_c(desc, zh))
    ap.add_argument("--json", action="store_true", help=_c("json", zh))
    ap.add_argument("--lang", choices=i18n.LANGS, help=_c("lang", zh))
    return ap


def _parse(ap: argparse.ArgumentParser, argv):
    try:
        return ap.parse_args(argv), None
    except SystemExit as exc:  # --help, or a usage error argparse already printed
        return None, (exc.code if isinstance(exc.code, int) else 2)


def main_lint(argv: list[str] | None = None) -> int:
    """``dtrain-lab nccl lint [--file F] [--json] [--lang zh|en] [--strict]``; ``argv`` is what
    follows ``nccl lint`` on the command line.

    Exit status: 0 clean (or only warnings/notes), 1 at least one error (or warning, with
    ``--strict``), 2 when the file cannot be read or parsed."""
    zh = i18n.get_lang() == "zh"
    ap = _parser("dtrain-lab nccl lint", "lint_desc", zh)
    ap.add_argument("--file", "-f", help=_c("file", zh))
    ap.add_argument("--strict", action="store_true", help=_c("strict", zh))
    args, code = _parse(ap, argv)
    if args is None:
        return code
    lang = args.lang or i18n.get_lang()
    zh = lang == "zh"
    source = args.file or "environment"
    try:
        mapping = parse_env_file(args.file) if args.file else dict(os.environ)
    except EnvFileError as exc:
        if args.json:
            print(json.dumps({"source": source, "ok": False,
                              "error": {"code": exc.key, "line": exc.lineno, "message_zh": exc.message("zh"),
                                        "message_en": exc.message("en")}}, ensure_ascii=False, indent=2))
        else:
            print(exc.message(lang), file=sys.stderr)
        return 2
    findings = lint_env(mapping)
    counts = {s: sum(f.severity == s for f in findings) for s in SEVERITIES}
    checked = sorted(k for k in mapping if _relevant(k))
    failed = counts["error"] > 0 or (args.strict and counts["warning"] > 0)
    if args.json:
        # Names only, never values: the environment can hold secrets (NCCL_PSK, tokens).
        print(json.dumps({"source": source, "ok": not failed, "checked": checked, "summary": counts,
                          "findings": [f.to_dict() for f in findings]}, ensure_ascii=False, indent=2))
    else:
        if not checked:
            print(_c("none_relevant", zh))
        for f in findings:
            tag = {"error": "错误", "warning": "警告", "info": "提示"}[f.severity] if zh else f.severity
            print(f"{_ICON[f.severity]} [{tag}] {f.message(lang)}")
            if f.source:
                print(f"    {f.source}")
        if checked and not findings:
            print(_c("clean", zh))
        print(_c("summary", zh).format(n=len(checked), **counts))
    return 1 if failed else 0


def main_doctor(argv: list[str] | None = None) -> int:
    """``dtrain-lab nccl doctor [--json] [--lang zh|en]``; ``argv`` is what follows ``nccl doctor``.
    Exits 0: the doctor reports, it does not judge."""
    zh = i18n.get_lang() == "zh"
    args, code = _parse(_parser("dtrain-lab nccl doctor", "doctor_desc", zh), argv)
    if args is None:
        return code
    report = doctor()
    if args.json:
        print(json.dumps(report, ensure_ascii=False, indent=2, default=str))
    else:
        print(format_doctor(report, args.lang or i18n.get_lang()))
    return 0


# ======================================================================= interface selection (lesson 11)
def socket_ifname_selects(spec: str, names) -> list[str]:
    """The interfaces among ``names`` that ``NCCL_SOCKET_IFNAME=spec`` lets NCCL use.

    NCCL's rule (env.html, NCCL_SOCKET_IFNAME): a comma-separated list of name *prefixes*
    (``eth`` selects eth0, eth1, ...); a leading ``^`` turns it into an exclude list; ``=`` at the
    start of the list (after ``^`` if any) makes every item an exact name (``=eth0,eth1``,
    ``^=docker0``); the matching itself is :func:`nccl_list_selects`. Only this filter is
    modelled: what NCCL prefers among the survivors when the variable is unset (ib* first, lo and
    docker* only if nothing else exists) is not.

        >>> socket_ifname_selects("eth", ["eth0", "eth10", "ens1", "lo"])
        ['eth0', 'eth10']
        >>> socket_ifname_selects("=eth1", ["eth1", "eth10"])
        ['eth1']
    """
    return [n for n in names if nccl_list_selects(spec, n)]
