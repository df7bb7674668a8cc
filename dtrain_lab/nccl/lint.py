"""The linter: NCCL / PyTorch-distributed / Gloo variables checked against the table in ``vars.toml``.

* :func:`lint_env` checks a mapping (``os.environ``, or what a ``.env`` file sets): unknown names
  with a did-you-mean, names nothing reads (``NCCL_TIMEOUT``, ``TORCH_DISTRIBUTED_TIMEOUT``),
  renamed / deprecated / removed variables, invalid values and contradictory combinations.
  Variables of other families (PATH, HOME, ...) are not looked at.
* :func:`lint_env_file` reads a ``.env`` file as ``docker run --env-file`` does and lints what the
  container would see, plus what only a file can get wrong: quotes and ``#`` kept in values, names
  without a value, names no shell could set, and variables of any family that load code or change
  where programs and libraries are found (``LD_PRELOAD``, ``PYTHONPATH``, ``PATH``, ``BASH_ENV``...).

Every finding is bilingual (a catalogue key, ``dtrain_lab/nccl/messages.toml``) and, where it rests
on a document, carries the URL of that document.
"""
from __future__ import annotations

import re
from collections.abc import Mapping

from dtrain_lab.nccl.conflicts import conflicts
from dtrain_lab.nccl.envfile import EnvFile, read_env_file
from dtrain_lab.nccl.findings import SEVERITY_RANK, Finding, finding, suggest
from dtrain_lab.nccl.values import check_value
from dtrain_lab.nccl.vars import (BUILD_NAMES, DANGEROUS, DOCKER_ENV_FILE, NCCL_ENV, NOT_VARIABLES, PREFIXES, VARS,
                                  EnvVar)

# The catalogue keys the table (vars.toml) names, written out so that a reader (and the catalogue's
# "every key is used" test) can find them; tests/test_nccl.py checks that the two lists agree.
STATUS_KEYS = ("nccl_status_nccl_max_nchannels", "nccl_status_nccl_min_nchannels", "nccl_status_nccl_max_nrings",
               "nccl_status_nccl_min_nrings", "nccl_status_nccl_checks_disable", "nccl_status_nccl_check_pointers",
               "nccl_status_nccl_ib_cuda_support", "nccl_status_nccl_ib_gdr_level",
               "nccl_status_nccl_single_ring_threshold", "nccl_status_nccl_ll_threshold",
               "nccl_status_nccl_tree_threshold", "nccl_status_torch_nccl_trace_cpp_stack")
NOT_VARIABLE_KEYS = ("nccl_not_var_nccl_timeout", "nccl_not_var_torch_nccl_timeout",
                     "nccl_not_var_torch_distributed_timeout")
DANGER_KEYS = ("nccl_danger_ld_preload", "nccl_danger_ld_audit", "nccl_danger_ld_library_path",
               "nccl_danger_pythonpath", "nccl_danger_pythonhome", "nccl_danger_pythonstartup", "nccl_danger_path",
               "nccl_danger_bash_env", "nccl_danger_env")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def relevant(name: str) -> bool:
    """Is ``name`` a variable of the NCCL / PyTorch-distributed / Gloo families (or one the table knows)?"""
    return name.upper().startswith(PREFIXES) or name.upper() in VARS or name.upper() in NOT_VARIABLES


def _family(name: str) -> str:
    """Whose documentation a variable name belongs to (a proper name: the same in both languages)."""
    return "NCCL" if name.startswith("NCCL_") else "Gloo" if name.startswith("GLOO_") else "PyTorch"


def _unknown(name: str) -> list[Finding]:
    close = suggest(name, VARS)
    family = _family(name.upper())
    if close:
        return [finding(name, "warning", "unknown-variable", "nccl_unknown_variable", name=name, family=family,
                        meant=" / ".join(close), suggestion=close[0], source=VARS[close[0]].source)]
    return [finding(name, "info", "undocumented-variable", "nccl_undocumented_variable", name=name, family=family,
                    source=NCCL_ENV if name.startswith("NCCL_") else None)]


def _status(name: str, e: EnvVar) -> list[Finding]:
    if e.status == "removed":
        return [finding(name, "error", "removed", e.status_key, name=name, suggestion=e.replacement, source=e.source)]
    if e.status == "renamed":
        # PyTorch's renamed variables all behave the same way (c10d getCvar*): one message for all
        key = e.status_key or "nccl_renamed_pytorch"
        return [finding(name, "warning", "renamed", key, name=name, new=e.replacement, suggestion=e.replacement,
                        source=e.source)]
    if e.status == "deprecated":
        return [finding(name, "warning", "deprecated", e.status_key, name=name, suggestion=e.replacement,
                        source=e.source)]
    return []


