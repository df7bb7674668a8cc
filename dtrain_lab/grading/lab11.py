"""Lab 11 — NCCL configuration: six machines, six configurations to write.

Five exercises are ``.env`` files (``KEY=VALUE`` lines) that the grader reads and never runs: each
file goes through :func:`dtrain_lab.nccl.lint_env` first (any error or warning is a problem, in the
linter's words), then through its scenario's rules, which know the machine: its interfaces, RDMA
devices, GPU topology, NCCL version and what went wrong. Every rule explains the variable it
rejects. The sixth exercise, ``eval_timeout``, is a program: the harness runs it with a short
process-group timeout, so only a real fix finishes.

The machines are described in the lab notebook (solutions/_source/lab_11_nccl.md); the constants
below are the same machines, as data. Facts about variables come from ``dtrain_lab.nccl.vars``
(the official documentation); a few come from NCCL's source where the docs are silent, and say so.
"""
from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from dtrain_lab.nccl import EnvFileError, lint_env, nccl_list_selects, parse_env_file
from dtrain_lab.nccl.vars import VARS
from dtrain_lab.grading.registry import Exercise, problem, register

LAB = "lab_11"

# Lint notes (severity "info") that still make a graded configuration wrong.
_COUNTED_NOTES = {"undocumented-variable", "shared-log-file"}


# ======================================================================= common machinery
@dataclass(frozen=True)
class Scenario:
    """One machine and what a correct configuration for it must (not) contain."""

    name: str
    title: dict
    rules: Callable[[dict], list]                      # env -> [(variable, problem)]
    allowed_debugging: frozenset = frozenset()         # Debugging-section variables this case needs
    debugging_why: dict = field(default_factory=dict)  # variable -> problem replacing the generic one
    debugging_default: dict | None = None              # this scenario's generic text ({var} in it)
    nccl_version: str | None = None                    # the NCCL the machine runs, when it matters


def _version(v: str) -> tuple:
    return tuple(int(x) for x in re.findall(r"\d+", v)[:3])


def _truthy(value: str | None) -> bool:
    return value is not None and value.strip().lower() in ("1", "y", "yes", "t", "true")


def _shown(value: str, n: int = 60) -> str:
    return repr(value if len(value) <= n else value[:n] + "…")


_GENERIC_DEBUGGING = {
    "zh": "{var} 属于 NCCL 文档里的 Debugging 类变量：只用于实验或临时绕过问题，问题解决后就该删掉，不要留在作业配置里"
          "（强行指定会让 NCCL 无法自己选择合适的设置）。这个场景用不到它。",
    "en": "{var} is one of the variables NCCL's docs list under Debugging: for experiments and workarounds, "
          "to be removed once the issue is solved, not kept in a job's configuration (forcing it stops NCCL "
          "from choosing for itself). Nothing in this scenario needs it.",
}


def _late_equals(var: str, spec: str) -> list:
    """``=`` written in front of a later item: NCCL reads it as part of that item's name."""
    body = spec.removeprefix("^")
    late = [i for i in body.split(",")[1:] if i.startswith("=")]
    if not late:
        return []
    return [(var, problem(
        f"{var}={spec}：= 只在整个列表最前面写一次，对后面每一项都生效（文档的例子是 =eth0,eth1）；"
        f"写在后面某一项前面的 =（{', '.join(late)}）会被当成名字的一部分，于是那一项什么也匹配不到。",
        f"{var}={spec}: the = is written once, at the start of the list, and applies to every item (the "
        f"docs' example is =eth0,eth1); an = in front of a later item ({', '.join(late)}) becomes part of "
        f"that name, which then matches nothing."))]


def check_env(scenario: Scenario, text: str, path) -> list:
    """Every problem of one ``.env`` submission: the linter's, then the scenario's."""
    try:
        env = parse_env_file(path)
    except EnvFileError as exc:
        return [{"zh": exc.message("zh"), "en": exc.message("en"), "error": True}]
    problems = []
    for key, value in env.items():
        if "$" in value or "`" in value:
            problems.append(problem(
                f"{key}={_shown(value)}：这个文件里的值按字面读取，$(...)、${{...}}、`...` 都不会被展开或执行"
                f"（评分器不会，docker --env-file 和 NCCL 也不会）。请直接写出值本身。",
                f"{key}={_shown(value)}: values in this file are read literally; nothing expands or runs "
                f"$(...), ${{...}} or `...` (not the grader, not docker --env-file, not NCCL). Write the value "
                f"itself."))
    findings = [f for f in lint_env(env) if f.severity in ("error", "warning") or f.code in _COUNTED_NOTES]
    # a variable the linter already explains is not explained twice, unless the linter only spoke of
    # its combination with another one (the scenario says why this machine needs something else)
    flagged = {f.var for f in findings if f.code != "conflict"}
    problems += [problem(f.message_zh, f.message_en) for f in findings]

    specific = [(var, p) for var, p in scenario.rules(env) if var not in flagged]
    mentioned = {var for var, _ in specific} | flagged
    problems += [p for _, p in specific]

    for var in sorted(env):
        entry = VARS.get(var)
        if entry is None or var in mentioned:
            continue
        if scenario.nccl_version and entry.owner == "nccl" and entry.since \
                and _version(entry.since) > _version(scenario.nccl_version):
            problems.append(problem(
                f"{var} 是 NCCL {entry.since} 才加入的变量，这台机器上的 NCCL {scenario.nccl_version} 根本不读它。",
                f"{var} was added in NCCL {entry.since}; the NCCL {scenario.nccl_version} on this machine does "
                f"not read it."))
        elif entry.debugging and var not in scenario.allowed_debugging:
            why = scenario.debugging_why.get(var)
            if why is None:
                template = scenario.debugging_default or _GENERIC_DEBUGGING
                why = problem(template["zh"].format(var=var), template["en"].format(var=var))
            problems.append(why)
    if scenario.nccl_version and (env.get("NCCL_DEBUG") or "").strip().upper() == "ATTN" \
            and "NCCL_DEBUG" not in mentioned and _version(scenario.nccl_version) < (2, 32):
        problems.append(problem(
            f"NCCL_DEBUG=ATTN 需要 NCCL 2.32 及以上；这里的 NCCL {scenario.nccl_version} 不认识它，结果是什么调试信息都不打印。",
            f"NCCL_DEBUG=ATTN needs NCCL 2.32 or later; NCCL {scenario.nccl_version} here does not know it and "
            f"prints no debug output at all."))
    return problems


