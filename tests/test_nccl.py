"""dtrain_lab.nccl: the environment linter, the .env parser, the machine doctor and their commands.

Fast: no process is launched, no GPU is needed (the doctor is exercised on this machine as it is).
"""
import json
import os
import re
from urllib.parse import urlparse

import pytest

from dtrain_lab import i18n, nccl
from dtrain_lab.nccl import EnvFileError, Finding, lint_env, parse_env_file
from dtrain_lab.nccl.vars import NOT_VARIABLES, OWNERS, STATUSES, TYPES, VARS

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
    assert "init_process_group" in f.message_en and "timeout" in f.message_en
    assert "init_process_group" in f.message_zh and CJK.search(f.message_zh)
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
    assert new in f.message_en and new in f.message_zh


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
    assert meant in f.message_en and meant in f.message_zh


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


def test_empty_value_is_a_warning():
    [f] = lint_env({"NCCL_DEBUG": ""})
    assert (f.severity, f.code) == ("warning", "empty-value")


def test_secret_values_are_never_echoed():
    secret = "tooshort-secret"
    fs = lint_env({"NCCL_PSK": secret})
    assert fs and all(secret not in f.message_en + f.message_zh for f in fs)


def test_debugging_variables_get_a_note():
    fs = lint_env({"NCCL_P2P_DISABLE": "1"})
    assert [(f.severity, f.code) for f in fs] == [("info", "debugging-variable")]


# ------------------------------------------------------------------------------ conflicts
def test_ib_disabled_but_ib_configured():
    fs = lint_env({"NCCL_IB_DISABLE": "1", "NCCL_IB_HCA": "=mlx5_0"})
    [f] = [f for f in fs if f.code == "conflict"]
    assert f.severity == "warning" and "NCCL_IB_HCA" in f.message_en and "NCCL_IB_HCA" in f.message_zh


def test_old_and_new_name_with_different_values():
    fs = lint_env({"NCCL_ASYNC_ERROR_HANDLING": "1", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "3"})
    [f] = [f for f in fs if f.code == "conflict"]
    assert f.severity == "warning" and "TORCH_NCCL_ASYNC_ERROR_HANDLING" in f.message_en
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
    assert f.message("zh") == f.message_zh and f.message("en") == f.message_en
    old = i18n.get_lang()
    try:
        i18n.set_lang("zh")
        assert f.message() == f.message_zh
    finally:
        i18n.set_lang(old)
    with pytest.raises(ValueError):
        Finding("X", "fatal", "c", "中", "en")


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
        assert CJK.search(e.status_zh) and e.status_en, "non-current NCCL entries say what the docs say"
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
    for name, (zh, en) in NOT_VARIABLES.items():
        assert name not in VARS and CJK.search(zh) and "init_process_group" in en


# ------------------------------------------------------------------------------ .env files
def test_parse_env_file(tmp_path):
    p = tmp_path / "nccl.env"
    p.write_text(
        "# a comment\n"
        "\n"
        "export NCCL_DEBUG=INFO\n"
        "NCCL_SOCKET_IFNAME = \"=eth0\"   # inline comment after a quoted value\n"
        "NCCL_DEBUG_FILE=/tmp/nccl.%h.%p.log # inline comment after a bare value\n"
        "TORCH_NCCL_ASYNC_ERROR_HANDLING='1'\n"
        "NCCL_DEBUG_TIMESTAMP_FORMAT='[%F %T] '\n"
        "GLOO_SOCKET_IFNAME=eth#0\n"
        'MASTER_ADDR="say \\"hi\\""\n'
        "NCCL_IB_HCA=\n"
        "export\tNCCL_DEBUG=WARN\n",  # a later assignment wins, as in a shell
        encoding="utf-8")
    assert parse_env_file(p) == {
        "NCCL_DEBUG": "WARN", "NCCL_SOCKET_IFNAME": "=eth0", "NCCL_DEBUG_FILE": "/tmp/nccl.%h.%p.log",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1", "NCCL_DEBUG_TIMESTAMP_FORMAT": "[%F %T] ",
        "GLOO_SOCKET_IFNAME": "eth#0", "MASTER_ADDR": 'say "hi"', "NCCL_IB_HCA": ""}


@pytest.mark.parametrize("line, key", [
    ("NCCL_DEBUG INFO", "env_file_no_equals"),
    ("export NCCL_DEBUG", "env_file_no_equals"),
    ("1NCCL=2", "env_file_bad_name"),
    ("NCCL-DEBUG=INFO", "env_file_bad_name"),
    ('NCCL_DEBUG="INFO', "env_file_unterminated"),
    ("NCCL_DEBUG='INFO' WARN", "env_file_trailing"),
])
def test_malformed_env_line_is_a_clear_bilingual_error(tmp_path, line, key):
    p = tmp_path / "bad.env"
    p.write_text("# header\nNCCL_SOCKET_IFNAME=eth0\n" + line + "\n", encoding="utf-8")
    with pytest.raises(EnvFileError) as exc:
        parse_env_file(p)
    e = exc.value
    assert isinstance(e, i18n.LabError) and e.key == key and e.lineno == 3
    assert "line 3" in e.message("en") and "第 3 行" in e.message("zh")
    assert line in e.message("en")
    assert e.message("zh") in str(e) and e.message("en") in str(e)  # both languages, like LabError


def test_missing_env_file_is_an_env_file_error(tmp_path):
    with pytest.raises(EnvFileError) as exc:
        parse_env_file(tmp_path / "nope.env")
    assert exc.value.key == "env_file_unreadable" and CJK.search(exc.value.message("zh"))


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
        assert rec["severity"] in nccl.SEVERITIES and CJK.search(rec["zh"]) and rec["en"]
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
    monkeypatch.setattr(nccl.shutil, "disk_usage",
                        lambda p: usage(64 * 2**20, 0, 64 * 2**20) if p == "/dev/shm" else real(p))
    monkeypatch.setattr(nccl, "_ulimits", lambda: {
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
        if nccl._relevant(k):
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
    assert out["ok"] is False and out["error"]["line"] == 1 and CJK.search(out["error"]["message_zh"])


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
