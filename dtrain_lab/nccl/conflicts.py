"""Findings about combinations of variables: settings that contradict or cancel each other."""
from __future__ import annotations

from dtrain_lab.nccl.findings import Finding, as_int, finding, truth
from dtrain_lab.nccl.vars import NCCL_ENV, NCCL_LOGGING, PT_DISTRIBUTED, PT_FLIGHT_RECORDER_HPP, PT_PGNCCL_HPP, VARS


class _Env:
    """The relevant variables of one configuration, read the way their readers read them."""

    def __init__(self, env: dict[str, str]):
        self.env = env

    def val(self, name):
        v = self.env.get(name)
        return None if v is None else v.strip()

    def flag(self, name):
        return truth(VARS[name], self.val(name))

    def num(self, name):
        return as_int(VARS[name], self.val(name))


def _ib_and_p2p(c: _Env) -> list[Finding]:
    out = []
    if c.flag("NCCL_IB_DISABLE"):
        ib_set = sorted(n for n in c.env if n.startswith("NCCL_IB_") and n != "NCCL_IB_DISABLE" and n in VARS)
        if ib_set:
            out.append(finding("NCCL_IB_DISABLE", "warning", "conflict", "nccl_ib_disabled_but_set",
                               names=", ".join(ib_set), source=NCCL_ENV))
        if (c.val("NCCL_NET") or "").lower() == "ib":
            out.append(finding("NCCL_NET", "warning", "conflict", "nccl_net_ib_but_disabled", source=NCCL_ENV))
    if c.flag("NCCL_P2P_DISABLE") and c.val("NCCL_P2P_LEVEL") is not None:
        out.append(finding("NCCL_P2P_LEVEL", "warning", "conflict", "nccl_p2p_disabled_with_level", source=NCCL_ENV))
    if c.flag("NCCL_P2P_DISABLE") and c.flag("NCCL_SHM_DISABLE"):
        out.append(finding("NCCL_SHM_DISABLE", "info", "combination", "nccl_p2p_and_shm_disabled", source=NCCL_ENV))
    return out


def _logging(c: _Env) -> list[Finding]:
    out = []
    debug = (c.val("NCCL_DEBUG") or "").upper()
    if c.val("NCCL_DEBUG_SUBSYS") is not None:
        if not debug:
            out.append(finding("NCCL_DEBUG_SUBSYS", "warning", "conflict", "nccl_subsys_without_debug",
                               suggestion="NCCL_DEBUG=INFO", source=NCCL_LOGGING))
        elif debug in ("VERSION", "WARN", "ATTN"):
            out.append(finding("NCCL_DEBUG_SUBSYS", "info", "combination", "nccl_subsys_with_low_debug",
                               debug=debug, source=NCCL_LOGGING))
    if c.val("NCCL_DEBUG_FILE") is not None and not debug:
        out.append(finding("NCCL_DEBUG_FILE", "info", "combination", "nccl_debug_file_without_debug",
                           suggestion="NCCL_DEBUG=INFO", source=NCCL_ENV))
    return out


def _channels(c: _Env) -> list[Finding]:
    out = []
    threads, socks = c.num("NCCL_SOCKET_NTHREADS"), c.num("NCCL_NSOCKS_PERTHREAD")
    if threads and socks and threads * socks > 64:
        out.append(finding("NCCL_NSOCKS_PERTHREAD", "error", "conflict", "nccl_socket_threads_product",
                           threads=threads, socks=socks, product=threads * socks, source=NCCL_ENV))
    for lo_name, hi_name in (("NCCL_MIN_CTAS", "NCCL_MAX_CTAS"), ("NCCL_MIN_NCHANNELS", "NCCL_MAX_NCHANNELS")):
        lo, hi = c.num(lo_name), c.num(hi_name)
        if lo is not None and hi is not None and lo > hi:
            out.append(finding(lo_name, "warning", "conflict", "nccl_min_above_max", lo_name=lo_name, lo=lo,
                               hi_name=hi_name, hi=hi, source=NCCL_ENV))
    for old, new, key in (("NCCL_MAX_NCHANNELS", "NCCL_MAX_CTAS", "nccl_both_max_channels_and_ctas"),
                          ("NCCL_MIN_NCHANNELS", "NCCL_MIN_CTAS", "nccl_both_min_channels_and_ctas")):
        if c.val(old) is not None and c.val(new) is not None:
            out.append(finding(old, "info", "combination", key, old=old, new=new, suggestion=new, source=NCCL_ENV))
    return out