def _register_env(scenario: Scenario) -> None:
    register(Exercise(
        id=f"lab11.{scenario.name}", lab=LAB, entry="", filename=f"lab11_{scenario.name}.env",
        title=scenario.title, world_sizes=(), timeout=0,
        static_check=lambda text, path, s=scenario: check_env(s, text, path)))


# ================================================================== 1. two nodes, plain Ethernet
# node-a and node-b, same interface names; node-a's addresses (node-b ends in .22).
ETH_INTERFACES = ("lo", "eno1", "ens1f0", "ens1f1", "docker0")
ETH_TRAINING = "ens1f0"
ETH_ROLES = {
    "lo": ("回环网卡，只能连到本机", "the loopback interface, which only reaches this machine"),
    "eno1": ("1 GbE 管理网（ssh、监控），比训练网慢 100 倍",
             "the 1 GbE management network (ssh, monitoring), 100 times slower than the training network"),
    "ens1f1": ("25 GbE 的 NFS 存储网，不是训练网", "the 25 GbE NFS storage network, not the training network"),
    "docker0": ("docker 网桥，另一台机器访问不到", "the docker bridge, which the other node cannot reach"),
}


def _ifname_rules(var: str, spec: str, interfaces, want: str, roles: dict) -> list:
    out = _late_equals(var, spec)
    selected = [n for n in interfaces if nccl_list_selects(spec, n)]
    if not selected:
        out.append((var, problem(
            f"{var}={spec} 在这两台机器上一块网卡也选不中（ip -brief addr 列出的是 {', '.join(interfaces)}），"
            f"NCCL 会找不到可用的网卡。",
            f"{var}={spec} selects no interface of these nodes (ip -brief addr lists {', '.join(interfaces)}): "
            f"NCCL would find no interface to use.")))
        return out
    if want not in selected:
        out.append((var, problem(f"{var}={spec} 没有选中训练网 {want}（100 GbE）。",
                                 f"{var}={spec} does not select {want}, the 100 GbE training network.")))
    exact = spec.lstrip("^").startswith("=")
    for name in selected:
        if name == want:
            continue
        zh, en = roles[name]
        prefix_zh = prefix_en = ""
        if spec.startswith("^"):
            prefix_zh = "以 ^ 开头的列表表示“除了这些都用”：没列出来的网卡全都会被用上，lo 和 docker0 也不例外（一旦设置了这个变量，NCCL 默认跳过它们的规则就不再适用）。"
            prefix_en = (" A list starting with ^ means \"everything except these\": every interface not listed "
                         "is used, lo and docker0 included (once the variable is set, NCCL's default of skipping "
                         "them no longer applies).")
        elif not exact and name not in spec.split(","):
            prefix_zh = "没有 = 时每一项都是前缀，会选中所有以它开头的网卡；而一旦设置了 NCCL_SOCKET_IFNAME，NCCL 就不再自动挑选，可能用上所有匹配的网卡。"
            prefix_en = (" Without a leading = every item is a prefix and selects every interface starting with "
                         "it; and once NCCL_SOCKET_IFNAME is set, NCCL no longer picks by itself and may use "
                         "every interface that matches.")
        out.append((var, problem(f"{var}={spec} 还选中了 {name}：{zh}。{prefix_zh}",
                                 f"{var}={spec} also selects {name}: {en}.{prefix_en}")))
    return out


