"""Lab 11 — NCCL configuration: six machines, six configurations; the checks, run in the grader's process.

Five exercises are ``.env`` files (``KEY=VALUE`` lines) that the grader reads and never runs. The
grader refuses a symbolic link, a file too large, binary or not UTF-8 before anything here is called
(:func:`dtrain_lab.grading.grader.read_submission`); the text it read is parsed here exactly as
``docker run --env-file`` would (:func:`dtrain_lab.nccl.parse_env_text`-like: the file is parsed from
that text, never opened again), then goes through :func:`dtrain_lab.nccl.lint_env_file`'s findings
(any error or warning is a problem, in the linter's words: a value in quotes or with an inline
comment, which docker keeps literally; LD_PRELOAD, PYTHONPATH, an NCCL plugin...), then through its
scenario's rules, which know the machine: its interfaces, RDMA devices, GPU topology, NCCL version
and what went wrong.

The sixth exercise, ``eval_timeout``, is a program run under the sandbox with a short process-group
timeout: only rank 0 holds the validation set (private, drawn per run), so only a program that
shares it, or shares rank 0's result in time, gets every rank the right mean.
"""
from __future__ import annotations

import math
import os
import re
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field

from dtrain_lab.grading import lab11 as contract
from dtrain_lab.grading.channel import short
from dtrain_lab.grading.exercise import Exercise, problem
from dtrain_lab.i18n import LabError, rendered
from dtrain_lab.nccl import EnvFileError, lint_env_file, nccl_list_selects
from dtrain_lab.nccl.envfile import read_env_file
from dtrain_lab.nccl.vars import VARS

LAB = contract.LAB

# Lint notes (severity "info") that still make a graded configuration wrong.
_COUNTED_NOTES = {"undocumented-variable", "shared-log-file", "passthrough"}


def _part(key: str, **fields) -> LabError:
    """A catalogue fragment used as a field of another message (rendered in the same language)."""
    return LabError(key, **fields)


# ======================================================================= common machinery
@dataclass(frozen=True)
class Scenario:
    """One machine and what a correct configuration for it must (not) contain."""

    name: str
    title: dict
    rules: Callable[[dict], list]                      # env -> [(variable, problem)]
    allowed_debugging: frozenset = frozenset()         # Debugging-section variables this case needs
    debugging_why: dict = field(default_factory=dict)  # variable -> catalogue key replacing the generic one
    debugging_default: str = "lab11_generic_debugging"  # this scenario's generic message ({var} in it)
    nccl_version: str | None = None                    # the NCCL the machine runs, when it matters


def _version(v: str) -> tuple:
    return tuple(int(x) for x in re.findall(r"\d+", v)[:3])


def _truthy(value: str | None) -> bool:
    return value is not None and value.strip().lower() in ("1", "y", "yes", "t", "true")


def _late_equals(var: str, spec: str) -> list:
    """``=`` written in front of a later item: NCCL reads it as part of that item's name."""
    body = spec.removeprefix("^")
    late = [i for i in body.split(",")[1:] if i.startswith("=")]
    if not late:
        return []
    return [(var, problem("lab11_late_equals", var=var, spec=spec, late=", ".join(late)))]


def _parsed(text: str, path):
    """The file as ``docker run --env-file`` reads it, from the text the grader already read (the
    file is not opened again: a file swapped for a link after the grader's check is never read)."""
    with tempfile.TemporaryDirectory(prefix="dtrain-lab11-") as tmp:
        copy = os.path.join(tmp, os.path.basename(str(path)) or "submission.env")
        with open(copy, "w", encoding="utf-8") as f:
            f.write(text)
        return read_env_file(copy, refuse_symlinks=True)


