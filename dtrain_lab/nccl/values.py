"""Checks of one variable's value: its type (bool, int, enum, list) and the richer syntaxes some
variables have (interface and HCA lists, algorithm lists, plugins, ...); :func:`check_value` runs
the ones an entry of the table asks for (its ``type`` and ``check``)."""
from __future__ import annotations

import ipaddress
import re
from pathlib import Path

from dtrain_lab.nccl.findings import PT_FALSE, PT_TRUE, Finding, finding, parse_int, shown, suggest, uses_cvar_bool
from dtrain_lab.nccl.vars import ALGORITHMS, NCCL_NET_TROUBLESHOOTING, PROTOCOLS, PT_C10D_UTILS_HPP, SUBSYSTEMS, EnvVar


def _check_bool(e: EnvVar, var: str, value: str) -> list[Finding]:
    if uses_cvar_bool(e):
        if value.lower() in PT_TRUE + PT_FALSE:
            return []
        return [finding(var, "error", "invalid-value", "nccl_bad_pytorch_bool", var=var, value=value,
                        suggestion="1", source=PT_C10D_UTILS_HPP)]
    if value in ("0", "1"):
        return []
    hint = "1" if value.lower() in PT_TRUE + ("on", "enable", "enabled") else \
        "0" if value.lower() in PT_FALSE + ("off", "disable", "disabled") else None
    key = {"1": "nccl_bad_bool_write_1", "0": "nccl_bad_bool_write_0", None: "nccl_bad_bool"}[hint]
    return [finding(var, "error", "invalid-value", key, var=var, value=shown(e, value), suggestion=hint,
                    source=e.source)]


def _check_int(e: EnvVar, var: str, value: str) -> list[Finding]:
    n = parse_int(e, value)
    if n is None:
        return [finding(var, "error", "invalid-value", "nccl_not_an_integer", var=var, value=shown(e, value),
                        source=e.source)]
    if e.check == "ib_timeout":
        return []  # its range is checked by _chk_ib_timeout, which knows what 0 and >= 32 mean (infinite)
    if (e.lo is None or n >= e.lo) and (e.hi is None or n <= e.hi):
        return []
    if e.hi is None:
        return [finding(var, "error", "invalid-value", "nccl_below_minimum", var=var, n=n, lo=e.lo, source=e.source)]
    if e.lo is None:
        return [finding(var, "error", "invalid-value", "nccl_above_maximum", var=var, n=n, hi=e.hi, source=e.source)]
    return [finding(var, "error", "invalid-value", "nccl_out_of_range", var=var, n=n, lo=e.lo, hi=e.hi,
                    source=e.source)]


_LEGACY_LEVEL_NAME = {"0": "LOC", "1": "PIX", "2": "PXB", "3": "PHB", "4": "SYS"}


def _deprecated_value(e: EnvVar, var: str, value: str) -> Finding:
    if e.check == "path_level":
        return finding(var, "warning", "deprecated-value", "nccl_legacy_level", var=var, value=value,
                       suggestion=_LEGACY_LEVEL_NAME.get(value, "SYS"), source=e.source)
    if var == "NCCL_LAUNCH_MODE":
        return finding(var, "warning", "deprecated-value", "nccl_launch_mode_group", var=var,
                       suggestion="PARALLEL", source=e.source)
    return finding(var, "warning", "deprecated-value", "nccl_deprecated_value", var=var, value=value, source=e.source)


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
        return [finding(var, "warning", "spelling", "nccl_value_spelling", var=var, value=value, canon=canon,
                        suggestion=canon, source=e.source)]
    close = suggest(value.upper(), by_upper, cutoff=0.6)
    allowed = ", ".join(e.choices)
    if close:
        return [finding(var, "error", "invalid-value", "nccl_bad_choice_did_you_mean", var=var,
                        value=shown(e, value), allowed=allowed, meant=by_upper[close[0]],
                        suggestion=by_upper[close[0]], source=e.source)]
    return [finding(var, "error", "invalid-value", "nccl_bad_choice", var=var, value=shown(e, value),
                    allowed=allowed, source=e.source)]