def _two_nodes(env: dict) -> list:
    out = []
    spec = env.get("NCCL_SOCKET_IFNAME")
    if spec is None:
        out.append(("NCCL_SOCKET_IFNAME", problem(
            "没有设置 NCCL_SOCKET_IFNAME：NCCL 会自己挑网卡，上次它用上了除 lo 和 docker 之外所有 UP 的网卡，"
            "连 1 GbE 的管理网 eno1 也在内（日志里的 NET/Socket : Using [0]eno1 ... 就是证据），bootstrap 也走的 eno1。"
            "请指定训练网 ens1f0。",
            "NCCL_SOCKET_IFNAME is not set: NCCL picks interfaces by itself, and last time it took every interface "
            "that is up except lo and docker, the 1 GbE management port eno1 included (see NET/Socket : Using "
            "[0]eno1 ... in the log), and bootstrapped over eno1. Name the training network, ens1f0.")))
    else:
        out += _ifname_rules("NCCL_SOCKET_IFNAME", spec, ETH_INTERFACES, ETH_TRAINING, ETH_ROLES)
    gspec = env.get("GLOO_SOCKET_IFNAME")
    if gspec is None:
        out.append(("GLOO_SOCKET_IFNAME", problem(
            "没有设置 GLOO_SOCKET_IFNAME：train.py 用一个 gloo 进程组收集各 rank 的指标，Gloo 不读 NCCL_SOCKET_IFNAME，"
            "默认用主机名解析出来的地址，也就是 eno1 上的 10.10.3.21（见 getent hosts）。请设成 ens1f0。",
            "GLOO_SOCKET_IFNAME is not set: train.py gathers metrics through a gloo process group, and Gloo does "
            "not read NCCL_SOCKET_IFNAME; by default it uses the address the hostname resolves to, 10.10.3.21 on "
            "eno1 (see getent hosts). Set it to ens1f0.")))
        return out
    names = [n.strip() for n in gspec.split(",") if n.strip()]
    for name in names:
        if name not in ETH_INTERFACES:
            out.append(("GLOO_SOCKET_IFNAME", problem(
                f"GLOO_SOCKET_IFNAME：这两台机器上没有叫 {name} 的网卡。Gloo 按完整的网卡名查找（不是 NCCL 那种前缀，也没有 ^ 和 =），"
                f"找不到时作业一启动就报错：Unable to find address for: {name}。",
                f"GLOO_SOCKET_IFNAME: there is no interface called {name} on these nodes. Gloo looks up whole "
                f"interface names (no NCCL-style prefixes, no ^ or =) and fails at start-up with "
                f"\"Unable to find address for: {name}\" when there is none.")))
        elif name != ETH_TRAINING:
            zh, en = ETH_ROLES[name]
            out.append(("GLOO_SOCKET_IFNAME", problem(f"GLOO_SOCKET_IFNAME 选了 {name}：{zh}。",
                                                      f"GLOO_SOCKET_IFNAME names {name}: {en}.")))
    return out


_register_env(Scenario(
    name="two_nodes",
    title={"en": "1 · Two nodes on plain Ethernet", "zh": "1 · 两台机器，普通以太网"},
    rules=_two_nodes,
    debugging_why={"NCCL_IB_DISABLE": problem(
        "这两台机器没有任何 RDMA 设备（ibv_devinfo 什么也没找到），NCCL 本来就只能走 socket，NCCL_IB_DISABLE 什么也不改变；"
        "它又是 Debugging 类变量，文档建议不要留在配置里。",
        "These nodes have no RDMA device (ibv_devinfo finds none): NCCL uses its socket transport anyway, so "
        "NCCL_IB_DISABLE changes nothing, and it is a Debugging variable the docs say not to keep in a "
        "configuration.")},
))


# ==================================================================================== 2. RoCE
ROCE_NCCL = "2.18.3"
ROCE_HCAS = tuple(f"mlx5_{i}" for i in range(12))
ROCE_COMPUTE = ROCE_HCAS[:8]
_FRONTEND = ("前端网络 bond0 的成员（2×25 GbE），不在计算网络上",
             "a member of the frontend bond0 (2×25 GbE), not on the compute fabric")
_STORAGE = ("存储网络的网卡（100 GbE），不在计算网络上", "a storage-network port (100 GbE), not on the compute fabric")
ROCE_ROLES = {"mlx5_8": _FRONTEND, "mlx5_9": _FRONTEND, "mlx5_10": _STORAGE, "mlx5_11": _STORAGE}
ROCE_GID = 3          # show_gids: RoCE v2 with the rail's IPv4 address
ROCE_TC = 106         # the network team's traffic class for RDMA (the lossless queue)
ROCE_GID_WHY = {
    0: (("索引 0 是链路本地地址 fe80:: 加 RoCE v1，两样都过不了机架之间的路由器；不设置这个变量时 NCCL 2.18.3 "
         "用的就是它，这正是昨晚失败的原因"),
        ("index 0 is the link-local fe80:: address with RoCE v1, and neither crosses the routers between the "
         "racks; it is also what NCCL 2.18.3 uses when the variable is not set, which is last night's failure")),
    1: ("索引 1 是 RoCE v2，但地址是链路本地的 fe80::，路由器不会转发",
        "index 1 is RoCE v2, but with the link-local fe80:: address, which routers do not forward"),
    2: ("索引 2 的 IPv4 地址是对的，但它是 RoCE v1：直接跑在以太网帧上，无法跨越路由；机架之间是三层路由网络，要用 RoCE v2",
        ("index 2 has the right IPv4 address but is RoCE v1, which runs directly on Ethernet frames and cannot "
         "be routed; the racks are joined by a routed (layer 3) fabric, which needs RoCE v2")),
}