def check_env(scenario: Scenario, text: str, path) -> list:
    """Every problem of one ``.env`` submission: the linter's, then the scenario's."""
    try:
        parsed = _parsed(text, path)
    except EnvFileError as exc:
        fields = {**exc.fields, "path": os.path.basename(str(path))}   # the learner's file, not the copy
        return [{**problem(exc.key, **fields), "error": True}]
    env = parsed.values
    problems = []
    for key, value in env.items():
        if "$" in value or "`" in value:
            problems.append(problem("lab11_literal_value", name=key, value=short(value, 60)))
    findings = [f for f in lint_env_file(parsed) if f.severity in ("error", "warning") or f.code in _COUNTED_NOTES]
    # a variable the linter already explains is not explained twice, unless the linter only spoke of
    # its combination with another one (the scenario says why this machine needs something else)
    flagged = {f.var for f in findings if f.code != "conflict"}
    problems += [f.rendered() for f in findings]

    specific = [(var, p) for var, p in scenario.rules(env) if var not in flagged]
    mentioned = {var for var, _ in specific} | flagged
    problems += [p for _, p in specific]

    for var in sorted(env):
        entry = VARS.get(var)
        if entry is None or var in mentioned:
            continue
        if scenario.nccl_version and entry.owner == "nccl" and entry.since \
                and _version(entry.since) > _version(scenario.nccl_version):
            problems.append(problem("lab11_too_new", var=var, since=entry.since, version=scenario.nccl_version))
        elif entry.debugging and var not in scenario.allowed_debugging:
            problems.append(problem(scenario.debugging_why.get(var, scenario.debugging_default), var=var))
    if scenario.nccl_version and (env.get("NCCL_DEBUG") or "").strip().upper() == "ATTN" \
            and "NCCL_DEBUG" not in mentioned and _version(scenario.nccl_version) < (2, 32):
        problems.append(problem("lab11_attn_too_new", version=scenario.nccl_version))
    return problems


def _env_exercise(scenario: Scenario) -> Exercise:
    return Exercise(id=f"lab11.{scenario.name}", lab=LAB, entry="", filename=f"lab11_{scenario.name}.env",
                    title=scenario.title, world_sizes=(), timeout=0,
                    static_check=lambda text, path, s=scenario: check_env(s, text, path))


# ================================================================== 1. two nodes, plain Ethernet
# node-a and node-b, same interface names; node-a's addresses (node-b ends in .22).
ETH_INTERFACES = ("lo", "eno1", "ens1f0", "ens1f1", "docker0")
ETH_TRAINING = "ens1f0"
ETH_ROLES = {"lo": "lab11_eth_role_lo", "eno1": "lab11_eth_role_eno1", "ens1f1": "lab11_eth_role_ens1f1",
             "docker0": "lab11_eth_role_docker0"}


def _ifname_rules(var: str, spec: str, interfaces, want: str, roles: dict) -> list:
    out = _late_equals(var, spec)
    selected = [n for n in interfaces if nccl_list_selects(spec, n)]
    if not selected:
        out.append((var, problem("lab11_ifname_none", var=var, spec=spec, interfaces=", ".join(interfaces))))
        return out
    if want not in selected:
        out.append((var, problem("lab11_ifname_not_training", var=var, spec=spec, want=want)))
    exact = spec.lstrip("^").startswith("=")
    for name in selected:
        if name == want:
            continue
        prefix = ""
        if spec.startswith("^"):
            prefix = _part("lab11_prefix_caret")
        elif not exact and name not in spec.split(","):
            prefix = _part("lab11_prefix_prefix")
        out.append((var, problem("lab11_ifname_also", var=var, spec=spec, name=name, role=_part(roles[name]),
                                 prefix=prefix)))
    return out


def _two_nodes(env: dict) -> list:
    out = []
    spec = env.get("NCCL_SOCKET_IFNAME")
    if spec is None:
        out.append(("NCCL_SOCKET_IFNAME", problem("lab11_socket_ifname_unset")))
    else:
        out += _ifname_rules("NCCL_SOCKET_IFNAME", spec, ETH_INTERFACES, ETH_TRAINING, ETH_ROLES)
    gspec = env.get("GLOO_SOCKET_IFNAME")
    if gspec is None:
        out.append(("GLOO_SOCKET_IFNAME", problem("lab11_gloo_ifname_unset")))
        return out
    for name in [n.strip() for n in gspec.split(",") if n.strip()]:
        if name not in ETH_INTERFACES:
            out.append(("GLOO_SOCKET_IFNAME", problem("lab11_gloo_no_such", name=short(name, 40))))
        elif name != ETH_TRAINING:
            out.append(("GLOO_SOCKET_IFNAME", problem("lab11_gloo_wrong", name=name, role=_part(ETH_ROLES[name]))))
    return out


