"""dtrain_lab.nccl: the environment linter, the .env parser, the machine doctor and their commands.

Fast: no process is launched, no GPU is needed (the doctor is exercised on this machine as it is).
"""
import json
import os
import re
from urllib.parse import urlparse

import pytest

from dtrain_lab import i18n, nccl
from dtrain_lab.nccl import EnvFileError, Finding, lint_env, lint_env_file, parse_env_file, read_env_file
from dtrain_lab.nccl import machine as nccl_doctor
from dtrain_lab.nccl import lint as nccl_lint
from dtrain_lab.nccl.vars import DANGEROUS, NOT_VARIABLES, OWNERS, STATUSES, TYPES, VARS

CJK = re.compile(r"[\u4e00-\u9fff]")
CLEAN = {"NCCL_DEBUG": "INFO", "NCCL_SOCKET_IFNAME": "eth0", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}


def by_var(findings, var):
    return [f for f in findings if f.var == var]


def codes(findings, var=None):
    return {f.code for f in findings if var is None or f.var == var}


def problems(findings):
    return [f for f in findings if f.severity in ("error", "warning")]


# ------------------------------------------------------------------------------ clean configurations
def test_clean_config_has_no_warning_or_error():
    assert problems(lint_env(CLEAN)) == []


def test_realistic_clean_config_has_no_warning_or_error():
    env = {**CLEAN, "NCCL_DEBUG_SUBSYS": "INIT,NET", "NCCL_DEBUG_FILE": "/tmp/nccl.%h.%p.log",
           "NCCL_IB_HCA": "=mlx5_0:1,mlx5_1:1", "NCCL_SOCKET_NTHREADS": "4", "NCCL_NSOCKS_PERTHREAD": "4",
           "GLOO_SOCKET_IFNAME": "eth0", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500",
           "WORLD_SIZE": "8", "RANK": "3", "LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "8",
           "TORCH_NCCL_DUMP_ON_TIMEOUT": "1", "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000",
           "TORCH_NCCL_BLOCKING_WAIT": "true", "TORCH_DISTRIBUTED_DEBUG": "DETAIL",
           "TORCH_CPP_LOG_LEVEL": "INFO", "NCCL_ALGO": "ring,TREE", "NCCL_IB_TIMEOUT": "22"}
    assert problems(lint_env(env)) == []


def test_unrelated_variables_are_ignored():
    env = {"PATH": "/usr/bin", "HOME": "/root", "LANG": "C.UTF-8", "CUDA_VISIBLE_DEVICES": "0,1",
           "NCCL_VERSION": "2.21.5"}  # NCCL_VERSION: packaging metadata, not a runtime setting
    assert lint_env(env) == []


# ------------------------------------------------------------------------------ names
def test_nccl_timeout_is_not_an_nccl_variable():
    [f] = lint_env({"NCCL_TIMEOUT": "1800"})
    assert (f.severity, f.code) == ("error", "not-a-variable")
    assert "init_process_group" in f.message("en") and "timeout" in f.message("en")
    assert "init_process_group" in f.message("zh") and CJK.search(f.message("zh"))
    assert "init_process_group" in f.suggestion
    assert urlparse(f.source).hostname.endswith("pytorch.org")


@pytest.mark.parametrize("old, new", [
    ("NCCL_ASYNC_ERROR_HANDLING", "TORCH_NCCL_ASYNC_ERROR_HANDLING"),
    ("NCCL_BLOCKING_WAIT", "TORCH_NCCL_BLOCKING_WAIT"),
    ("NCCL_DESYNC_DEBUG", "TORCH_NCCL_DESYNC_DEBUG"),
    ("NCCL_ENABLE_TIMING", "TORCH_NCCL_ENABLE_TIMING"),
    ("NCCL_IB_GDR_LEVEL", "NCCL_NET_GDR_LEVEL"),
    ("NCCL_MAX_NRINGS", "NCCL_MAX_NCHANNELS"),
])
def test_renamed_variables_name_their_replacement(old, new):
    value = "PHB" if old == "NCCL_IB_GDR_LEVEL" else "1"
    [f] = [f for f in lint_env({old: value}) if f.code == "renamed"]
    assert f.severity == "warning" and f.suggestion == new
    assert new in f.message("en") and new in f.message("zh")


def test_nccl_async_error_handling_is_flagged_as_renamed():
    fs = lint_env({"NCCL_ASYNC_ERROR_HANDLING": "1"})
    assert [(f.var, f.code, f.suggestion) for f in fs] == [
        ("NCCL_ASYNC_ERROR_HANDLING", "renamed", "TORCH_NCCL_ASYNC_ERROR_HANDLING")]