def _roce(env: dict) -> list:
    out = []
    if _truthy(env.get("NCCL_IB_DISABLE")):
        out.append(("NCCL_IB_DISABLE", problem(
            "NCCL_IB_DISABLE=1 关掉了 IB/RoCE 传输：在这套 RoCE 网络上 NCCL 会退回 TCP socket，8 条 400 GbE 的 RDMA 通道"
            "白白闲着。昨晚的失败要靠正确的 GID 索引来解决，而不是关掉 RDMA。",
            "NCCL_IB_DISABLE=1 turns the IB/RoCE transport off: on this RoCE fabric NCCL falls back to TCP sockets "
            "and the eight 400 GbE RDMA rails sit idle. Last night's failure is fixed by the right GID index, not "
            "by switching RDMA off.")))
    if (env.get("NCCL_NET") or "").strip().lower() == "socket":
        out.append(("NCCL_NET", problem(
            "NCCL_NET=Socket 强制使用 socket 网络模块，RDMA 网卡就完全用不上了。",
            "NCCL_NET=Socket forces the socket network module: the RDMA NICs go unused.")))

    spec = env.get("NCCL_IB_HCA")
    if spec is None:
        out.append(("NCCL_IB_HCA", problem(
            "没有设置 NCCL_IB_HCA：NCCL 会考虑它找到的所有 RDMA 设备，包括 mlx5_8–mlx5_11（前端和存储网络的网卡）。"
            "请只列出计算网络的 mlx5_0 到 mlx5_7。",
            "NCCL_IB_HCA is not set: NCCL considers every RDMA device it finds, the frontend and storage ports "
            "mlx5_8-mlx5_11 included. List only the compute rails, mlx5_0 to mlx5_7.")))
    else:
        out += _late_equals("NCCL_IB_HCA", spec)
        selected = [d for d in ROCE_HCAS if nccl_list_selects(spec, d, port=1)]
        missing = [d for d in ROCE_COMPUTE if d not in selected]
        if missing:
            out.append(("NCCL_IB_HCA", problem(
                f"NCCL_IB_HCA={spec} 漏掉了 {', '.join(missing)}（每块网卡只有端口 1）：每块 GPU 都有自己的一条 400 GbE 通道，"
                f"8 条都要用上。",
                f"NCCL_IB_HCA={spec} leaves out {', '.join(missing)} (each of these devices has port 1 only): every "
                f"GPU has its own 400 GbE rail, and NCCL should use all eight.")))
        extra = [d for d in selected if d not in ROCE_COMPUTE]
        if extra:
            exact = spec.lstrip("^").startswith("=")
            hint_zh = "" if exact else "没有 = 时名字按前缀匹配：mlx5_1 同时会选中 mlx5_10 和 mlx5_11，所以文档建议总是加上 =。"
            hint_en = "" if exact else (" Without = names are prefixes: mlx5_1 also selects mlx5_10 and mlx5_11, "
                                        "which is why the docs recommend always adding =.")
            roles = "；".join(f"{d} 是{ROCE_ROLES[d][0]}" for d in extra)
            roles_en = "; ".join(f"{d} is {ROCE_ROLES[d][1]}" for d in extra)
            out.append(("NCCL_IB_HCA", problem(
                f"NCCL_IB_HCA={spec} 还选中了 {', '.join(extra)}：{roles}。{hint_zh}",
                f"NCCL_IB_HCA={spec} also selects {', '.join(extra)}: {roles_en}.{hint_en}")))

    gid = env.get("NCCL_IB_GID_INDEX")
    if gid is None:
        out.append(("NCCL_IB_GID_INDEX", problem(
            f"没有设置 NCCL_IB_GID_INDEX：NCCL 2.21 起才会自己选 GID；这里的 NCCL {ROCE_NCCL} 不设置时用索引 0"
            f"（NCCL 源码里的默认值），即链路本地的 fe80:: 地址加 RoCE v1，跨不过机架之间的路由。"
            f"show_gids 里 RoCE v2 加本机 IPv4 地址的那一行是索引 {ROCE_GID}。",
            f"NCCL_IB_GID_INDEX is not set: NCCL only chooses the GID itself since 2.21; NCCL {ROCE_NCCL} here "
            f"uses index 0 when it is unset (the default in NCCL's source), the link-local fe80:: address with "
            f"RoCE v1, which cannot cross the routed fabric between the racks. In show_gids, the row with RoCE "
            f"v2 and the port's IPv4 address is index {ROCE_GID}.")))
    else:
        try:
            n = int(gid.strip(), 0)
        except ValueError:
            n = None
        if n is not None and n != ROCE_GID:
            if n in ROCE_GID_WHY:
                zh, en = ROCE_GID_WHY[n]
            elif n < 0:
                zh = f"-1 表示“由 NCCL 自动选择”，但这要 NCCL 2.21 及以上；NCCL {ROCE_NCCL} 不会自动选"
                en = f"-1 means \"let NCCL choose\" only from NCCL 2.21 on; NCCL {ROCE_NCCL} does not choose"
            else:
                zh = "这些端口的 show_gids 只列出了索引 0 到 3"
                en = "show_gids lists indices 0 to 3 only on these ports"
            out.append(("NCCL_IB_GID_INDEX", problem(
                f"NCCL_IB_GID_INDEX={gid}：{zh}。应该用索引 {ROCE_GID}（RoCE v2，本机的 IPv4 地址）。",
                f"NCCL_IB_GID_INDEX={gid}: {en}. Use index {ROCE_GID} (RoCE v2, the port's IPv4 address).")))

    tc = env.get("NCCL_IB_TC")
    if tc is None:
        out.append(("NCCL_IB_TC", problem(
            f"没有设置 NCCL_IB_TC：网络组要求 RDMA 流量使用 traffic class {ROCE_TC}（无损队列）。NCCL_IB_TC 默认是 0，"
            f"流量会落进普通的有损队列。",
            f"NCCL_IB_TC is not set: the network team asks for traffic class {ROCE_TC} (the lossless queue) for "
            f"RDMA traffic. NCCL_IB_TC defaults to 0, the ordinary lossy queue.")))
    elif tc.strip() != str(ROCE_TC):
        out.append(("NCCL_IB_TC", problem(
            f"NCCL_IB_TC={tc}：网络组给的 traffic class 是 {ROCE_TC}，其他取值都会落进普通的有损队列。",
            f"NCCL_IB_TC={tc}: the network team's traffic class is {ROCE_TC}; any other value lands in the "
            f"ordinary lossy queue.")))
    return out