TWO_NODES = Scenario(
    name="two_nodes", title=rendered("lab11_title_two_nodes"),
    rules=_two_nodes, debugging_why={"NCCL_IB_DISABLE": "lab11_eth_ib_disable"})


# ==================================================================================== 2. RoCE
ROCE_NCCL = "2.18.3"
ROCE_HCAS = tuple(f"mlx5_{i}" for i in range(12))
ROCE_COMPUTE = ROCE_HCAS[:8]
ROCE_ROLES = {"mlx5_8": "lab11_roce_role_frontend", "mlx5_9": "lab11_roce_role_frontend",
              "mlx5_10": "lab11_roce_role_storage", "mlx5_11": "lab11_roce_role_storage"}
ROCE_GID = 3          # show_gids: RoCE v2 with the rail's IPv4 address
ROCE_TC = 106         # the network team's traffic class for RDMA (the lossless queue)
ROCE_GID_WHY = {0: "lab11_gid_why_0", 1: "lab11_gid_why_1", 2: "lab11_gid_why_2"}


def _roce(env: dict) -> list:
    out = []
    if _truthy(env.get("NCCL_IB_DISABLE")):
        out.append(("NCCL_IB_DISABLE", problem("lab11_roce_ib_disable")))
    if (env.get("NCCL_NET") or "").strip().lower() == "socket":
        out.append(("NCCL_NET", problem("lab11_roce_net_socket")))

    spec = env.get("NCCL_IB_HCA")
    if spec is None:
        out.append(("NCCL_IB_HCA", problem("lab11_roce_hca_unset")))
    else:
        out += _late_equals("NCCL_IB_HCA", spec)
        selected = [d for d in ROCE_HCAS if nccl_list_selects(spec, d, port=1)]
        missing = [d for d in ROCE_COMPUTE if d not in selected]
        if missing:
            out.append(("NCCL_IB_HCA", problem("lab11_roce_hca_missing", spec=spec, missing=", ".join(missing))))
        extra = [d for d in selected if d not in ROCE_COMPUTE]
        hint = "" if spec.lstrip("^").startswith("=") else _part("lab11_roce_hca_hint")
        for role in sorted({ROCE_ROLES[d] for d in extra}):
            devices = [d for d in extra if ROCE_ROLES[d] == role]
            out.append(("NCCL_IB_HCA", problem("lab11_roce_hca_extra", spec=spec, extra=", ".join(devices),
                                               role=_part(role), hint=hint)))

    gid = env.get("NCCL_IB_GID_INDEX")
    if gid is None:
        out.append(("NCCL_IB_GID_INDEX", problem("lab11_roce_gid_unset", version=ROCE_NCCL, gid_index=ROCE_GID)))
    else:
        try:
            n = int(gid.strip(), 0)
        except ValueError:
            n = None
        if n is not None and n != ROCE_GID:
            if n in ROCE_GID_WHY:
                why = _part(ROCE_GID_WHY[n])
            elif n < 0:
                why = _part("lab11_gid_why_negative", version=ROCE_NCCL)
            else:
                why = _part("lab11_gid_why_range")
            out.append(("NCCL_IB_GID_INDEX", problem("lab11_roce_gid_wrong", gid=gid, why=why, gid_index=ROCE_GID)))

    tc = env.get("NCCL_IB_TC")
    if tc is None:
        out.append(("NCCL_IB_TC", problem("lab11_roce_tc_unset", tc_class=ROCE_TC)))
    elif tc.strip() != str(ROCE_TC):
        out.append(("NCCL_IB_TC", problem("lab11_roce_tc_wrong", tc=short(tc, 40), tc_class=ROCE_TC)))
    return out


ROCE = Scenario(
    name="roce", title=rendered("lab11_title_roce"),
    rules=_roce, nccl_version=ROCE_NCCL,
    allowed_debugging=frozenset({"NCCL_IB_DISABLE"}))   # =0 is harmless; =1 is rejected by _roce


# ============================================================================ 3. a PCIe-only box
PCIE_UUIDS = ("GPU-5b1c0e3a-8d2f-4a61-9c07-2e4f1d6a9b30", "GPU-a7e93c52-1f04-4b8e-b6d1-93c2e8f0a415",
              "GPU-0c4d8f21-6e9a-4d37-8a52-c1b7f3e6d982", "GPU-e2f61a97-3b58-4c0d-9e14-7a8d5c2b6f03")