def _split_items(value: str) -> tuple[bool, list[str]]:
    """NCCL's list syntax: an optional leading ^ (exclude list), then comma-separated items."""
    exclude = value.startswith("^")
    return exclude, (value[1:] if exclude else value).split(",")


def _empty_item(var: str, source: str) -> Finding:
    return finding(var, "error", "invalid-value", "nccl_empty_item", var=var, source=source)


def _chk_ifname(e: EnvVar, var: str, value: str) -> list[Finding]:
    out = []
    exclude, items = _split_items(value)
    for item in items:
        name = item[1:] if item.startswith("=") else item
        if not name:
            out.append(_empty_item(var, e.source))
        elif "^" in name:
            out.append(finding(var, "warning", "invalid-value", "nccl_caret_not_first", var=var, value=value,
                               source=e.source))
        elif name == "lo" and not exclude and var == "NCCL_SOCKET_IFNAME":
            out.append(finding(var, "info", "loopback", "nccl_ifname_loopback", var=var, source=e.source))
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
            out.append(finding(var, "error", "invalid-value", "nccl_hca_malformed", var=var, item=item,
                               source=e.source))
            continue
        for part in fields[1:]:
            if part and not re.fullmatch(r"-?\d+", part):
                out.append(finding(var, "error", "invalid-value", "nccl_hca_not_a_number", var=var, item=item,
                                   part=part, source=e.source))
    if not exact and any(re.search(r"\d$", i.split(":")[0]) for i in items if i):
        out.append(finding(var, "info", "prefix-match", "nccl_hca_prefix_match", var=var, value=value,
                           exact=value.lstrip("^"), source=e.source))
    return out


def _chk_tokens(e: EnvVar, var: str, value: str, vocabulary, *, unknown_severity: str) -> list[Finding]:
    """A comma-separated list of words taken from ``vocabulary`` (optionally ^-prefixed)."""
    out = []
    _, items = _split_items(value)
    by_upper = {w.upper(): w for w in vocabulary}
    names = ", ".join(vocabulary)
    for item in items:
        word = item.lstrip("^").strip()
        if not word:
            out.append(_empty_item(var, e.source))
        elif word.upper() not in by_upper:
            close = suggest(word.upper(), by_upper, cutoff=0.6)
            if close:
                out.append(finding(var, unknown_severity, "invalid-value", "nccl_unknown_token_did_you_mean",
                                   var=var, word=word, names=names, meant=by_upper[close[0]],
                                   suggestion=by_upper[close[0]], source=e.source))
            else:
                out.append(finding(var, unknown_severity, "invalid-value", "nccl_unknown_token", var=var,
                                   word=word, names=names, source=e.source))
        elif word != by_upper[word.upper()] and not e.case_insensitive:
            out.append(finding(var, "warning", "spelling", "nccl_token_spelling", var=var, word=word,
                               canon=by_upper[word.upper()], suggestion=by_upper[word.upper()], source=e.source))
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
    names = ", ".join(vocabulary)
    for entry in entries:
        func, _, tokens = entry.rpartition(":")
        if ":" in entry and not re.fullmatch(r"[A-Za-z]+", func):
            out.append(finding(var, "error", "invalid-value", "nccl_algo_malformed", var=var, entry=entry,
                               source=e.source))
            continue
        for item in (tokens[1:] if tokens.startswith("^") else tokens).split(","):
            word = item.strip()
            if not word:
                out.append(_empty_item(var, e.source))
            elif word.lower() in {d.lower() for d in e.deprecated_choices}:
                out.append(finding(var, "warning", "deprecated-value", "nccl_collnet_old", var=var, word=word,
                                   suggestion="CollnetDirect", source=e.source))
            elif word.lower() not in {w.lower() for w in vocabulary}:
                close = suggest(word.lower(), [w.lower() for w in vocabulary], cutoff=0.6)
                canon = next((w for w in vocabulary if close and w.lower() == close[0]), None)
                key = "nccl_bad_algo_did_you_mean" if canon else "nccl_bad_algo"
                out.append(finding(var, "error", "invalid-value", key, var=var, word=word, names=names,
                                   meant=canon, suggestion=canon, source=e.source))
            elif var == "NCCL_PROTO" and word.lower() == "ll128" and not tokens.startswith("^"):
                out.append(finding(var, "warning", "risky-value", "nccl_proto_ll128", var=var, source=e.source))
    if per_function:
        out.append(finding(var, "info", "version-note", "nccl_algo_per_function", var=var, source=e.source))
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
        return [finding(var, "warning", "undocumented-value", "nccl_debug_abort", suggestion="WARN", source=e.source)]
    out = _check_choice(e, var, value)
    if out:
        return out
    if value == "ATTN":
        return [finding(var, "info", "version-note", "nccl_debug_attn", source=e.source)]
    return []