_register_env(Scenario(
    name="roce",
    title={"en": "2 · A RoCE cluster across two racks", "zh": "2 · 跨两个机架的 RoCE 集群"},
    rules=_roce, nccl_version=ROCE_NCCL,
    allowed_debugging=frozenset({"NCCL_IB_DISABLE"}),   # =0 is harmless; =1 is rejected by _roce
))


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
        out.append(("CUDA_VISIBLE_DEVICES", problem(
            "没有设置 CUDA_VISIBLE_DEVICES：两个 rank 能看到全部 4 块 GPU，按 local rank 会用上 cuda:0 和 cuda:1，"
            "而 GPU 0 正被推理服务占着。",
            "CUDA_VISIBLE_DEVICES is not set: both ranks see all four GPUs and, by local rank, take cuda:0 and "
            "cuda:1, while GPU 0 belongs to the inference server.")))
    else:
        items = [i for i in cvd.split(",") if i.strip()]
        idx = [_gpu_index(i) for i in items]
        unknown = [i.strip() for i, g in zip(items, idx) if g is None]
        if unknown:
            out.append(("CUDA_VISIBLE_DEVICES", problem(
                f"CUDA_VISIBLE_DEVICES 里的 {', '.join(unknown)} 不是这台机器上的 GPU（nvidia-smi -L 列出了 0 到 3 及其 UUID）。",
                f"CUDA_VISIBLE_DEVICES: {', '.join(unknown)} is not a GPU of this box (nvidia-smi -L lists 0 to 3 "
                f"and their UUIDs).")))
        gpus = sorted({g for g in idx if g is not None})
        if not unknown and len(gpus) != 2:
            out.append(("CUDA_VISIBLE_DEVICES", problem(
                f"CUDA_VISIBLE_DEVICES={cvd} 给了 {len(gpus)} 块 GPU；作业是 torchrun --nproc-per-node 2，正好需要 2 块。",
                f"CUDA_VISIBLE_DEVICES={cvd} lists {len(gpus)} GPU(s); the job runs torchrun --nproc-per-node 2 "
                f"and needs exactly 2.")))
        elif not unknown:
            if PCIE_BUSY in gpus:
                out.append(("CUDA_VISIBLE_DEVICES", problem(
                    "GPU 0 正被推理服务占用（见 nvidia-smi 的进程列表），训练作业不能用它。",
                    "GPU 0 is taken by the inference server (see the processes in nvidia-smi); the training job "
                    "cannot use it.")))
            elif tuple(gpus) != PCIE_PAIR:
                a, b = gpus
                out.append(("CUDA_VISIBLE_DEVICES", problem(
                    f"GPU{a} 和 GPU{b} 之间是 SYS：要穿过两个 CPU 插槽之间的互连，是这台机器上最远的路径。"
                    f"GPU2 和 GPU3 挂在同一个 PCIe 交换芯片下（PIX），才是空闲 GPU 里最近的一对。",
                    f"GPU{a} and GPU{b} are connected through SYS: across the link between the two CPU sockets, "
                    f"the longest path in this box. GPU2 and GPU3 share a PCIe switch (PIX): the closest pair of "
                    f"the free GPUs.")))
    order = env.get("CUDA_DEVICE_ORDER")
    if order is not None and order.strip() not in ("PCI_BUS_ID", "FASTEST_FIRST"):
        out.append(("CUDA_DEVICE_ORDER", problem(
            f"CUDA_DEVICE_ORDER={order!r} 无效：CUDA 只认 FASTEST_FIRST（默认）和 PCI_BUS_ID。",
            f"CUDA_DEVICE_ORDER={order!r} is not valid: CUDA knows FASTEST_FIRST (the default) and PCI_BUS_ID.")))
    if _truthy(env.get("NCCL_P2P_DISABLE")):
        out.append(("NCCL_P2P_DISABLE", problem(
            "NCCL_P2P_DISABLE=1：GPU2 和 GPU3 在同一个 PCIe 交换芯片下（PIX），P2P 正是它们之间最短的路；两块 GPU 之间能不能用 P2P，"
            "NCCL 会根据拓扑自己判断，没有 NVLink 不是关掉它的理由。关掉之后数据要绕道主机内存（SHM 传输）。",
            "NCCL_P2P_DISABLE=1: GPU2 and GPU3 share a PCIe switch (PIX), where P2P is the short path between "
            "them; NCCL works out from the topology whether P2P can be used between two GPUs, and having no "
            "NVLink is no reason to turn it off. Without it their traffic takes a detour through host memory "
            "(the SHM transport).")))
    return out


_register_env(Scenario(
    name="pcie_box",
    title={"en": "3 · A PCIe-only box shared with another job", "zh": "3 · 只有 PCIe、和别人共用的机器"},
    rules=_pcie,
    debugging_why={"NCCL_P2P_LEVEL": problem(
        "NCCL_P2P_LEVEL：不设置时 NCCL 会根据架构和拓扑自己选一个合适的级别（文档原话）。这台机器上 LOC 或 NVL 会直接让 P2P 失效"
        "（这里没有 NVLink），其他取值也只是在替 NCCL 做它本来就会做的决定。它属于 Debugging 类变量，不要留在配置里。",
        "NCCL_P2P_LEVEL: unset, NCCL selects a level from the architecture and topology by itself (the docs' "
        "words). Here LOC or NVL would switch P2P off (there is no NVLink), and any other value only makes a "
        "decision NCCL already makes. It is a Debugging variable: do not keep it in a configuration.")},
))