PCIE_BUSY = 0                 # the inference server's GPU
PCIE_PAIR = (2, 3)            # behind one PCIe switch (PIX); 1 reaches them through SYS only


def _gpu_index(item: str) -> int | None:
    item = item.strip()
    if re.fullmatch(r"\d+", item):
        i = int(item)
        return i if i < len(PCIE_UUIDS) else None
    hits = [i for i, u in enumerate(PCIE_UUIDS) if item.startswith("GPU-") and u.startswith(item)]
    return hits[0] if len(hits) == 1 else None


def _pcie(env: dict) -> list:
    out = []
    cvd = env.get("CUDA_VISIBLE_DEVICES")
    if cvd is None:
        out.append(("CUDA_VISIBLE_DEVICES", problem("lab11_pcie_cvd_unset")))
    else:
        items = [i for i in cvd.split(",") if i.strip()]
        idx = [_gpu_index(i) for i in items]
        unknown = [i.strip() for i, g in zip(items, idx) if g is None]
        gpus = sorted({g for g in idx if g is not None})
        if unknown:
            out.append(("CUDA_VISIBLE_DEVICES", problem("lab11_pcie_cvd_unknown", unknown=short(", ".join(unknown), 80))))
        elif len(gpus) != 2:
            out.append(("CUDA_VISIBLE_DEVICES", problem("lab11_pcie_cvd_count", cvd=short(cvd, 80), n=len(gpus))))
        elif PCIE_BUSY in gpus:
            out.append(("CUDA_VISIBLE_DEVICES", problem("lab11_pcie_gpu0_busy")))
        elif tuple(gpus) != PCIE_PAIR:
            out.append(("CUDA_VISIBLE_DEVICES", problem("lab11_pcie_sys_pair", a=gpus[0], b=gpus[1])))
    order = env.get("CUDA_DEVICE_ORDER")
    if order is not None and order.strip() not in ("PCI_BUS_ID", "FASTEST_FIRST"):
        out.append(("CUDA_DEVICE_ORDER", problem("lab11_pcie_device_order", order=short(order, 40))))
    if _truthy(env.get("NCCL_P2P_DISABLE")):
        out.append(("NCCL_P2P_DISABLE", problem("lab11_pcie_p2p_disable")))
    return out


PCIE_BOX = Scenario(
    name="pcie_box", title=rendered("lab11_title_pcie_box"),
    rules=_pcie, debugging_why={"NCCL_P2P_LEVEL": "lab11_pcie_p2p_level"})


# ==================================================================== 4. a container, tiny /dev/shm
SHM_NCCL = "2.19.3"


def _small_shm(env: dict) -> list:
    out = []
    if _truthy(env.get("NCCL_SHM_DISABLE")):
        out.append(("NCCL_SHM_DISABLE", problem("lab11_shm_disable")))
    if _truthy(env.get("NCCL_P2P_DISABLE")):
        out.append(("NCCL_P2P_DISABLE", problem("lab11_shm_p2p_disable")))
    debug = env.get("NCCL_DEBUG")
    level = (debug or "").strip().upper()
    if debug is None or level == "VERSION":
        out.append(("NCCL_DEBUG", problem("lab11_shm_keep_warn")))
    elif level == "TRACE":
        out.append(("NCCL_DEBUG", problem("lab11_shm_trace")))
    return out


SMALL_SHM = Scenario(
    name="small_shm", title=rendered("lab11_title_small_shm"),
    rules=_small_shm, nccl_version=SHM_NCCL)


# ====================================================================== 5. a hang to debug
def _int(value: str | None) -> int | None:
    try:
        return int(str(value).strip())
    except ValueError:
        return None