@pytest.mark.parametrize("typo, meant", [
    ("NCCL_SOCKET_IFNAM", "NCCL_SOCKET_IFNAME"),
    ("NCCL_DEUBG", "NCCL_DEBUG"),
    ("NCCL_IB_DISABLED", "NCCL_IB_DISABLE"),
    ("TORCH_NCCL_ASYNC_ERROR_HANDLIN", "TORCH_NCCL_ASYNC_ERROR_HANDLING"),
    ("GLOO_SOCKET_IFNAM", "GLOO_SOCKET_IFNAME"),
])
def test_misspelt_variables_get_a_did_you_mean(typo, meant):
    [f] = lint_env({typo: "x"})
    assert (f.severity, f.code, f.suggestion) == ("warning", "unknown-variable", meant)
    assert meant in f.message("en") and meant in f.message("zh")


def test_unknown_name_without_a_close_match_is_only_a_note():
    [f] = lint_env({"NCCL_SOMETHING_ENTIRELY_DIFFERENT": "1"})
    assert (f.severity, f.code, f.suggestion) == ("info", "undocumented-variable", None)


def test_variable_names_are_case_sensitive():
    [f] = lint_env({"nccl_debug": "INFO"})
    assert (f.severity, f.code, f.suggestion) == ("error", "wrong-case", "NCCL_DEBUG")


@pytest.mark.parametrize("name, replacement, severity", [
    ("NCCL_IB_CUDA_SUPPORT", "NCCL_NET_GDR_LEVEL", "error"),   # removed in 2.4.0
    ("NCCL_LL_THRESHOLD", "NCCL_PROTO", "error"),              # removed in 2.5
    ("NCCL_MAX_NCHANNELS", "NCCL_MAX_CTAS", "warning"),        # deprecated in 2.17
    ("NCCL_CHECK_POINTERS", "NCCL_CHECK_MODE", "warning"),     # deprecated in 2.29.7
])
def test_removed_and_deprecated_variables(name, replacement, severity):
    [f] = [f for f in lint_env({name: "1"}) if f.code in ("removed", "deprecated")]
    assert (f.severity, f.suggestion) == (severity, replacement)


# ------------------------------------------------------------------------------ values
@pytest.mark.parametrize("name, value", [
    ("NCCL_DEBUG", "VERBOSE"),
    ("NCCL_IB_DISABLE", "yes"),
    ("NCCL_IB_DISABLE", "2"),
    ("NCCL_ALGO", "foo"),
    ("NCCL_ALGO", "ring,fast"),
    ("NCCL_PROTO", "LL256"),
    ("NCCL_BUFFSIZE", "4MB"),
    ("NCCL_NTHREADS", "100"),
    ("NCCL_IB_RETRY_CNT", "9"),
    ("NCCL_SOCKET_NTHREADS", "0"),
    ("NCCL_SOCKET_FAMILY", "IPv4"),
    ("NCCL_IB_HCA", "mlx5_0:x"),
    ("NCCL_DEBUG_FILE", "~/nccl.log"),
    ("NCCL_IB_ADDR_RANGE", "10.0.0.0/99"),
    ("TORCH_NCCL_ASYNC_ERROR_HANDLING", "true"),
    ("TORCH_NCCL_BLOCKING_WAIT", "maybe"),
    ("TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC", "10m"),
    ("TORCH_DISTRIBUTED_DEBUG", "VERBOSE"),
    ("MASTER_PORT", "70000"),
])
def test_invalid_values_are_errors(name, value):
    errors = [f for f in lint_env({name: value}) if f.severity == "error"]
    assert errors and all(f.var == name for f in errors), lint_env({name: value})
    assert {f.code for f in errors} == {"invalid-value"}


def test_invalid_value_suggests_the_closest_choice():
    [f] = [f for f in lint_env({"NCCL_DEBUG": "INOF"}) if f.severity == "error"]
    assert f.suggestion == "INFO"


def test_undocumented_spelling_is_a_warning_not_an_error():
    fs = lint_env({"NCCL_DEBUG": "info"})
    assert [(f.severity, f.code, f.suggestion) for f in fs] == [("warning", "spelling", "INFO")]


def test_case_insensitive_where_the_docs_say_so():
    assert problems(lint_env({"NCCL_ALGO": "RING,tree", "NCCL_PROTO": "^ll", "NCCL_NET": "ib"})) == []


@pytest.mark.parametrize("value", ["1", "0", "true", "FALSE", "yes", "n"])
def test_pytorch_booleans_accept_pytorch_spellings(value):
    assert problems(lint_env({"TORCH_NCCL_BLOCKING_WAIT": value})) == []


def test_legacy_integer_levels_are_deprecated_values():
    [f] = [f for f in lint_env({"NCCL_P2P_LEVEL": "2"}) if f.code == "deprecated-value"]
    assert (f.severity, f.suggestion) == ("warning", "PXB")
    [f] = [f for f in lint_env({"NCCL_NET_GDR_LEVEL": "7"}) if f.code == "deprecated-value"]
    assert f.suggestion == "SYS"  # the docs: values greater than 4 are interpreted as SYS