def _chk_debug_file(e, var, value):
    if value in ("/dev/stdout", "/dev/stderr") or "%p" in value or "%h" in value:
        return []
    return [finding(var, "info", "shared-log-file", "nccl_debug_file_shared", var=var, value=value,
                    suggestion="nccl.%h.%p.log", source=e.source)]


def _chk_ib_timeout(e, var, value):
    # The NCCL docs (env.html, NCCL_IB_TIMEOUT): "Values can be 1-31. Note: Setting a value of 0 or >= 32
    # will result in an infinite timeout value." So 0 and >= 32 are accepted, and wait forever.
    n = parse_int(e, value)
    if n is None:
        return []  # already reported by _check_int
    if n < 0:
        return [finding(var, "error", "invalid-value", "nccl_ib_timeout_negative", var=var, n=n, source=e.source)]
    if n == 0 or n >= 32:
        return [finding(var, "warning", "infinite-timeout", "nccl_ib_timeout_infinite", var=var, n=n,
                        suggestion="20", source=e.source)]
    return []


def _chk_gid_index(e, var, value):
    return [finding(var, "info", "version-note", "nccl_gid_index_auto", var=var, source=NCCL_NET_TROUBLESHOOTING)]


def _chk_pow2(e, var, value):
    n = parse_int(e, value)
    if n is None or n <= 0 or n & (n - 1) == 0:
        return []
    return [finding(var, "info", "not-power-of-2", "nccl_not_power_of_2", var=var, n=n, source=e.source)]


def _chk_net(e, var, value):
    if value.lower() in ("ib", "socket", "networkdirect"):
        return []
    return [finding(var, "info", "plugin-name", "nccl_net_plugin_name", var=var, value=value, source=e.source)]


def _chk_plugin(e, var, value):
    """NCCL_*_PLUGIN: NCCL dlopen()s the library it names into every rank. A path loads that exact
    file; a bare suffix loads libnccl-<kind>-<suffix>.so from the library search path."""
    items = [i.strip() for i in value.split(",")] if e.type == "list" else [value.strip()]
    paths = [i for i in items if "/" in i]
    if paths:
        return [finding(var, "warning", "loads-code", "nccl_plugin_path", var=var, path=paths[0], source=e.source)]
    return []


def _chk_cidr(e, var, value):
    try:
        ipaddress.ip_network(value, strict=False)
        return []
    except ValueError:
        return [finding(var, "error", "invalid-value", "nccl_bad_cidr", var=var, value=value, source=e.source)]


def _chk_host_port(e, var, value):
    m = re.fullmatch(r"(\[[0-9A-Fa-f:.]+\]|[^:\[\]]+):(\d+)", value)
    if m and 1 <= int(m.group(2)) <= 65535:
        return []
    return [finding(var, "error", "invalid-value", "nccl_bad_host_port", var=var, value=value, source=e.source)]