def _old_and_new_names(c: _Env) -> list[Finding]:
    out = []
    for e in VARS.values():
        if e.status != "renamed" or not e.replacement or c.val(e.name) is None or c.val(e.replacement) is None:
            continue
        old_v, new_v = c.val(e.name), c.val(e.replacement)
        same = old_v == new_v or (truth(e, old_v) is not None and truth(e, old_v) == truth(e, new_v))
        if same:
            out.append(finding(e.name, "info", "duplicate", "nccl_old_and_new_same", old=e.name, new=e.replacement,
                               suggestion=e.replacement, source=e.source))
            continue
        key = ("nccl_old_and_new_differ_pytorch" if e.owner == "pytorch" else
               "nccl_old_and_new_differ_ignored" if e.name in ("NCCL_MAX_NRINGS", "NCCL_MIN_NRINGS") else
               "nccl_old_and_new_differ")
        out.append(finding(e.name, "warning", "conflict", key, old=e.name, old_value=old_v, new=e.replacement,
                           new_value=new_v, suggestion=e.replacement, source=e.source))
    fr_old, fr_new = c.val("TORCH_NCCL_TRACE_BUFFER_SIZE"), c.val("TORCH_FR_BUFFER_SIZE")
    if fr_old is not None and fr_new is not None and fr_old != fr_new:
        out.append(finding("TORCH_FR_BUFFER_SIZE", "warning", "conflict", "nccl_fr_sizes_differ", old_value=fr_old,
                           new_value=fr_new, source=PT_FLIGHT_RECORDER_HPP))
    return out


def _flight_recorder(c: _Env) -> list[Finding]:
    """PyTorch 2.13: the dump on timeout is on by default (TORCH_NCCL_DUMP_ON_TIMEOUT), the recorder
    keeps 2000 entries by default (TORCH_FR_BUFFER_SIZE, alias TORCH_NCCL_TRACE_BUFFER_SIZE; the
    process group reads the old name to decide whether to dump), and the monitoring thread writes the
    dump (TORCH_NCCL_ENABLE_MONITORING, default on). A setting that switches one of them off while the
    dump is wanted is a warning when the dump was asked for explicitly, a note when it is the default."""
    out = []
    dump = c.flag("TORCH_NCCL_DUMP_ON_TIMEOUT")
    if dump is False:
        return out
    severity = "warning" if dump else "info"
    for size_name in ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"):
        if c.num(size_name) == 0:
            out.append(finding("TORCH_NCCL_DUMP_ON_TIMEOUT", severity, "conflict", "nccl_dump_without_buffer",
                               size_name=size_name, suggestion=f"{size_name}=2000", source=VARS[size_name].source))
            break
    if c.flag("TORCH_NCCL_ENABLE_MONITORING") is False:
        out.append(finding("TORCH_NCCL_ENABLE_MONITORING", severity, "conflict", "nccl_dump_without_monitoring",
                           source=PT_PGNCCL_HPP))
    return out


def _pytorch(c: _Env) -> list[Finding]:
    out = []
    if c.flag("TORCH_NCCL_DESYNC_DEBUG") and c.val("TORCH_NCCL_ASYNC_ERROR_HANDLING") == "0":
        out.append(finding("TORCH_NCCL_DESYNC_DEBUG", "warning", "conflict", "nccl_desync_without_error_handling",
                           source=PT_PGNCCL_HPP))
    dist_debug = (c.val("TORCH_DISTRIBUTED_DEBUG") or "").upper()
    cpp_level = (c.val("TORCH_CPP_LOG_LEVEL") or "").upper()
    if dist_debug in ("INFO", "DETAIL") and cpp_level not in ("INFO", "0"):
        out.append(finding("TORCH_DISTRIBUTED_DEBUG", "info", "combination", "nccl_dist_debug_needs_cpp_log",
                           level=dist_debug, suggestion="TORCH_CPP_LOG_LEVEL=INFO", source=PT_DISTRIBUTED))
    for r_name, w_name in (("RANK", "WORLD_SIZE"), ("LOCAL_RANK", "LOCAL_WORLD_SIZE")):
        r, w = c.num(r_name), c.num(w_name)
        if r is not None and w is not None and w >= 1 and r >= w:
            out.append(finding(r_name, "error", "conflict", "nccl_rank_not_below_size", r_name=r_name, r=r,
                               w_name=w_name, w=w, last=w - 1, source=VARS[r_name].source))
    return out


def conflicts(env: dict[str, str]) -> list[Finding]:
    """Findings about combinations of the variables in ``env`` (only relevant names)."""
    c = _Env(env)
    return _ib_and_p2p(c) + _logging(c) + _channels(c) + _old_and_new_names(c) + _flight_recorder(c) + _pytorch(c)