def test_infinite_ib_timeout_is_a_warning():
    [f] = lint_env({"NCCL_IB_TIMEOUT": "0"})
    assert (f.severity, f.code) == ("warning", "infinite-timeout")


@pytest.mark.parametrize("value", ["32", "33", "40", "255", "0x20"])
def test_ib_timeout_of_32_or_more_is_infinite_as_the_nccl_docs_say(value):
    # NCCL docs (env.html): "Setting a value of 0 or >= 32 will result in an infinite timeout value."
    [f] = lint_env({"NCCL_IB_TIMEOUT": value})
    assert (f.severity, f.code, f.suggestion) == ("warning", "infinite-timeout", "20")
    assert ">= 32" in f.message("en") and "1-31" in f.message("zh") and CJK.search(f.message("zh"))


@pytest.mark.parametrize("value", ["1", "20", "31"])
def test_ib_timeout_in_range_is_clean(value):
    assert lint_env({"NCCL_IB_TIMEOUT": value}) == []


def test_torch_distributed_timeout_has_no_effect():
    [f] = lint_env({"TORCH_DISTRIBUTED_TIMEOUT": "1800"})
    assert (f.severity, f.code, f.suggestion) == ("error", "not-a-variable", "init_process_group(timeout=...)")
    assert "init_process_group" in f.message("en") and "timeout" in f.message("zh")


def _torch_dir():
    import torch

    return os.path.dirname(torch.__file__)


def test_torch_distributed_timeout_is_read_nowhere_in_torch():
    """The claim behind the finding, checked on the installed torch: no Python file and no header
    names TORCH_DISTRIBUTED_TIMEOUT (the shared libraries were checked once with strings(1); too slow
    to repeat here)."""
    hits = []
    for root, _, files in os.walk(_torch_dir()):
        for name in files:
            if name.endswith((".py", ".h", ".hpp")):
                with open(os.path.join(root, name), "rb") as f:
                    if b"TORCH_DISTRIBUTED_TIMEOUT" in f.read():
                        hits.append(name)
    assert hits == []


def test_flight_recorder_defaults_match_the_installed_torch():
    header = os.path.join(_torch_dir(), "include/torch/csrc/distributed/c10d/FlightRecorder.hpp")
    if not os.path.exists(header):
        pytest.skip("this torch build ships no c10d headers")
    text = re.sub(r"\s+", " ", open(header, encoding="utf-8").read())
    # the new name first (it wins), the old one as an alias, 2000 entries by default
    assert 'getCvarInt( {"TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"}, 2000)' in text
    assert VARS["TORCH_FR_BUFFER_SIZE"].default == VARS["TORCH_NCCL_TRACE_BUFFER_SIZE"].default == "2000"


def test_flight_recorder_is_on_by_default_so_nothing_needs_setting():
    assert lint_env({"TORCH_NCCL_DUMP_ON_TIMEOUT": "1"}) == []
    [f] = lint_env({"TORCH_NCCL_TRACE_BUFFER_SIZE": "2000"})
    assert (f.severity, f.code) == ("info", "alias-note") and "2000" in f.message("en")


def test_switching_off_what_the_default_dump_needs_is_noted():
    # the dump is on by default: turning off its buffer or its thread is a note, and a warning when
    # the dump was asked for explicitly
    [f] = lint_env({"TORCH_FR_BUFFER_SIZE": "0"})
    assert (f.var, f.severity, f.code) == ("TORCH_NCCL_DUMP_ON_TIMEOUT", "info", "conflict")
    [f] = lint_env({"TORCH_NCCL_ENABLE_MONITORING": "0"})
    assert (f.var, f.severity, f.code) == ("TORCH_NCCL_ENABLE_MONITORING", "info", "conflict")
    fs = lint_env({"TORCH_NCCL_DUMP_ON_TIMEOUT": "1", "TORCH_FR_BUFFER_SIZE": "0"})
    assert [(f.var, f.severity) for f in fs if f.code == "conflict"] == [("TORCH_NCCL_DUMP_ON_TIMEOUT", "warning")]
    assert lint_env({"TORCH_NCCL_DUMP_ON_TIMEOUT": "0", "TORCH_FR_BUFFER_SIZE": "0"}) == []


def test_empty_value_is_a_warning():
    [f] = lint_env({"NCCL_DEBUG": ""})
    assert (f.severity, f.code) == ("warning", "empty-value")


def test_secret_values_are_never_echoed():
    secret = "tooshort-secret"
    fs = lint_env({"NCCL_PSK": secret})
    assert fs and all(secret not in f.message("en") + f.message("zh") for f in fs)