def _chk_positive_number(e, var, value):
    try:
        x = float(value)
    except ValueError:
        return [finding(var, "error", "invalid-value", "nccl_not_positive_number", var=var, value=value,
                        source=e.source)]
    if x <= 0:
        return [finding(var, "warning", "ignored-value", "nccl_nonpositive_ignored", var=var, value=value,
                        source=e.source)]
    return []


def _chk_psk(e, var, value):
    if value == "" or len(value) >= 32:
        return []
    return [finding(var, "error", "invalid-value", "nccl_psk_too_short", var=var, source=e.source)]


def _chk_cta_policy(e, var, value):
    if value in ("0", "1", "2"):
        new = {"0": "DEFAULT", "1": "EFFICIENCY", "2": "ZERO"}[value]
        return [finding(var, "info", "deprecated-value", "nccl_cta_policy_legacy", var=var, value=value,
                        suggestion=new, source=e.source)]
    if all(p in ("DEFAULT", "EFFICIENCY", "ZERO") for p in value.split("|")):
        return []
    return [finding(var, "error", "invalid-value", "nccl_bad_cta_policy", var=var, value=value, source=e.source)]


def _chk_netdevs(e, var, value):
    if value in ("AUTO", "ALL") or re.fullmatch(r"MAX:[1-9]\d*", value):
        return []
    return [finding(var, "error", "invalid-value", "nccl_bad_netdevs", var=var, value=value, source=e.source)]


def _chk_gloo_ifname(e, var, value):
    out = []
    items = value.split(",")
    if any(not i for i in items):
        out.append(_empty_item(var, e.source))
    if value.startswith("^") or any(i.startswith("=") for i in items):
        out.append(finding(var, "warning", "nccl-syntax", "nccl_gloo_ifname_syntax", var=var, value=value,
                           source=e.source))
    return out


def _chk_fr_alias(e, var, value):
    return [finding(var, "info", "alias-note", "nccl_fr_alias", var=var, source=e.source)]


CHECKS = {
    "ifname": _chk_ifname, "hca": _chk_hca, "subsys": _chk_subsys, "levels": _chk_levels,
    "algo": lambda e, var, value: _chk_algo_proto(e, var, value, ALGORITHMS),
    "proto": lambda e, var, value: _chk_algo_proto(e, var, value, PROTOCOLS),
    "debug": _chk_debug, "debug_file": _chk_debug_file, "ib_timeout": _chk_ib_timeout,
    "gid_index": _chk_gid_index, "pow2": _chk_pow2, "net": _chk_net, "plugin": _chk_plugin, "cidr": _chk_cidr,
    "host_port": _chk_host_port, "positive_number": _chk_positive_number, "psk": _chk_psk,
    "cta_policy": _chk_cta_policy, "netdevs": _chk_netdevs, "gloo_ifname": _chk_gloo_ifname,
    "fr_alias": _chk_fr_alias, "path_level": _chk_path_level,
}
# Checks that replace the generic per-type check instead of adding to it.
_REPLACES_TYPE_CHECK = {"algo", "proto", "subsys", "levels", "cta_policy", "netdevs", "psk",
                        "positive_number", "path_level", "debug"}


def check_value(e: EnvVar, var: str, raw: str) -> list[Finding]:
    """Findings about the value of a known variable ``var`` (its entry is ``e``)."""
    out = []
    if raw == "" and not e.empty_ok:
        return [finding(var, "warning", "empty-value", "nccl_empty_value", var=var, source=e.source)]
    value = raw.strip()
    if value != raw and not e.empty_ok:
        out.append(finding(var, "warning", "whitespace", "nccl_value_whitespace", var=var, value=shown(e, raw),
                           source=e.source))
    if e.no_tilde and "~" in value:
        out.append(finding(var, "error", "invalid-value", "nccl_tilde_in_path", var=var, value=value,
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
        out += CHECKS[e.check](e, var, value)
    return out