# ==================================================================== 4. a container, tiny /dev/shm
SHM_NCCL = "2.19.3"


def _small_shm(env: dict) -> list:
    out = []
    if _truthy(env.get("NCCL_SHM_DISABLE")):
        out.append(("NCCL_SHM_DISABLE", problem(
            "NCCL_SHM_DISABLE=1 只是绕开症状：根源是容器的 /dev/shm 只有 64 MB。NCCL 文档说它在 /dev/shm 里建共享内存段，"
            "用于进程之间乃至线程之间的通信，空间不够就初始化失败，给 Docker 的办法是 --shm-size=1g --ulimit memlock=-1。"
            "NCCL_SHM_DISABLE 只关掉 SHM 这一种传输（原本走它的流量改走网络，更慢），它还是 Debugging 类变量。"
            "正确的做法是改 docker run 那一行（--shm-size 或 --ipc=host），这个文件里不要写它。",
            "NCCL_SHM_DISABLE=1 only works around the symptom: the cause is the container's 64 MB /dev/shm. NCCL's "
            "docs say NCCL creates shared-memory segments in /dev/shm to communicate between processes and even "
            "threads, fails to initialize when there is not enough, and for Docker they give --shm-size=1g "
            "--ulimit memlock=-1. NCCL_SHM_DISABLE turns off just the SHM transport (traffic that used it goes "
            "through the network, slower), and it is a Debugging variable. The fix belongs on the docker run "
            "line (--shm-size or --ipc=host), not in this file.")))
    if _truthy(env.get("NCCL_P2P_DISABLE")):
        out.append(("NCCL_P2P_DISABLE", problem(
            "NCCL_P2P_DISABLE=1：这台机器的 8 块 GPU 通过 NVSwitch 全互连，P2P（NVLink）是 GPU 之间最快的路；"
            "关掉它，GPU 之间的流量就得经过主机内存（SHM），偏偏共享内存正是这里短缺的东西。",
            "NCCL_P2P_DISABLE=1: the eight GPUs of this box are fully connected through NVSwitch, and P2P (NVLink) "
            "is their fastest path; without it GPU-to-GPU traffic has to go through host memory (SHM), the very "
            "thing this container is short of.")))
    debug = env.get("NCCL_DEBUG")
    level = (debug or "").strip().upper()
    if debug is None or level == "VERSION":
        out.append(("NCCL_DEBUG", problem(
            "请保留 NCCL_DEBUG=WARN（第一次重跑可以用 INFO）：文档说设成 WARN 时，NCCL 在返回错误之前会打印一条明确的警告，"
            "共享内存不够时就是 failed to extend /dev/shm/... 那一行，这次就是靠它找到原因的。",
            "Keep NCCL_DEBUG=WARN (INFO for the first run after the fix): the docs say that with WARN, NCCL prints "
            "an explicit warning before returning an error, and a shared-memory shortage is the \"failed to extend "
            "/dev/shm/...\" line that found the cause this time.")))
    elif level == "TRACE":
        out.append(("NCCL_DEBUG", problem(
            "NCCL_DEBUG=TRACE 会为每一次调用打印可重放的跟踪，训练作业的日志会大得没法看；WARN（或第一次用 INFO）就够了。",
            "NCCL_DEBUG=TRACE prints a replayable trace of every call, far too much for a training job's log; WARN "
            "(or INFO for the first run) is enough.")))
    return out


_register_env(Scenario(
    name="small_shm",
    title={"en": "4 · A container with a tiny /dev/shm", "zh": "4 · /dev/shm 很小的容器"},
    rules=_small_shm, nccl_version=SHM_NCCL,
))