def _hang_debug(env: dict) -> list:
    out = []
    debug = env.get("NCCL_DEBUG")
    level = (debug or "").strip().upper()
    if debug is None:
        out.append(("NCCL_DEBUG", problem("lab11_hang_debug_unset")))
    elif level in ("VERSION", "WARN", "ATTN"):
        out.append(("NCCL_DEBUG", problem("lab11_hang_debug_quiet", debug=short(debug, 20))))
    elif level == "TRACE":
        out.append(("NCCL_DEBUG", problem("lab11_hang_trace")))

    # PyTorch 2.13 keeps 2000 flight-recorder events and dumps them on a timeout by default: nothing to
    # set, but nothing may switch it off (a buffer of 0, the dump off, or the thread that writes it off)
    for name in ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"):
        if name in env and _int(env[name]) == 0:
            out.append((name, problem("lab11_hang_recorder_off", name=name)))
    for name in ("TORCH_NCCL_DUMP_ON_TIMEOUT", "TORCH_NCCL_ENABLE_MONITORING"):
        if name in env and not _truthy(env[name]):
            out.append((name, problem("lab11_hang_dump_off", name=name, value=short(env[name], 20))))

    dist_debug = (env.get("TORCH_DISTRIBUTED_DEBUG") or "").strip().upper()
    if dist_debug != "DETAIL":
        now = _part("lab11_hang_now_set", level=short(dist_debug, 20)) if dist_debug else _part("lab11_hang_now_unset")
        out.append(("TORCH_DISTRIBUTED_DEBUG", problem("lab11_hang_dist_debug", now=now)))

    if (env.get("TORCH_NCCL_ASYNC_ERROR_HANDLING") or "").strip() == "0":
        out.append(("TORCH_NCCL_ASYNC_ERROR_HANDLING", problem("lab11_hang_async_off")))
    if "NCCL_IB_TIMEOUT" in env:
        out.append(("NCCL_IB_TIMEOUT", problem("lab11_hang_ib_timeout")))
    return out


HANG_DEBUG = Scenario(
    name="hang_debug", title=rendered("lab11_title_hang_debug"),
    rules=_hang_debug, debugging_default="lab11_hang_debugging_default")


# =========================================================== 6. a long rank-0 evaluation (launched)
def _check_eval(run, rank, result):
    samples = run.inputs[0]["val"]
    want = sum(contract.val_score(s) for s in samples) / contract.VAL_SIZE
    try:
        ok = math.isclose(float(result), want, rel_tol=1e-6, abs_tol=1e-6)
    except (TypeError, ValueError):
        ok = False
    return [] if ok else [problem("lab11_eval_mean", want=f"{want:.6g}", got=short(result))]


_ENV_NAMES = re.compile(r"[\"']((?:TORCH_)?NCCL_[A-Z_]+|TORCH_DISTRIBUTED_DEBUG|GLOO_[A-Z_]+)[\"']")
_NO_SUCH = ("NCCL_TIMEOUT", "TORCH_NCCL_TIMEOUT")
_BLOCKING = ("TORCH_NCCL_BLOCKING_WAIT", "NCCL_BLOCKING_WAIT")


def _explain_eval(outcome: str, feedback: str, source: str) -> list:
    out = []
    if "timed out" in feedback.lower() or outcome == "hang":
        out.append(problem("lab11_eval_timeout_why", timeout=contract.PG_TIMEOUT_S,
                           alone=contract.SECONDS_PER_SAMPLE * contract.VAL_SIZE, ms=contract.PG_TIMEOUT_S * 1000))
    names = sorted(set(_ENV_NAMES.findall(source)))
    for name in names:
        if name in _NO_SUCH:
            out.append(problem("lab11_eval_no_such_var", name=name))
        elif name == "NCCL_IB_TIMEOUT":
            out.append(problem("lab11_eval_ib_timeout"))
        elif name in _BLOCKING:
            out.append(problem("lab11_eval_blocking_wait", name=name))
    others = [n for n in names if n not in _NO_SUCH + _BLOCKING + ("NCCL_IB_TIMEOUT",)]
    if others:
        out.append(problem("lab11_eval_env_vars", names=", ".join(others)))
    return out


EXERCISES = [_env_exercise(s) for s in (TWO_NODES, ROCE, PCIE_BOX, SMALL_SHM, HANG_DEBUG)] + [
    Exercise(id="lab11.eval_timeout", lab=LAB, entry="run", filename="lab11_eval_timeout.py", timeout=20,
             title=rendered("lab11_title_eval_timeout"),
             checks=[_check_eval], world_sizes=(2, 3), pg_timeout=contract.PG_TIMEOUT_S, explain=_explain_eval,
             make_inputs=contract.make_inputs),
]