def test_debugging_variables_get_a_note():
    fs = lint_env({"NCCL_P2P_DISABLE": "1"})
    assert [(f.severity, f.code) for f in fs] == [("info", "debugging-variable")]


# ------------------------------------------------------------------------------ conflicts
def test_ib_disabled_but_ib_configured():
    fs = lint_env({"NCCL_IB_DISABLE": "1", "NCCL_IB_HCA": "=mlx5_0"})
    [f] = [f for f in fs if f.code == "conflict"]
    assert f.severity == "warning" and "NCCL_IB_HCA" in f.message("en") and "NCCL_IB_HCA" in f.message("zh")


def test_old_and_new_name_with_different_values():
    fs = lint_env({"NCCL_ASYNC_ERROR_HANDLING": "1", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "3"})
    [f] = [f for f in fs if f.code == "conflict"]
    assert f.severity == "warning" and "TORCH_NCCL_ASYNC_ERROR_HANDLING" in f.message("en")
    same = lint_env({"NCCL_ASYNC_ERROR_HANDLING": "1", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"})
    assert "conflict" not in codes(same) and "duplicate" in codes(same)


def test_p2p_disabled_with_p2p_level():
    fs = lint_env({"NCCL_P2P_DISABLE": "1", "NCCL_P2P_LEVEL": "NVL"})
    assert "conflict" in codes(fs, "NCCL_P2P_LEVEL")


def test_debug_subsys_without_debug():
    fs = lint_env({"NCCL_DEBUG_SUBSYS": "INIT,NET"})
    [f] = [f for f in fs if f.code == "conflict"]
    assert f.severity == "warning" and f.suggestion == "NCCL_DEBUG=INFO"
    assert "conflict" not in codes(lint_env({"NCCL_DEBUG_SUBSYS": "INIT,NET", "NCCL_DEBUG": "INFO"}))


def test_socket_threads_times_sockets_cannot_exceed_64():
    fs = lint_env({"NCCL_SOCKET_NTHREADS": "16", "NCCL_NSOCKS_PERTHREAD": "8"})
    assert [f.severity for f in fs if f.code == "conflict"] == ["error"]


def test_rank_must_be_below_world_size():
    fs = lint_env({"RANK": "4", "WORLD_SIZE": "4"})
    assert [f.severity for f in fs if f.code == "conflict"] == ["error"]


def test_min_ctas_above_max_ctas():
    fs = lint_env({"NCCL_MIN_CTAS": "16", "NCCL_MAX_CTAS": "8"})
    assert "conflict" in codes(fs, "NCCL_MIN_CTAS")


def test_dump_on_timeout_needs_a_trace_buffer_and_monitoring():
    fs = lint_env({"TORCH_NCCL_DUMP_ON_TIMEOUT": "1", "TORCH_NCCL_TRACE_BUFFER_SIZE": "0",
                   "TORCH_NCCL_ENABLE_MONITORING": "0"})
    assert {f.var for f in fs if f.code == "conflict"} == {"TORCH_NCCL_DUMP_ON_TIMEOUT",
                                                           "TORCH_NCCL_ENABLE_MONITORING"}


def test_findings_are_sorted_errors_first():
    fs = lint_env({"NCCL_P2P_DISABLE": "1", "NCCL_ASYNC_ERROR_HANDLING": "1", "NCCL_TIMEOUT": "5"})
    order = [nccl.SEVERITIES.index(f.severity) for f in fs]
    assert order == sorted(order) and fs[0].severity == "error"


# ------------------------------------------------------------------------------ Finding
def test_finding_message_follows_the_language():
    f = lint_env({"NCCL_TIMEOUT": "1"})[0]
    assert f.rendered() == {"zh": f.message("zh"), "en": f.message("en")} and CJK.search(f.message("zh"))
    old = i18n.get_lang()
    try:
        i18n.set_lang("zh")
        assert f.message() == f.message("zh")
    finally:
        i18n.set_lang(old)
    assert f.to_dict()["message"] == f.rendered()
    with pytest.raises(ValueError):
        Finding("X", "fatal", "c", "nccl_empty_value", {"var": "X"})


# ------------------------------------------------------------------------------ knowledge base
ALLOWED_HOSTS = ("docs.nvidia.com", "pytorch.org")


def _official(url: str) -> bool:
    u = urlparse(url)
    if u.scheme != "https":
        return False
    if u.hostname == "github.com":
        return u.path.startswith("/pytorch/")
    return any(u.hostname == h or u.hostname.endswith("." + h) for h in ALLOWED_HOSTS)


@pytest.mark.parametrize("name", sorted(VARS))
def test_every_entry_is_complete_and_sourced(name):
    e = VARS[name]
    assert e.name == name and e.owner in OWNERS and e.type in TYPES and e.status in STATUSES
    assert CJK.search(e.zh), "the zh text must be Chinese"
    assert e.en and not CJK.search(e.en)
    assert _official(e.source), e.source
    if e.owner == "nccl":
        assert urlparse(e.source).hostname == "docs.nvidia.com"
    if e.status in ("renamed",):
        assert e.replacement in VARS
    if e.replacement:
        assert e.replacement in VARS
    if e.status in ("deprecated", "removed") or (e.status == "renamed" and e.owner == "nccl"):
        assert e.status_key in i18n.catalogue(), "non-current NCCL entries say what the docs say"
    assert e.zh_from == i18n.english_hash(e.en), f"{name}: the Chinese description is older than the English"
    assert e.describe("zh") == e.zh and e.describe("en") == e.en
    if e.type == "enum":
        assert e.choices
    # the documented default (when it is a plain value) must itself pass the linter
    if e.status == "current" and e.default and re.fullmatch(r"[-\w.%/,:\[\]]+", e.default):
        assert not [f for f in lint_env({name: e.default}) if f.severity == "error"]


def test_knowledge_base_covers_the_variables_the_course_needs():
    needed = """NCCL_DEBUG NCCL_DEBUG_SUBSYS NCCL_DEBUG_FILE NCCL_SOCKET_IFNAME NCCL_SOCKET_FAMILY
    NCCL_SOCKET_NTHREADS NCCL_NSOCKS_PERTHREAD NCCL_IB_DISABLE NCCL_IB_HCA NCCL_IB_GID_INDEX
    NCCL_IB_TIMEOUT NCCL_IB_RETRY_CNT NCCL_IB_TC NCCL_NET_GDR_LEVEL NCCL_NET_GDR_READ NCCL_P2P_DISABLE
    NCCL_P2P_LEVEL NCCL_SHM_DISABLE NCCL_ALGO NCCL_PROTO NCCL_BUFFSIZE NCCL_NTHREADS NCCL_MIN_NCHANNELS
    NCCL_MAX_NCHANNELS NCCL_CROSS_NIC NCCL_TOPO_FILE NCCL_NET NCCL_LAUNCH_MODE NCCL_CUMEM_ENABLE
    NCCL_NVLS_ENABLE NCCL_COLLNET_ENABLE NCCL_IB_CUDA_SUPPORT
    TORCH_NCCL_ASYNC_ERROR_HANDLING TORCH_NCCL_BLOCKING_WAIT TORCH_NCCL_TRACE_BUFFER_SIZE
    TORCH_NCCL_DUMP_ON_TIMEOUT TORCH_NCCL_DESYNC_DEBUG TORCH_NCCL_ENABLE_MONITORING
    TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC TORCH_NCCL_AVOID_RECORD_STREAMS TORCH_DISTRIBUTED_DEBUG
    TORCH_CPP_LOG_LEVEL TORCH_SHOW_CPP_STACKTRACES GLOO_SOCKET_IFNAME MASTER_ADDR MASTER_PORT
    NCCL_ASYNC_ERROR_HANDLING NCCL_BLOCKING_WAIT NCCL_DESYNC_DEBUG""".split()
    assert not [n for n in needed if n not in VARS]
    assert VARS["NCCL_ASYNC_ERROR_HANDLING"].owner == "pytorch"  # PyTorch's, despite the prefix
    assert VARS["GLOO_SOCKET_IFNAME"].owner == "gloo"


def test_not_variables_are_bilingual_and_not_in_the_knowledge_base():
    for name, p in NOT_VARIABLES.items():
        assert name not in VARS and CJK.search(i18n.tr(p.key, "zh", name=name))
        assert "init_process_group" in i18n.tr(p.key, "en", name=name)


def test_the_keys_the_table_names_are_written_out():
    """vars.toml names catalogue keys; lint.py writes them out as literals (so the catalogue test sees
    them used): the two lists must agree, and every key must exist."""
    cat = i18n.catalogue()
    assert {e.status_key for e in VARS.values() if e.status_key} == set(nccl_lint.STATUS_KEYS)
    assert {p.key for p in NOT_VARIABLES.values()} == set(nccl_lint.NOT_VARIABLE_KEYS)
    assert {p.key for p in DANGEROUS.values()} == set(nccl_lint.DANGER_KEYS)
    assert all(k in cat for k in nccl_lint.STATUS_KEYS + nccl_lint.NOT_VARIABLE_KEYS + nccl_lint.DANGER_KEYS)


# ------------------------------------------------------------------------------ .env files
def test_parse_env_file_as_docker_does(tmp_path):
    """docker run --env-file: values literal (quotes, #, $ and trailing blanks kept), leading blanks
    and whole-line comments skipped, CRLF endings, a later line wins, KEY alone from the environment."""
    p = tmp_path / "nccl.env"
    p.write_bytes(
        b"# a comment\n"
        b"\n"
        b"   \t# an indented comment\n"
        b"NCCL_DEBUG=INFO\n"
        b'NCCL_SOCKET_IFNAME="=eth0"\n'
        b"NCCL_DEBUG_FILE=/tmp/nccl.%h.%p.log # not a comment\n"
        b"TORCH_NCCL_ASYNC_ERROR_HANDLING='1'\n"
        b"NCCL_DEBUG_TIMESTAMP_FORMAT=[%F %T] \n"
        b"   GLOO_SOCKET_IFNAME=eth#0\r\n"
        b"MASTER_ADDR=$(hostname)\n"
        b"NCCL_IB_HCA=\n"
        b"1NCCL=x=y\n"
        b"NCCL_ALGO\n"
        b"NCCL_PROTO\n"
        b"NCCL_DEBUG=WARN")  # a later assignment wins; the last line has no newline
    got = parse_env_file(p, {"NCCL_ALGO": "Ring"})
    assert got == {
        "NCCL_DEBUG": "WARN", "NCCL_SOCKET_IFNAME": '"=eth0"', "NCCL_DEBUG_FILE": "/tmp/nccl.%h.%p.log # not a comment",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "'1'", "NCCL_DEBUG_TIMESTAMP_FORMAT": "[%F %T] ",
        "GLOO_SOCKET_IFNAME": "eth#0", "MASTER_ADDR": "$(hostname)", "NCCL_IB_HCA": "", "1NCCL": "x=y",
        "NCCL_ALGO": "Ring"}  # NCCL_PROTO: not in the environment, so docker sets nothing
    parsed = read_env_file(p)  # no environment by default: nothing leaks from the caller's
    assert "NCCL_ALGO" not in parsed.values and parsed.passthrough == {"NCCL_ALGO": 13, "NCCL_PROTO": 14}
    assert parsed.lines["NCCL_DEBUG"] == 15


def test_parse_env_file_tolerates_a_bom(tmp_path):
    p = tmp_path / "bom.env"
    p.write_bytes(b"\xef\xbb\xbfNCCL_DEBUG=INFO\nNCCL_SOCKET_IFNAME=eth0\n")
    assert parse_env_file(p) == {"NCCL_DEBUG": "INFO", "NCCL_SOCKET_IFNAME": "eth0"}
    assert problems(lint_env_file(p)) == []
    p.write_bytes(b"\xef\xbb\xbf# a comment first\nNCCL_DEBUG=INFO\n")
    assert parse_env_file(p) == {"NCCL_DEBUG": "INFO"}


@pytest.mark.parametrize("line, key", [
    (b"NCCL_DEBUG INFO", "env_file_key_whitespace"),
    (b"NCCL_DEBUG = INFO", "env_file_key_whitespace"),
    (b"export NCCL_DEBUG=INFO", "env_file_export"),
    (b"export NCCL_DEBUG", "env_file_export"),
    (b"=INFO", "env_file_no_name"),
    (b"NCCL_DEBUG=\xff\xfe", "env_file_bad_utf8"),
])
def test_a_line_docker_refuses_is_a_clear_bilingual_error(tmp_path, line, key):
    p = tmp_path / "bad.env"
    p.write_bytes(b"# header\nNCCL_SOCKET_IFNAME=eth0\n" + line + b"\n")
    with pytest.raises(EnvFileError) as exc:
        parse_env_file(p)
    e = exc.value
    assert isinstance(e, i18n.LabError) and e.key == key and e.lineno == 3
    assert "line 3" in e.message("en") and "第 3 行" in e.message("zh")
    assert e.message("zh") in str(e) and e.message("en") in str(e)  # both languages, like LabError


def test_lines_docker_accepts_are_not_errors(tmp_path):
    # Docker checks nothing but whitespace in names, and takes values literally: the linter, not the
    # parser, says what is wrong with them.
    p = tmp_path / "odd.env"
    p.write_text('NCCL-DEBUG=INFO\nNCCL_DEBUG="INFO\n', encoding="utf-8")
    assert parse_env_file(p) == {"NCCL-DEBUG": "INFO", "NCCL_DEBUG": '"INFO'}
    fs = lint_env_file(p)
    assert "odd-name" in codes(fs, "NCCL-DEBUG") and "invalid-value" in codes(fs, "NCCL_DEBUG")


def test_a_too_long_line_is_refused(tmp_path):
    p = tmp_path / "long.env"
    p.write_bytes(b"NCCL_DEBUG=" + b"x" * 70000 + b"\n")
    with pytest.raises(EnvFileError) as exc:
        parse_env_file(p)
    assert exc.value.key == "env_file_line_too_long"


def test_missing_env_file_is_an_env_file_error(tmp_path):
    with pytest.raises(EnvFileError) as exc:
        parse_env_file(tmp_path / "nope.env")
    assert exc.value.key == "env_file_unreadable" and CJK.search(exc.value.message("zh"))
    with pytest.raises(EnvFileError) as exc:
        parse_env_file(tmp_path)
    assert exc.value.key in ("env_file_unreadable", "env_file_not_regular")


def test_symlinks_can_be_refused(tmp_path):
    target = tmp_path / "secret.env"
    target.write_text("NCCL_DEBUG=INFO\n", encoding="utf-8")
    link = tmp_path / "link.env"
    link.symlink_to(target)
    assert parse_env_file(link) == {"NCCL_DEBUG": "INFO"}  # docker follows links
    with pytest.raises(EnvFileError) as exc:
        parse_env_file(link, refuse_symlinks=True)
    assert exc.value.key == "env_file_symlink"


def test_quotes_and_inline_comments_kept_by_docker_are_flagged(tmp_path):
    p = tmp_path / "q.env"
    p.write_text('NCCL_SOCKET_IFNAME="=eth0"\nNCCL_DEBUG=INFO  # verbose\nOMP_NUM_THREADS=\'4\'\n', encoding="utf-8")
    fs = lint_env_file(p)
    [q] = [f for f in fs if f.var == "NCCL_SOCKET_IFNAME" and f.code == "quotes-kept"]
    assert q.severity == "warning" and q.suggestion == "=eth0" and '"=eth0"' in q.message("en")
    [c] = [f for f in fs if f.var == "NCCL_DEBUG" and f.code == "comment-kept"]
    assert c.suggestion == "INFO" and "#" in c.message("zh")
    assert "quotes-kept" in codes(fs, "OMP_NUM_THREADS")  # any variable of the file


def test_a_name_without_value_is_flagged(tmp_path):
    p = tmp_path / "p.env"
    p.write_text("NCCL_DEBUG\n", encoding="utf-8")
    [f] = lint_env_file(p)
    assert (f.var, f.severity, f.code) == ("NCCL_DEBUG", "info", "passthrough")


@pytest.mark.parametrize("name", sorted(DANGEROUS))
def test_variables_that_load_code_or_change_lookup_are_flagged_in_files(tmp_path, name):
    p = tmp_path / "d.env"
    p.write_text(f"NCCL_DEBUG=INFO\n{name}=/tmp/evil\n", encoding="utf-8")
    [f] = [f for f in lint_env_file(p) if f.var == name]
    assert (f.severity, f.code) == ("warning", "dangerous-variable")
    assert "/tmp/evil" in f.message("en") and CJK.search(f.message("zh")) and f.source.startswith("https://")
    assert lint_env({name: "/tmp/evil"}) == []  # the current environment's PATH etc. are not the linter's business


@pytest.mark.parametrize("name", ["NCCL_NET_PLUGIN", "NCCL_TUNER_PLUGIN", "NCCL_PROFILER_PLUGIN",
                                  "NCCL_ENV_PLUGIN", "NCCL_GIN_PLUGIN", "NCCL_RMA_PLUGIN"])
def test_a_plugin_given_as_a_path_is_flagged(name):
    [f] = [f for f in lint_env({name: "/home/me/libevil.so"}) if f.code == "loads-code"]
    assert f.severity == "warning" and "/home/me/libevil.so" in f.message("en")
    assert not [f for f in lint_env({name: "none"}) if f.code == "loads-code"]


def test_env_file_lint_counts_as_problems(tmp_path):
    p = tmp_path / "bad.env"
    p.write_text("LD_PRELOAD=/x.so\nNCCL_NET_PLUGIN=/x.so\nPYTHONPATH=/x\nPATH=/x\nBASH_ENV=/x\n", encoding="utf-8")
    flagged = {f.var for f in problems(lint_env_file(p))}
    assert flagged == {"LD_PRELOAD", "NCCL_NET_PLUGIN", "PYTHONPATH", "PATH", "BASH_ENV"}


# ------------------------------------------------------------------------------ doctor
def test_doctor_runs_on_this_machine():
    report = nccl.doctor()
    assert {"torch", "gpus", "network", "shm", "ulimits", "env", "recommendations"} <= set(report)
    json.dumps(report)  # JSON-serializable as it is
    assert report["torch"]["version"]
    if not report["torch"]["cuda_available"]:
        assert report["gpus"]["count"] == 0 and report["torch"]["nccl_version"] is None
        assert "no-gpu" in {r["code"] for r in report["recommendations"]}
    assert any(n["kind"] == "loopback" for n in report["network"])
    assert {"memlock", "nofile", "stack"} <= set(report["ulimits"])
    for rec in report["recommendations"]:
        assert rec["severity"] in nccl.SEVERITIES and CJK.search(rec["message"]["zh"]) and rec["message"]["en"]
    for lang, heading in (("zh", "建议"), ("en", "Recommendations")):
        assert heading in nccl.format_doctor(report, lang)


def test_doctor_survives_a_broken_cuda(monkeypatch):
    import torch

    def boom():
        raise RuntimeError("driver exploded")

    monkeypatch.setattr(torch.cuda, "is_available", boom)
    report = nccl.doctor()
    assert report["torch"]["cuda_available"] is False and report["gpus"]["count"] == 0


def test_doctor_recommendations(monkeypatch):
    import shutil as _shutil
    from collections import namedtuple

    usage = namedtuple("usage", "total used free")
    real = _shutil.disk_usage
    monkeypatch.setattr(nccl_doctor.shutil, "disk_usage",
                        lambda p: usage(64 * 2**20, 0, 64 * 2**20) if p == "/dev/shm" else real(p))
    monkeypatch.setattr(nccl_doctor, "_ulimits", lambda: {
        "memlock": {"soft": "unlimited", "hard": "unlimited"}, "nofile": {"soft": 1024, "hard": 1024},
        "stack": {"soft": "unlimited", "hard": "unlimited"}})
    report = nccl.doctor({"NCCL_SOCKET_IFNAME": "=no_such_if0", "NCCL_TIMEOUT": "60"})
    got = {r["code"] for r in report["recommendations"]}
    if report["shm"] is not None:
        assert "small-shm" in got
    assert {"nofile", "stack-unlimited", "ifname-no-match", "env-findings"} <= got
    assert report["env"]["vars"] == {"NCCL_SOCKET_IFNAME": "=no_such_if0", "NCCL_TIMEOUT": "60"}


def test_doctor_hides_secrets():
    report = nccl.doctor({"NCCL_PSK": "x" * 40})
    assert report["env"]["vars"]["NCCL_PSK"] == "<hidden>"
    assert "x" * 40 not in json.dumps(report)


# ------------------------------------------------------------------------------ commands
@pytest.fixture
def bare_env(monkeypatch):
    """os.environ without any NCCL / PyTorch-distributed / Gloo variable."""
    for k in list(os.environ):
        if nccl.relevant(k):
            monkeypatch.delenv(k)
    return monkeypatch


def write(tmp_path, text):
    p = tmp_path / "x.env"
    p.write_text(text, encoding="utf-8")
    return str(p)


def test_main_lint_clean_file(tmp_path, capsys):
    f = write(tmp_path, "".join(f"{k}={v}\n" for k, v in CLEAN.items()))
    assert nccl.main_lint(["--file", f, "--lang", "en"]) == 0
    assert "No problems found" in capsys.readouterr().out


def test_main_lint_exit_codes_and_json(tmp_path, capsys):
    f = write(tmp_path, "NCCL_TIMEOUT=1800\nNCCL_ASYNC_ERROR_HANDLING=1\n")
    assert nccl.main_lint(["--file", f, "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] is False and out["summary"]["error"] == 1 and out["summary"]["warning"] == 1
    assert {x["code"] for x in out["findings"]} == {"not-a-variable", "renamed"}
    assert out["checked"] == ["NCCL_ASYNC_ERROR_HANDLING", "NCCL_TIMEOUT"]

    warn_only = write(tmp_path, "NCCL_ASYNC_ERROR_HANDLING=1\n")
    assert nccl.main_lint(["--file", warn_only]) == 0
    assert nccl.main_lint(["--file", warn_only, "--strict"]) == 1


def test_main_lint_malformed_file(tmp_path, capsys):
    f = write(tmp_path, "NCCL_DEBUG INFO\n")
    assert nccl.main_lint(["--file", f, "--lang", "zh"]) == 2
    assert "第 1 行" in capsys.readouterr().err
    assert nccl.main_lint(["--file", f, "--json"]) == 2
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] is False and out["error"]["line"] == 1 and CJK.search(out["error"]["message"]["zh"])


def test_main_lint_reads_the_environment(bare_env, capsys):
    assert nccl.main_lint(["--json"]) == 0
    assert json.loads(capsys.readouterr().out)["findings"] == []
    bare_env.setenv("NCCL_DEBUG", "VERBOSE")
    assert nccl.main_lint(["--lang", "zh"]) == 1
    out = capsys.readouterr().out
    assert "NCCL_DEBUG" in out and "错误" in out


def test_main_lint_help_and_bad_arguments(capsys):
    assert nccl.main_lint(["--help"]) == 0
    assert nccl.main_lint(["--no-such-flag"]) == 2
    capsys.readouterr()


def test_main_doctor(capsys):
    assert nccl.main_doctor(["--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert {"gpus", "network", "shm", "ulimits", "recommendations"} <= set(report)
    assert nccl.main_doctor(["--lang", "zh"]) == 0
    assert "建议" in capsys.readouterr().out