# ====================================================================== 5. a hang to debug
def _hang_debug(env: dict) -> list:
    out = []
    debug = env.get("NCCL_DEBUG")
    level = (debug or "").strip().upper()
    if debug is None:
        out.append(("NCCL_DEBUG", problem(
            "没有设置 NCCL_DEBUG：NCCL 对自己的通信器、传输方式和出错位置一声不吭。排查问题的第一步通常就是 NCCL_DEBUG=INFO。",
            "NCCL_DEBUG is not set: NCCL says nothing about its communicators, transports or errors. "
            "NCCL_DEBUG=INFO is the usual first step.")))
    elif level in ("VERSION", "WARN", "ATTN"):
        out.append(("NCCL_DEBUG", problem(
            f"NCCL_DEBUG={debug}：这个级别只在出错时打印警告，而挂起在 watchdog 放弃之前不会产生任何错误，"
            f"日志里看不出各 rank 停在哪里。请用 INFO。",
            f"NCCL_DEBUG={debug} prints warnings when something fails, and a hang fails nothing until the "
            f"watchdog gives up: the log would not show where the ranks were. Use INFO.")))
    elif level == "TRACE":
        out.append(("NCCL_DEBUG", problem(
            "NCCL_DEBUG=TRACE 为每一次调用打印可重放的跟踪：16 个 rank 跑上几个小时才出现挂起，日志会大到没法用。请用 INFO。",
            "NCCL_DEBUG=TRACE prints a replayable trace of every call: with 16 ranks running for hours before the "
            "hang, the log would be too large to use. Use INFO.")))

    size_name = next((n for n in ("TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_FR_BUFFER_SIZE") if n in env), None)
    size = None
    if size_name:
        try:
            size = int(env[size_name].strip())
        except ValueError:
            size = None
    if size_name is None or size == 0:
        shown = f"{size_name}=0 关掉了它" if size_name else "没有设置 TORCH_NCCL_TRACE_BUFFER_SIZE"
        shown_en = f"{size_name}=0 turns it off" if size_name else "TORCH_NCCL_TRACE_BUFFER_SIZE is not set"
        out.append((size_name or "TORCH_NCCL_TRACE_BUFFER_SIZE", problem(
            f"flight recorder 没有打开（{shown}）：它在每个 rank 上记下最近的集合通信（设成例如 2000 个事件），"
            f"挂起时就能看出每个 rank 停在哪一次集合通信上。",
            f"The flight recorder is off ({shown_en}): it keeps the latest collectives of every rank (set it to, "
            f"say, 2000 events), which shows which collective each rank was in when the job hung.")))
    if not _truthy(env.get("TORCH_NCCL_DUMP_ON_TIMEOUT")):
        out.append(("TORCH_NCCL_DUMP_ON_TIMEOUT", problem(
            "请设置 TORCH_NCCL_DUMP_ON_TIMEOUT=1：watchdog 超时的时候自动把 flight recorder 的记录落盘。不设的话，"
            "只能自己通过 TORCH_NCCL_DEBUG_INFO_PIPE_FILE 手动触发，可挂起偏偏发生在凌晨三点。",
            "Set TORCH_NCCL_DUMP_ON_TIMEOUT=1: it writes the flight recorder's record to disk when the watchdog "
            "times out. Without it you could only trigger a dump by hand (TORCH_NCCL_DEBUG_INFO_PIPE_FILE), and "
            "the hang comes at 3 a.m.")))

    dist_debug = (env.get("TORCH_DISTRIBUTED_DEBUG") or "").strip().upper()
    if dist_debug != "DETAIL":
        now_zh = f"现在是 {dist_debug}，" if dist_debug else "现在没有设置，"
        now_en = f"it is {dist_debug} now; " if dist_debug else "it is not set; "
        out.append(("TORCH_DISTRIBUTED_DEBUG", problem(
            f"请设置 TORCH_DISTRIBUTED_DEBUG=DETAIL（{now_zh}INFO 只多打印 DDP 初始化的日志）：DETAIL 会检查每一次集合通信"
            f"在各 rank 上是否一致（形状、类型），如果挂起是因为某个 rank 发起了不同的集合通信，它会变成一条指明问题的报错。"
            f"它有性能开销，只用在这次排查运行里。",
            f"Set TORCH_DISTRIBUTED_DEBUG=DETAIL ({now_en}INFO only adds DDP initialization logs): DETAIL checks "
            f"that every collective matches across ranks (shapes, types), so if the hang comes from a rank issuing "
            f"a different collective, it becomes an error that names it. It costs performance: use it for this "
            f"debugging run only.")))

    if (env.get("TORCH_NCCL_ASYNC_ERROR_HANDLING") or "").strip() == "0":
        out.append(("TORCH_NCCL_ASYNC_ERROR_HANDLING", problem(
            "TORCH_NCCL_ASYNC_ERROR_HANDLING=0：watchdog 发现错误（包括超时）后什么也不做，挂住的 rank 会一直等下去，"
            "没有东西来结束作业。不设置时默认是 3（直接结束进程）。",
            "TORCH_NCCL_ASYNC_ERROR_HANDLING=0: the watchdog does nothing when it sees an error (a timeout "
            "included), so the hung ranks wait forever and nothing ends the job. Unset, it is 3 (tear the "
            "process down).")))
    if "NCCL_IB_TIMEOUT" in env:
        out.append(("NCCL_IB_TIMEOUT", problem(
            "NCCL_IB_TIMEOUT 不是集合通信的超时：它是 InfiniBand Verbs 层重传超时的指数（单次 4.096 µs × 2^值）。"
            "调大它既不能缩短等待，也帮不上找出挂起的原因。",
            "NCCL_IB_TIMEOUT is not a collective timeout: it is the exponent of the InfiniBand Verbs retransmission "
            "timeout (4.096 µs * 2^value each). Raising it neither shortens the wait nor helps find the hang.")))
    return out


_register_env(Scenario(
    name="hang_debug",
    title={"en": "5 · A hang to debug", "zh": "5 · 排查一次挂起"},
    rules=_hang_debug,
    debugging_default={
        "zh": "{var} 会改变 NCCL 的通信方式。第一次排查运行要保持原来会挂起的配置，这样记录下来的才是你要找的那个故障"
              "（它属于 NCCL 文档里的 Debugging 类变量）。",
        "en": "{var} changes how NCCL communicates. Keep the configuration that hangs for the first debugging run, "
              "so that what you record is the failure you are hunting (it is one of NCCL's Debugging variables).",
    },
))


# =========================================================== 6. a long rank-0 evaluation (launched)
VAL_SIZE = 16
SECONDS_PER_SAMPLE = 0.5      # the whole validation set: 8 s on one rank
PG_TIMEOUT_S = 4.0            # the grader's process-group timeout, standing for the default 10 minutes