def check_name(name: str, value: str) -> list[Finding]:
    """Findings about one variable on its own: its name, status and value."""
    if name in BUILD_NAMES:
        return []
    if name.upper() in NOT_VARIABLES:
        p = NOT_VARIABLES[name.upper()]
        return [finding(name, "error", "not-a-variable", p.key, name=name, suggestion="init_process_group(timeout=...)",
                        source=p.source)]
    if name not in VARS and name.upper() in VARS:
        right = name.upper()
        return [finding(name, "error", "wrong-case", "nccl_wrong_case", name=name, right=right, suggestion=right,
                        source=VARS[right].source)]
    e = VARS.get(name)
    if e is None:
        return _unknown(name)
    out = _status(name, e)
    if e.status == "removed":
        return out
    # A renamed variable's value is parsed like its successor's.
    rules = VARS.get(e.replacement, e) if e.status == "renamed" and e.replacement else e
    if rules.type != e.type or rules is e:
        rules = e
    else:  # the successor's value rules, the old entry's identity in messages and sources
        rules = EnvVar(**{**rules.__dict__, "name": e.name, "source": e.source, "debugging": False})
    out += check_value(rules, name, value)
    if e.debugging and e.status == "current":
        out.append(finding(name, "info", "debugging-variable", "nccl_debugging_variable", name=name, source=e.source))
    return out


def _sorted(findings: list[Finding]) -> list[Finding]:
    # errors first, then warnings, then notes; stable within a severity
    return sorted(findings, key=lambda f: (SEVERITY_RANK[f.severity], f.var))


def lint_env(mapping: Mapping[str, str]) -> list[Finding]:
    """Check the NCCL / PyTorch-distributed / Gloo variables of ``mapping`` (e.g. ``os.environ``).

    Returns the findings, errors first. Variables of other families are ignored. A valid
    configuration such as ``{"NCCL_DEBUG": "INFO", "NCCL_SOCKET_IFNAME": "eth0",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}`` yields no error and no warning.
    """
    env = {str(k): str(v) for k, v in mapping.items() if relevant(str(k))}
    findings = []
    for name in sorted(env):
        findings += check_name(name, env[name])
    return _sorted(findings + conflicts(env))


def _file_only(parsed: EnvFile) -> list[Finding]:
    """What only a file can get wrong (every name, whatever its family)."""
    out = []
    src = DOCKER_ENV_FILE
    for name, value in sorted(parsed.values.items()):
        line = parsed.lines.get(name)
        if name in DANGEROUS:
            p = DANGEROUS[name]
            out.append(finding(name, "warning", "dangerous-variable", p.key, name=name, value=value, line=line,
                               source=p.source))
        if not _NAME.fullmatch(name):
            out.append(finding(name, "warning", "odd-name", "nccl_file_odd_name", name=name, line=line, source=src))
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            out.append(finding(name, "warning", "quotes-kept", "nccl_file_quotes_kept", name=name, value=value,
                               bare=value[1:-1], line=line, suggestion=value[1:-1], source=src))
        elif re.search(r"\s#", value):
            bare = value[:re.search(r"\s#", value).start()].rstrip()
            out.append(finding(name, "warning", "comment-kept", "nccl_file_comment_kept", name=name, value=value,
                               bare=bare, line=line, suggestion=bare, source=src))
    for name, line in sorted(parsed.passthrough.items()):
        out.append(finding(name, "info", "passthrough", "nccl_file_passthrough", name=name, line=line, source=src))
    return out


def lint_env_file(path, environ: Mapping[str, str] | None = None, *, refuse_symlinks: bool = False) -> list[Finding]:
    """Lint a ``.env`` file: what ``docker run --env-file path`` would give the container
    (:func:`lint_env`), plus the findings only a file has (see the module docstring).

    ``path`` may also be an already parsed :class:`~dtrain_lab.nccl.envfile.EnvFile`. Raises
    :class:`~dtrain_lab.nccl.envfile.EnvFileError` on a line Docker would refuse."""
    parsed = path if isinstance(path, EnvFile) else read_env_file(path, environ, refuse_symlinks=refuse_symlinks)
    return _sorted(lint_env(parsed.values) + _file_only(parsed))