def val_score(i: int) -> float:
    """The metric of validation sample ``i`` (a stand-in for a forward pass)."""
    return float((7 * i + 3) % 10) / 10


def evaluate(indices) -> float:
    """The summed metric over ``indices``; costs ``SECONDS_PER_SAMPLE`` per sample, like a real model."""
    indices = list(indices)
    time.sleep(SECONDS_PER_SAMPLE * len(indices))
    return sum(val_score(i) for i in indices)


def _check_eval(rt, result, module):
    want = sum(val_score(i) for i in range(VAL_SIZE)) / VAL_SIZE
    try:
        ok = abs(float(result) - want) <= 1e-6
    except (TypeError, ValueError):
        ok = False
    if ok:
        return []
    return [problem(f"验证集上的平均指标应为 {want:g}（整个验证集），你的结果是 {result!r}",
                    f"the mean metric over the whole validation set should be {want:g}, yours is {result!r}")]


_ENV_NAMES = re.compile(r"[\"']((?:TORCH_)?NCCL_[A-Z_]+|TORCH_DISTRIBUTED_DEBUG|GLOO_[A-Z_]+)[\"']")


def _explain_eval(outcome: str, feedback: str, source: str) -> list:
    out = []
    if "Timed out" in feedback or "timed out" in feedback.lower() or outcome == "hang":
        out.append(problem(
            f"这是进程组的超时：评分器给进程组设了 {PG_TIMEOUT_S:g} 秒的超时（代表 NCCL 默认的 10 分钟），"
            f"rank 0 一个人评估要 {SECONDS_PER_SAMPLE * VAL_SIZE:g} 秒，其他 rank 在下一个集合通信里等得比超时还久。"
            f"在 gloo 上，等待的 rank 会抛出 RuntimeError: ... Timed out waiting {PG_TIMEOUT_S * 1000:g}ms for recv "
            f"operation to complete，整个作业随之结束；在 NCCL 上则是 watchdog 报告这次集合通信超时并结束进程。"
            f"解决办法：让每个 rank 评估一部分验证集（谁也不用久等），或者给这次等待一个够长的超时"
            f"（dist.new_group(timeout=...)；自己的脚本里就是 init_process_group(timeout=...)）。",
            f"This is the process group's timeout: the grader gives the process group {PG_TIMEOUT_S:g} s (standing "
            f"for NCCL's default 10 minutes), rank 0 alone needs {SECONDS_PER_SAMPLE * VAL_SIZE:g} s to evaluate, "
            f"and the other ranks wait longer than that in the next collective. On gloo the waiting rank raises "
            f"RuntimeError: ... Timed out waiting {PG_TIMEOUT_S * 1000:g}ms for recv operation to complete, and "
            f"the job ends; on NCCL the watchdog reports the collective's timeout and tears the process down. The "
            f"fix: let every rank evaluate a share of the validation set (nobody waits long), or give this wait a "
            f"timeout long enough (dist.new_group(timeout=...); in your own script, "
            f"init_process_group(timeout=...))."))
    names = sorted(set(_ENV_NAMES.findall(source)))
    for name in names:
        if name in ("NCCL_TIMEOUT", "TORCH_NCCL_TIMEOUT"):
            out.append(problem(f"你设置的 {name} 不是任何组件会读取的变量（PyTorch 和 NCCL 都不读），进程组的超时只能通过 "
                               f"timeout= 参数设置。",
                               f"{name}, which you set, is read by nothing (neither PyTorch nor NCCL); the process "
                               f"group's timeout is only set through a timeout= argument."))
        elif name == "NCCL_IB_TIMEOUT":
            out.append(problem("NCCL_IB_TIMEOUT 是 InfiniBand Verbs 层的重传超时指数，不是集合通信的超时；这里用的是 gloo，它更不相干。",
                               "NCCL_IB_TIMEOUT is the InfiniBand Verbs retransmission timeout exponent, not a "
                               "collective timeout (and this job runs on gloo anyway)."))
        elif name in ("TORCH_NCCL_BLOCKING_WAIT", "NCCL_BLOCKING_WAIT"):
            out.append(problem(f"{name} 只是让 wait() 阻塞等待，最多等到进程组的超时为止；它不会把超时变长（何况这里是 gloo）。",
                               f"{name} only makes wait() block, up to the process group's timeout; it does not "
                               f"make the timeout longer (and this job runs on gloo anyway)."))
    others = [n for n in names if n not in ("NCCL_TIMEOUT", "TORCH_NCCL_TIMEOUT", "NCCL_IB_TIMEOUT",
                                            "TORCH_NCCL_BLOCKING_WAIT", "NCCL_BLOCKING_WAIT")]
    if others:
        out.append(problem(f"你的程序设置了环境变量（{', '.join(others)}），但进程组的超时不由环境变量决定，"
                           f"而且进程组在你的代码运行之前就已经建好了。",
                           f"Your program sets environment variables ({', '.join(others)}), but no environment "
                           f"variable sets the process group's timeout, and the group was created before your "
                           f"code ran anyway."))
    return out


register(Exercise(
    id="lab11.eval_timeout", lab=LAB, entry="run", filename="lab11_eval_timeout.py", timeout=20,
    title={"en": "6 · A long rank-0 evaluation trips the timeout", "zh": "6 · rank 0 上漫长的评估触发了超时"},
    checks=[_check_eval], world_sizes=(2, 3), pg_timeout=PG_TIMEOUT_S, explain=_explain_eval))
