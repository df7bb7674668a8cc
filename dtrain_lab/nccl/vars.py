"""Knowledge base: the environment variables NCCL, PyTorch distributed and Gloo read.

Pure data, no logic: ``dtrain_lab.nccl`` lints a configuration against it. Every entry was taken from
the official page named in its ``source`` (the NCCL user guide, the PyTorch docs, or the PyTorch
source headers those docs point to), never from a tutorial. Defaults are the ones the page states;
``None`` means the page does not state one (defaults that only appear in source code change between
releases, so they are not recorded here).

Fields worth a word:

* ``type``: bool / int / enum / str / list / path / seconds.
* ``status``: current / deprecated / renamed / removed; ``replacement`` names the successor and
  ``status_zh`` / ``status_en`` say what the docs say about it.
* ``debugging``: NCCL lists the variable under its "Debugging" section, whose variables "should not
  be used in production nor retained in scripts".
* ``check``: the name of an extra value check in ``dtrain_lab.nccl`` (``_CHECKS``) for values whose
  syntax is richer than one type (interface lists, algorithm lists, ...).
"""
from __future__ import annotations

from dataclasses import dataclass

# ---------------------------------------------------------------------------------------- sources
NCCL_ENV = "https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html"
NCCL_LOGGING = "https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/troubleshooting/logging.html"
NCCL_NET_TROUBLESHOOTING = ("https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/troubleshooting/"
                            "networking_troubleshooting.html")
NCCL_RUNTIME_TROUBLESHOOTING = ("https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/troubleshooting/"
                                "runtime_and_mpi_issues.html")
PT_NCCL_ENV = "https://docs.pytorch.org/docs/stable/torch_nccl_environment_variables.html"
PT_DISTRIBUTED = "https://docs.pytorch.org/docs/stable/distributed.html"
PT_DEBUG_ENV = "https://docs.pytorch.org/docs/stable/debugging_environment_variables.html"
PT_TORCHRUN = "https://docs.pytorch.org/docs/stable/elastic/run.html"
# The PyTorch NCCL page sends readers to this header "for more information on the environment variables".
PT_PGNCCL_HPP = "https://github.com/pytorch/pytorch/blob/main/torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp"
PT_FLIGHT_RECORDER_HPP = ("https://github.com/pytorch/pytorch/blob/main/torch/csrc/distributed/c10d/"
                          "FlightRecorder.hpp")
PT_C10D_UTILS_HPP = "https://github.com/pytorch/pytorch/blob/main/torch/csrc/distributed/c10d/Utils.hpp"

TYPES = ("bool", "int", "enum", "str", "list", "path", "seconds")
STATUSES = ("current", "deprecated", "renamed", "removed")
OWNERS = ("nccl", "pytorch", "gloo")


@dataclass(frozen=True)
class EnvVar:
    name: str
    owner: str
    type: str
    zh: str
    en: str
    source: str
    default: str | None = None
    status: str = "current"
    replacement: str | None = None
    status_zh: str = ""
    status_en: str = ""
    choices: tuple[str, ...] = ()          # enum values / list tokens, as the docs spell them
    deprecated_choices: tuple[str, ...] = ()  # values the docs keep only for compatibility
    case_insensitive: bool = False         # only where the docs say "not case sensitive"
    lo: int | None = None                  # inclusive bounds of an int
    hi: int | None = None
    since: str | None = None               # first NCCL version, as the docs give it
    debugging: bool = False
    check: str | None = None
    empty_ok: bool = False                 # an empty value means something (else: "treated as unset")
    no_tilde: bool = False                 # the docs say "~" is not accepted in this path
    secret: bool = False                   # never echo the value


def _nccl(name, type_, zh, en, *, debugging=False, source=NCCL_ENV, **kw) -> EnvVar:
    return EnvVar(name, "nccl", type_, zh, en, source, debugging=debugging, **kw)


def _torch(name, type_, zh, en, *, source=PT_NCCL_ENV, **kw) -> EnvVar:
    return EnvVar(name, "pytorch", type_, zh, en, source, **kw)


_LEVELS = ("LOC", "PIX", "PXB", "PHB", "SYS")
_LEGACY_LEVEL_INTS = ("0", "1", "2", "3", "4")
_LOG_LEVELS = ("VERSION", "WARN", "ATTN", "INFO", "ABORT", "TRACE", "ALL")
SUBSYSTEMS = ("INIT", "COLL", "P2P", "SHM", "NET", "GRAPH", "TUNING", "ENV", "ALLOC", "ALLOC_HOST",
              "CALL", "PROXY", "NVLS", "BOOTSTRAP", "REG", "PROFILE", "RAS", "DESTROY", "ALL")
ALGORITHMS = ("Ring", "Tree", "CollnetChain", "CollnetDirect", "NVLS", "NVLSTree", "PAT")
PROTOCOLS = ("LL", "LL128", "Simple")

# ================================================================ NCCL: "System configuration"
_NCCL_SYSTEM = [
    _nccl("NCCL_SOCKET_IFNAME", "list",
          "指定 NCCL 通过哪些 IP 网卡通信。值是逗号分隔的网卡名前缀：整个列表以 ^ 开头表示排除，"
          "列表开头（^ 之后）的 = 表示其中每一项都按全名精确匹配，例如 =eth0、=eth0,eth1、^docker、^=docker0。不设置时由 NCCL 自动挑选："
          "除非没有别的网卡，否则不会选 lo 和 docker*，并优先选 ib 开头的网卡。",
          "Which IP interfaces NCCL uses to communicate: a comma-separated list of name prefixes; a "
          "leading ^ turns the list into an exclude list, and an = at the start of the list (after any ^) "
          "makes every item an exact name (e.g. =eth0, =eth0,eth1, ^docker, ^=docker0). Unset, NCCL picks automatically: it avoids lo and docker* "
          "unless nothing else is available and prefers interfaces whose name starts with ib.",
          check="ifname"),
    _nccl("NCCL_SOCKET_FAMILY", "enum",
          "强制 NCCL 只用 IPv4（AF_INET）或只用 IPv6（AF_INET6）的网卡。",
          "Forces NCCL to use only IPv4 (AF_INET) or only IPv6 (AF_INET6) interfaces.",
          choices=("AF_INET", "AF_INET6")),
    _nccl("NCCL_SOCKET_MAGIC", "int",
          "覆盖 NCCL 内部 TCP 握手用的 64 位 magic 值（socket 网络插件、InfiniBand 建连用的 socket），"
          "不影响走 NCCL_COMM_ID 或 ncclGetUniqueId 的 bootstrap。同一作业的所有进程设成同一个值，"
          "可以减少不相关的作业共用节点和端口时互相串线。取值为十进制或 0x 开头的十六进制非负整数，"
          "非法值会被忽略并回落到内置默认值。",
          "Overrides the 64-bit magic of NCCL's internal TCP socket handshake (socket net plugin, "
          "InfiniBand connection sockets); bootstrap through NCCL_COMM_ID or ncclGetUniqueId is not "
          "affected. The same value on every process of a job reduces cross-talk between unrelated jobs "
          "sharing nodes and ports. A non-negative decimal or 0x-hexadecimal integer; invalid strings "
          "fall back to the built-in default.",
          lo=0, empty_ok=True),
    _nccl("NCCL_SOCKET_RETRY_CNT", "int",
          "socket 连接遇到 ETIMEDOUT、ECONNREFUSED 或 EHOSTUNREACH 时，NCCL 重试建立连接的次数。",
          "How many times NCCL retries a socket connection after ETIMEDOUT, ECONNREFUSED or EHOSTUNREACH.",
          default="34", lo=1, since="2.24"),
    _nccl("NCCL_SOCKET_RETRY_SLEEP_MSEC", "int",
          "第一次连接失败后等多少毫秒再重试，之后每次的等待时间随失败次数线性增长；"
          "与 NCCL_SOCKET_RETRY_CNT 都取默认值时，总共大约重试 60 秒。",
          "Milliseconds to wait before retrying after the first connection error; later waits grow "
          "linearly with the error count. With both retry defaults the total is about 60 seconds.",
          default="100", lo=1, since="2.24"),
    _nccl("NCCL_SOCKET_POLL_TIMEOUT_MSEC", "int",
          "bootstrap 期间两次尝试之间 poll 的超时（毫秒），用来降低 CPU 占用。0（默认）表示不 poll，一直忙着推进。",
          "Poll timeout (ms) between attempts during bootstrap, to reduce CPU load; 0 (the default) "
          "means no polling, keep trying without pause.",
          default="0", lo=0, since="2.28"),
    _nccl("NCCL_PSK", "str",
          "给 NCCL 主机侧的 TCP 流量开启 TLS 加密的预共享密钥。所有进程必须用同一个值，并且要在 "
          "ncclGetUniqueId 或其他网络操作之前设置；不设置或为空表示不加密，非空但不足 32 个字符会被拒绝。"
          "需要 NCCL 编译时启用 OpenSSL 3。",
          "A pre-shared key that requests TLS encryption of NCCL's host TCP traffic. Every process must "
          "use the same value, set before ncclGetUniqueId or any other NCCL networking; unset or empty "
          "means plaintext, non-empty values shorter than 32 characters are rejected. Needs an NCCL "
          "built with OpenSSL 3.",
          check="psk", empty_ok=True, secret=True),
    _nccl("NCCL_SOCKET_NTHREADS", "int",
          "socket 传输中每个网络连接使用的 CPU 辅助线程数。调大可能提升 socket 传输带宽，代价是更高的 CPU 占用。"
          "取值 1 到 16；与 NCCL_NSOCKS_PERTHREAD 的乘积不能超过 64。",
          "CPU helper threads per network connection of the socket transport; more may raise socket "
          "bandwidth at the cost of CPU. 1 to 16; its product with NCCL_NSOCKS_PERTHREAD cannot exceed 64.",
          default="1 (AWS: 2; Google Cloud gVNIC: 4)", lo=1, hi=16, since="2.4.8"),
    _nccl("NCCL_NSOCKS_PERTHREAD", "int",
          "socket 传输的每个辅助线程打开的 socket 数。单个 socket 速度受限的环境里，设成大于 1 可能提升网络性能；"
          "与 NCCL_SOCKET_NTHREADS 的乘积不能超过 64。",
          "Sockets opened by each socket-transport helper thread; above 1 can help where per-socket "
          "speed is limited. Its product with NCCL_SOCKET_NTHREADS cannot exceed 64.",
          default="1 (AWS: 8)", lo=1, since="2.4.8"),
    _nccl("NCCL_CROSS_NIC", "enum",
          "是否允许同一个 ring/tree 在不同节点上使用不同的网卡。0：始终用同一块网卡，适合每块网卡接独立交换机"
          "（rail-optimized）的网络；1：允许跨网卡，适合所有网卡接同一台交换机的网络；2（默认）：尽量用同一块网卡，"
          "性能更好时也允许跨网卡。只有一块网卡时没有影响。",
          "Whether a ring/tree may use different NICs on different nodes. 0: always the same NIC (rail-"
          "optimized fabrics); 1: allow different NICs (all NICs on one switch); 2 (default): try the "
          "same NIC but allow others when faster. No effect with a single NIC.",
          default="2", choices=("0", "1", "2")),
    _nccl("NCCL_IB_HCA", "list",
          "指定 NCCL 使用哪些 RDMA 网卡（HCA）。逗号分隔，每项形如 <hca>[:<port>[:<rail>[:<plane>]]]；"
          "列表以 ^ 开头表示排除，再加 = 表示按全名精确匹配，否则按前缀匹配。注意不加 = 时 mlx5_1 还会匹配到 "
          "mlx5_10 到 mlx5_19，所以官方建议总是加 =。最多支持 32 个 HCA。",
          "Which RDMA adapters (HCAs) NCCL uses: comma-separated <hca>[:<port>[:<rail>[:<plane>]]] items; "
          "a leading ^ excludes, a following = matches exact names, otherwise names are prefixes. "
          "Without =, mlx5_1 also selects mlx5_10 to mlx5_19, so the docs recommend always adding =. "
          "At most 32 HCAs are supported.",
          check="hca"),
    _nccl("NCCL_IB_RAIL_POLICY", "enum",
          "控制支持的 ConnectX SuperNIC 设备如何自动分配 rail 和 plane，不会覆盖 NCCL_IB_HCA 里手工指定的值。",
          "How rails and planes are assigned automatically on supported ConnectX SuperNIC devices; never "
          "overrides rails/planes given in NCCL_IB_HCA.",
          default="CX9", choices=("NONE", "CX9", "CX9:FLIP", "CX9:ALT", "CX9:BLOCK"), since="2.30.5"),
    _nccl("NCCL_IB_TIMEOUT", "int",
          "InfiniBand Verbs 的超时指数：单次超时为 4.096 µs × 2^值，网络越大需要的值越大；"
          "总等待时间是单次超时乘以 NCCL_IB_RETRY_CNT（默认 20 和 7 时约 30 秒）。取值 0-31，"
          "0 或 ≥32 表示无限超时。注意它不是集合通信的超时。",
          "InfiniBand Verbs timeout exponent: one timeout is 4.096 µs * 2^value and the right value grows "
          "with the network; the total wait is that times NCCL_IB_RETRY_CNT (about 30 s with the defaults "
          "20 and 7). 0-31; 0 or >= 32 means an infinite timeout. It is not a collective timeout.",
          default="20", lo=0, hi=31, check="ib_timeout"),
    _nccl("NCCL_IB_RETRY_CNT", "int",
          "InfiniBand 的重试次数，和 NCCL_IB_TIMEOUT 一起决定网络出错前的总等待时间。取值 0-7。",
          "InfiniBand retry count; with NCCL_IB_TIMEOUT it sets how long NCCL waits before raising a "
          "network error. 0-7.",
          default="7", lo=0, hi=7, since="2.1.15"),
    _nccl("NCCL_IB_GID_INDEX", "int",
          "RoCE 模式下使用的 Global ID 索引（用 show_gids 查看）。NCCL 2.21 起会自动选择 GID，官方建议不要再设置它。",
          "The Global ID index used in RoCE mode (see show_gids). Since NCCL 2.21 the GID is selected "
          "dynamically and the docs say this variable should not be set.",
          default="-1", lo=-1, since="2.1.4", check="gid_index"),
    _nccl("NCCL_IB_ADDR_FAMILY", "enum",
          "在没有设置 NCCL_IB_GID_INDEX、由 NCCL 自动选择 GID 时，GID 对应的 IP 地址族。",
          "IP address family of the GID NCCL selects when NCCL_IB_GID_INDEX is unset.",
          default="AF_INET", choices=("AF_INET", "AF_INET6"), since="2.21"),
    _nccl("NCCL_IB_ADDR_RANGE", "str",
          "在自动选择 GID 时只考虑这个网段（CIDR 格式，IPv4/IPv6 均可）内的 GID；不设置时不限制。",
          "When NCCL selects the GID itself, only GIDs inside this CIDR range (IPv4 or IPv6) qualify; "
          "ignored if unset.",
          since="2.21", check="cidr"),
    _nccl("NCCL_IB_ROCE_VERSION_NUM", "int",
          "在自动选择 GID 时要求的 RoCE 版本。",
          "RoCE version of the GID NCCL selects when NCCL_IB_GID_INDEX is unset.",
          default="2", lo=1, since="2.21"),
    _nccl("NCCL_IB_PKEY", "int",
          "按在本端口 PKey 表中的索引选择 InfiniBand partition key。不同主机上同一个 PKey 的索引可能不同，"
          "这种情况请改用 NCCL_IB_PKEY_VALUE。",
          "Selects the InfiniBand partition key by its index in the port's PKey table; the index may "
          "differ between hosts, in which case use NCCL_IB_PKEY_VALUE.",
          default="0", lo=0, since="2.1.4"),
    _nccl("NCCL_IB_PKEY_VALUE", "int",
          "按值（例如 0x8111）选择 InfiniBand partition key，建连时自动换算成索引，因此跨主机可移植；"
          "与 NCCL_IB_PKEY 同时设置时以它为准。",
          "Selects the InfiniBand partition key by value (e.g. 0x8111), resolved to an index at connection "
          "setup so it is portable across hosts; takes precedence over NCCL_IB_PKEY.",
          default="-1", lo=-1, since="2.31"),
    _nccl("NCCL_IB_SL", "int",
          "InfiniBand 的 Service Level。",
          "The InfiniBand Service Level.",
          default="0", lo=0, since="2.1.4"),
    _nccl("NCCL_IB_TC", "int",
          "InfiniBand 的 traffic class 字段；RoCE 网络可能需要按厂商文档设置。",
          "The InfiniBand traffic class field; RoCE fabrics may need it set per the vendor's documentation.",
          default="0", lo=0, since="2.1.15"),
    _nccl("NCCL_IB_FIFO_TC", "int",
          "控制消息（归还 credit 的短 RDMA write）使用的 InfiniBand traffic class，可以让它们走高优先级、"
          "低延迟的队列，不被大块数据拖慢。默认与 NCCL_IB_TC 相同。",
          "InfiniBand traffic class for control messages (short credit-return RDMA writes), so they can "
          "use a high-priority low-latency class. Defaults to NCCL_IB_TC's value.",
          lo=0, since="2.22.3"),
    _nccl("NCCL_IB_RETURN_ASYNC_EVENTS", "bool",
          "IB 异步事件会以警告形式报告；开启时遇到致命的 IB 异步事件，NCCL 还会停止 IB 通信。",
          "IB events are reported as warnings; when enabled NCCL also stops IB communication on fatal "
          "asynchronous IB events.",
          default="1", since="2.23"),
    _nccl("NCCL_IB_EVENT_BASED_LB", "bool",
          "对合并后的虚拟 IB 设备，按各物理设备的当前链路速率分配流量（默认是平均分配），链路降速时自动重算。",
          "For fused (virtual) IB devices, split traffic by each physical device's current link speed "
          "instead of equally, recomputed when a speed change is reported.",
          default="0", since="2.31"),
    _nccl("NCCL_OOB_NET_ENABLE", "bool",
          "是否用 NCCL net 做带外（out-of-band）通信，这会改变通信器初始化时 allgather 的实现。",
          "Whether NCCL net is used for out-of-band communication, which changes the allgather done "
          "during communicator initialization.",
          since="2.23"),
    _nccl("NCCL_OOB_NET_IFNAME", "list",
          "开启 NCCL_OOB_NET_ENABLE 后，带外通信使用哪些网络设备。逗号分隔，可用 : 指定端口，^ 表示排除，= 表示精确匹配。",
          "With NCCL_OOB_NET_ENABLE, which network devices out-of-band communication uses: comma-separated, "
          "ports after :, ^ excludes, = matches exact names.",
          since="2.23", check="ifname"),
    _nccl("NCCL_UID_STAGGER_THRESHOLD", "int",
          "同一个 ncclUniqueId 上的 rank 数超过这个阈值时，各 rank 与 ncclUniqueId 的通信会按 rank 错开，"
          "避免把它压垮。",
          "Above this many ranks per ncclUniqueId, the ranks stagger their communication with the "
          "ncclUniqueId so it does not overflow.",
          default="256", lo=1, since="2.23"),
    _nccl("NCCL_UID_STAGGER_RATE", "int",
          "错开通信时目标的消息速率（条/秒），用来计算每个 rank 要等多久。",
          "Target message rate (messages per second) used to compute each rank's wait when staggering.",
          default="7000", lo=1, since="2.23"),
    _nccl("NCCL_NET", "str",
          "强制 NCCL 使用某个网络模块，例如确保用的是外部插件、不会自动回退到内置的 IB 或 Socket。"
          "必须与网络模块的名字一致（不区分大小写）；Linux 上内置的是 IB 和 Socket，外部插件各有自己的名字。",
          "Forces NCCL to use one network module, e.g. to make sure an external plugin is used instead "
          "of silently falling back to the internal IB or Socket. Must match the module's name (case-"
          "insensitive); the internal ones on Linux are IB and Socket, plugins define their own.",
          since="2.10", check="net"),
    _nccl("NCCL_NET_PLUGIN", "str",
          "选择网络插件：可以是库文件名，也可以是后缀（会尝试加载 libnccl-net-<后缀>.so），设为 none 表示不用插件。",
          "Chooses the net plugin: a library name or a suffix (libnccl-net-<suffix>.so is tried), or none.",
          since="2.11"),
    _nccl("NCCL_GIN_PLUGIN", "list",
          "选择 GIN（GPU-Initiated Networking，设备端 API 使用）插件，可以是逗号分隔的多个后缀或库文件名，或 none。",
          "Chooses GIN (GPU-Initiated Networking, used by the device API) plugins: a comma-separated list "
          "of suffixes or library names, or none.",
          since="2.29.3"),
    _nccl("NCCL_RMA_PLUGIN", "list",
          "选择 RMA（主机驱动的单边网络操作）插件，逗号分隔，按顺序尝试，或 none。",
          "Chooses RMA (host-driven one-sided networking) plugins, a comma-separated list tried in order, "
          "or none.",
          since="2.30.7"),
    _nccl("NCCL_TUNER_PLUGIN", "str",
          "选择 tuner 插件：库文件名或后缀，或 none。",
          "Chooses the tuner plugin: a library name or a suffix, or none."),
    _nccl("NCCL_PROFILER_PLUGIN", "str",
          "选择 profiler 插件：库文件名或后缀，或 none；设为 STATIC_PLUGIN 时在程序本身里查找插件符号。",
          "Chooses the profiler plugin: a library name or a suffix, or none; STATIC_PLUGIN looks for the "
          "symbols in the program binary."),
    _nccl("NCCL_ENV_PLUGIN", "str",
          "选择环境变量插件：库文件名或后缀（libnccl-env-<后缀>.so），设为 none 表示使用内置实现。",
          "Chooses the environment plugin: a library name or a suffix (libnccl-env-<suffix>.so), or none "
          "for the internal one.",
          since="2.28"),
    _nccl("NCCL_IGNORE_CPU_AFFINITY", "bool",
          "设为 1 时忽略启动器或父进程给的 CPU 亲和性，只用 GPU 对应的 CPU 亲和性（仍受 cpuset/cgroup 限制）。",
          "1 makes NCCL ignore the CPU affinity inherited from the launcher and use the GPU's affinity "
          "only (cpuset/cgroup limits still apply).",
          default="0", since="2.4.6"),
    _nccl("NCCL_CONF_FILE", "path",
          "指定一个静态配置文件（每行 KEY=VALUE）。不设置时使用家目录下的 .nccl.conf；"
          "/etc/nccl.conf 也会被读取。路径里不能用 ~，请写成绝对或相对路径。",
          "A file with static configuration (KEY=VALUE lines). Unset, ~/.nccl.conf is used; /etc/nccl.conf "
          "is read as well. The path cannot contain ~; use an absolute or relative path.",
          since="2.23", no_tilde=True),
    _nccl("NCCL_DEBUG", "enum",
          "NCCL 打印的调试信息级别：VERSION 只打印版本号；WARN 在 NCCL 调用出错时打印错误信息；"
          "ATTN（2.32 起）在 WARN 之外再打印一些提示；INFO 打印调试信息；TRACE 为每次调用打印可重放的跟踪。"
          "排查问题时最常用 NCCL_DEBUG=INFO。",
          "How much debug information NCCL prints: VERSION (the version only), WARN (an error message "
          "whenever an NCCL call fails), ATTN (since 2.32: WARN plus informational notices), INFO (debug "
          "information), TRACE (replayable traces of every call). NCCL_DEBUG=INFO is the usual first step.",
          choices=("VERSION", "WARN", "ATTN", "INFO", "TRACE"), check="debug", source=NCCL_ENV),
    _nccl("NCCL_DEBUG_LEVELS", "list",
          "在 NCCL_DEBUG 选定的级别之外再额外打开某些级别（取并集），逗号分隔。旧版本会忽略它，未知的级别名也会被忽略。",
          "Adds individual levels to the selection made by NCCL_DEBUG (a union); comma-separated. Older "
          "versions ignore it, and unknown level names are ignored.",
          choices=_LOG_LEVELS, since="2.32", check="levels"),
    _nccl("NCCL_DEBUG_FILE", "path",
          "把 NCCL 的调试输出写到文件。文件名里 %h 会替换成主机名、%p 替换成进程号，多进程作业请务必带上，"
          "否则多个进程写同一个文件，输出会丢失或错乱；已有同名文件会被覆盖。也可以设为 /dev/stdout 或 /dev/stderr。"
          "路径里不能用 ~。",
          "Sends NCCL debug output to a file; %h becomes the hostname and %p the PID. Use them in multi-"
          "process jobs: a file name shared by several processes loses or corrupts output. Existing files "
          "are overwritten; /dev/stdout and /dev/stderr also work. The path cannot contain ~.",
          default="stdout", since="2.2.12", no_tilde=True, check="debug_file"),
    _nccl("NCCL_DEBUG_SUBSYS", "list",
          "按子系统过滤 NCCL_DEBUG=INFO（或 TRACE）的输出，逗号分隔；以 ^ 开头表示排除。常用的有 INIT、COLL、"
          "NET、GRAPH；ALL 表示全部。",
          "Filters NCCL_DEBUG=INFO (or TRACE) output by subsystem, comma-separated; a leading ^ excludes. "
          "Common ones are INIT, COLL, NET and GRAPH; ALL selects everything.",
          default="INIT,BOOTSTRAP,ENV", choices=SUBSYSTEMS, since="2.3.4", check="subsys"),
    _nccl("NCCL_DEBUG_TIMESTAMP_FORMAT", "str",
          "调试日志时间戳的 strftime 格式（本地时间，可用 TZ 修改时区）；额外支持 %1f 到 %9f 表示小数秒，"
          "下划线会显示成空格；设为空值表示不打印时间戳。",
          "strftime format of debug log timestamps (local time; TZ changes the zone); %1f to %9f print "
          "fractions of a second and underscores become spaces. An empty value prints no timestamp.",
          default="[%F %T] ", since="2.26", empty_ok=True),
    _nccl("NCCL_DEBUG_TIMESTAMP_LEVELS", "list",
          "哪些级别的日志行带时间戳，逗号分隔；ALL 表示全部，以 ^ 开头表示除这些之外都带，空值表示都不带。",
          "Which log levels get a timestamp, comma-separated; ALL for every level, a leading ^ inverts "
          "the list, an empty value disables timestamps.",
          default="WARN,ATTN", choices=_LOG_LEVELS, since="2.26", empty_ok=True, check="levels"),
    _nccl("NCCL_COLLNET_ENABLE", "bool",
          "是否启用 CollNet 插件（把集合通信卸载到网络设备上）。",
          "Enables the CollNet plugin (collectives offloaded to the network).",
          default="0", since="2.6"),
    _nccl("NCCL_COLLNET_NODE_THRESHOLD", "int",
          "节点数少于这个值时不启用 CollNet。",
          "CollNet is not enabled below this number of nodes.",
          default="2", lo=0, since="2.9.9"),
    _nccl("NCCL_CTA_POLICY", "str",
          "通信器的 CTA 策略：DEFAULT、EFFICIENCY、ZERO，多个非旧式策略可用 | 组合；0/1/2 是旧写法。",
          "The communicator's CTA policy: DEFAULT, EFFICIENCY or ZERO, non-legacy ones combinable with |; "
          "0/1/2 are the legacy spellings.",
          default="DEFAULT", since="2.29", check="cta_policy"),
    _nccl("NCCL_NETDEVS_POLICY", "str",
          "网络设备分配给 GPU 的策略：默认会同时考虑同一通信器里的其他 GPU；MAX:N 表示每块 GPU 最多用 N 个网络设备；"
          "ALL 表示每块 GPU 使用所有可用网络设备。",
          "How network devices are assigned to GPUs: by default NCCL also considers the other GPUs of the "
          "communicator; MAX:N uses at most N devices per GPU; ALL gives every GPU all devices.",
          since="2.28", check="netdevs"),
    _nccl("NCCL_MULTI_RANK_GPU_ENABLE", "bool",
          "（实验性）允许多个 rank 共用同一块 GPU；默认检测到这种情况时初始化会失败。资源要自己保证够用，"
          "建议配合 NCCL_MAX_CTAS 限制每个 rank 的 channel 数。",
          "(Experimental) allows several ranks on one GPU; by default initialization fails when this is "
          "detected. You must make sure resources suffice; NCCL_MAX_CTAS helps limit channels per rank.",
          default="0", since="2.30"),
    _nccl("NCCL_TOPO_FILE", "path",
          "在探测拓扑之前先加载的 XML 拓扑文件（只能描述单台主机）。",
          "An XML topology file loaded before topology detection (it must describe a single host).",
          default="/var/run/nvidia-topologyd/virtualTopology.xml (if present)", since="2.6"),
    _nccl("NCCL_TOPO_DUMP_FILE", "path",
          "拓扑探测完成后，把 NCCL 看到的 XML 拓扑写到这个文件（会覆盖），排查拓扑问题时很有用。",
          "After detection, NCCL writes the XML topology it sees to this file (overwritten); useful when "
          "debugging topology problems.",
          since="2.6"),
    _nccl("NCCL_SET_THREAD_NAME", "bool",
          "给 NCCL 的 CPU 线程起有意义的名字，方便调试和性能分析。",
          "Gives NCCL's CPU threads meaningful names, easing debugging and profiling.",
          default="0", since="2.12"),
]

# ======================================================================== NCCL: "Debugging"
# The docs: fine for experiments or to debug a problem, but generally not for production code.
_NCCL_DEBUGGING = [
    _nccl("NCCL_P2P_DISABLE", "bool",
          "设为 1 时禁用 P2P 传输（GPU 之间通过 NVLink 或 PCI 直接访问）。",
          "1 disables the peer-to-peer (P2P) transport, i.e. direct GPU-to-GPU access over NVLink or PCI."),
    _nccl("NCCL_P2P_LEVEL", "enum",
          "控制 GPU 之间多远的距离内才使用 P2P：LOC 从不使用；NVL 仅 NVLink 相连时；PIX 同一 PCI 交换机下；"
          "PXB 经过多个 PCI 交换机；PHB 同一 NUMA 节点（经过 CPU）；SYS 跨 NUMA 节点也用。"
          "不设置时 NCCL 按架构自动选择。0-4 的整数写法只为兼容保留，官方不建议使用。",
          "The largest GPU-to-GPU distance at which P2P is used: LOC never; NVL over NVLink; PIX same PCI "
          "switch; PXB across PCI switches; PHB same NUMA node (through the CPU); SYS across NUMA nodes. "
          "Unset, NCCL chooses. The integer spellings 0-4 are kept for compatibility and discouraged.",
          choices=("LOC", "NVL", "PIX", "PXB", "PHB", "SYS"), deprecated_choices=_LEGACY_LEVEL_INTS,
          since="2.3.4", check="path_level"),
    _nccl("NCCL_P2P_DIRECT_DISABLE", "bool",
          "设为 1 时禁止 NCCL 通过 P2P 直接访问同一进程内其他 GPU 上的用户缓冲区（缓冲区的分配方式不支持时有用）。",
          "1 forbids NCCL to access user buffers of other GPUs of the same process directly through P2P "
          "(useful when the allocator does not make them accessible)."),
    _nccl("NCCL_SHM_DISABLE", "bool",
          "设为 1 时禁用共享内存（SHM）传输。SHM 用在 P2P 走不通的设备之间；禁用后跨 CPU socket 的通信改走网络。",
          "1 disables the shared-memory (SHM) transport, used between devices when P2P is not possible; "
          "traffic between CPU sockets then goes through the network."),
    _nccl("NCCL_BUFFSIZE", "int",
          "NCCL 在每对 GPU 之间通信时使用的缓冲区大小（字节），建议取 2 的幂。内存紧张或想调性能时可以改。",
          "Size in bytes of the buffer NCCL uses between each pair of GPUs; powers of 2 are recommended. "
          "Change it for memory pressure or performance.",
          default="4194304", lo=1, check="pow2"),
    _nccl("NCCL_NTHREADS", "enum",
          "每个 CUDA block 的线程数（NCCL 每个通信 channel 启动一个 block）。GPU 频率低时可以调大，想减轻 GPU 负担时可以调小。",
          "CUDA threads per block (one block per communication channel). Raise it if GPU clocks are low, "
          "lower it to reduce the GPU load.",
          default="512 (256 on some older GPUs)", choices=("64", "128", "256", "512")),
    _nccl("NCCL_MAX_NCHANNELS", "int",
          "限制 NCCL 最多使用的 channel 数；channel 越少，占用的 CUDA block 越少，对计算的影响越小。",
          "Caps the number of channels NCCL uses; fewer channels means fewer CUDA blocks taken from compute.",
          lo=1, status="deprecated", replacement="NCCL_MAX_CTAS",
          status_zh="NCCL 2.17 起已弃用，改用 NCCL_MAX_CTAS（也可以通过 ncclCommInitRankConfig 设置）；两者都设置时取更严格（更小）的值。",
          status_en="deprecated since NCCL 2.17 in favour of NCCL_MAX_CTAS (also settable through "
                    "ncclCommInitRankConfig); if both are set the lower value wins.",
          since="2.5.0"),
    _nccl("NCCL_MIN_NCHANNELS", "int",
          "NCCL 至少使用的 channel 数；更多 channel 可能提升性能，但占用更多 CUDA 计算资源。2.5 起上限 32。",
          "Minimum number of channels; more may improve performance but uses more CUDA compute. Up to 32 "
          "since 2.5.",
          lo=1, hi=32, status="deprecated", replacement="NCCL_MIN_CTAS",
          status_zh="NCCL 2.17 起已弃用，改用 NCCL_MIN_CTAS；两者都设置时取更严格（更大）的值。",
          status_en="deprecated since NCCL 2.17 in favour of NCCL_MIN_CTAS; if both are set the higher "
                    "value wins.",
          since="2.5.0"),
    _nccl("NCCL_MAX_NRINGS", "int",
          "NCCL_MAX_NCHANNELS 在 2.4 及以前的旧名字。",
          "The old (up to 2.4) name of NCCL_MAX_NCHANNELS.",
          lo=1, status="renamed", replacement="NCCL_MAX_NCHANNELS",
          status_zh="这是 2.4 及以前的旧名字，新版本里仍作为别名生效，但只要设置了 NCCL_MAX_NCHANNELS 就会被忽略"
                    "（而 NCCL_MAX_NCHANNELS 本身也已弃用，应改用 NCCL_MAX_CTAS）。",
          status_en="the name used until 2.4; it still works as an alias but is ignored when "
                    "NCCL_MAX_NCHANNELS is set (itself deprecated in favour of NCCL_MAX_CTAS).",
          since="2.0.5"),
    _nccl("NCCL_MIN_NRINGS", "int",
          "NCCL_MIN_NCHANNELS 在 2.4 及以前的旧名字。",
          "The old (up to 2.4) name of NCCL_MIN_NCHANNELS.",
          lo=1, status="renamed", replacement="NCCL_MIN_NCHANNELS",
          status_zh="这是 2.4 及以前的旧名字，新版本里仍作为别名生效，但只要设置了 NCCL_MIN_NCHANNELS 就会被忽略"
                    "（而 NCCL_MIN_NCHANNELS 本身也已弃用，应改用 NCCL_MIN_CTAS）。",
          status_en="the name used until 2.4; it still works as an alias but is ignored when "
                    "NCCL_MIN_NCHANNELS is set (itself deprecated in favour of NCCL_MIN_CTAS).",
          since="2.2.0"),
    _nccl("NCCL_CHECKS_DISABLE", "bool",
          "关闭每次集合通信调用的参数检查（可以降低延迟）。",
          "Disables argument checks on each collective call (lower latency).",
          default="0", status="deprecated",
          status_zh="NCCL 2.2.12 起已弃用。", status_en="deprecated since NCCL 2.2.12.", since="2.0.5"),
    _nccl("NCCL_CHECK_POINTERS", "bool",
          "每次集合通信调用时检查 CUDA 内存指针（开发期有用，会增加延迟）。",
          "Checks CUDA memory pointers on each collective call (useful in development, adds latency).",
          default="0", status="deprecated", replacement="NCCL_CHECK_MODE",
          status_zh="NCCL 2.29.7 起已弃用，由 NCCL_CHECK_MODE=DEBUG_LOCAL 取代，将来的版本可能删除。",
          status_en="deprecated since NCCL 2.29.7, replaced by NCCL_CHECK_MODE=DEBUG_LOCAL; may be removed "
                    "in future versions.",
          since="2.2.12"),
    _nccl("NCCL_CHECK_MODE", "enum",
          "输入参数的检查方式：DEFAULT 不检查；DEBUG_LOCAL 在本地检查参数和指针；DEBUG_GLOBAL 做全局检查"
          "（例如对称缓冲区检查）。",
          "How input arguments are checked: DEFAULT (no checks), DEBUG_LOCAL (arguments and pointers, "
          "locally), DEBUG_GLOBAL (global checks such as symmetric buffers).",
          default="DEFAULT", choices=("DEFAULT", "DEBUG_LOCAL", "DEBUG_GLOBAL"), since="2.29.7"),
    _nccl("NCCL_LAUNCH_MODE", "enum",
          "NCCL 启动 CUDA kernel 的方式。默认 PARALLEL；GROUP 对管理多块 GPU 的进程使用 cooperative groups，"
          "该取值 2.9 起已弃用。",
          "How NCCL launches CUDA kernels. PARALLEL is the default; GROUP (cooperative groups for processes "
          "managing several GPUs) is deprecated since 2.9.",
          default="PARALLEL", choices=("PARALLEL",), deprecated_choices=("GROUP",), since="2.1.0"),
    _nccl("NCCL_IB_DISABLE", "bool",
          "设为 1 时不使用 IB/RoCE（InfiniBand Verbs）传输，改用其他方式，例如 IP socket。",
          "1 stops NCCL from using the IB/RoCE (InfiniBand Verbs) transport; it falls back to another "
          "one such as IP sockets."),
    _nccl("NCCL_IB_AR_THRESHOLD", "int",
          "超过这个大小（字节）的 InfiniBand 数据单独发一条消息，以便利用自适应路由；设得比 NCCL_BUFFSIZE 还大等于完全不用自适应路由。",
          "Above this size (bytes) InfiniBand data goes in a separate message that can use adaptive "
          "routing; above NCCL_BUFFSIZE it disables adaptive routing completely.",
          default="8192", lo=0, since="2.6"),
    _nccl("NCCL_IB_OOO_RQ", "bool",
          "允许接收端 QP 乱序消费 Receive WR。",
          "Lets the receiver-side QP consume Receive WRs out of order.",
          default="0", since="2.30"),
    _nccl("NCCL_IB_QPS_PER_CONNECTION", "int",
          "两个 rank 之间每个连接使用的 IB queue pair 数，多级网络需要更多 QP 来提高路由熵。取值 1-128。",
          "IB queue pairs per connection between two ranks; multi-level fabrics may need several for "
          "routing entropy. 1-128.",
          default="1", lo=1, hi=128, since="2.10"),
    _nccl("NCCL_IB_SPLIT_DATA_ON_QPS", "bool",
          "有多个 QP 时如何使用：1 把每条消息平均拆到各个 QP 上（QP 多时可能增加延迟）；0 按消息轮流使用 QP。",
          "How several QPs are used: 1 splits each message evenly over them (latency may suffer with many "
          "QPs); 0 uses them round-robin per message.",
          default="0", since="2.18"),
    _nccl("NCCL_IB_CUDA_SUPPORT", "bool",
          "曾用于强制开启或关闭 GPU Direct RDMA。",
          "Used to force or disable GPU Direct RDMA.",
          status="removed", replacement="NCCL_NET_GDR_LEVEL",
          status_zh="NCCL 2.4.0 已删除这个变量，设置它不会有任何效果；请改用 NCCL_NET_GDR_LEVEL。",
          status_en="removed in NCCL 2.4.0: setting it has no effect; use NCCL_NET_GDR_LEVEL."),
    _nccl("NCCL_IB_PCI_RELAXED_ORDERING", "enum",
          "IB Verbs 传输是否使用 PCI Relaxed Ordering（虚拟化环境里可能大幅提升性能）。2 自动（默认）；1 强制开启，"
          "不支持时报错；0 关闭。",
          "Relaxed Ordering for the IB Verbs transport (can help a lot in virtualized environments). 2: "
          "automatic (default); 1: force, fail if unavailable; 0: off.",
          default="2", choices=("0", "1", "2"), since="2.12"),
    _nccl("NCCL_IB_ADAPTIVE_ROUTING", "bool",
          "IB Verbs 传输是否使用支持自适应路由的数据传输，需要配合选择开启了自适应路由的 SL（见 NCCL_IB_SL）。",
          "Adaptive-routing capable transfers on IB Verbs; an adaptive-routing SL must be selected "
          "accordingly (see NCCL_IB_SL).",
          default="1 on InfiniBand, 0 on RoCE", since="2.16"),
    _nccl("NCCL_IB_ECE_ENABLE", "bool",
          "在 IB/RoCE 上启用 Enhanced Connection Establishment（ECE），由网卡实现拥塞控制、自适应路由等高级特性。",
          "Enhanced Connection Establishment (ECE) on IB/RoCE, passing features such as congestion "
          "control and adaptive routing to the HCAs.",
          default="1", since="2.23"),
    _nccl("NCCL_MEM_SYNC_DOMAIN", "enum",
          "NCCL kernel 默认使用的 Memory Sync Domain（CUDA 12.0、sm90 及以上），用来减少与计算 kernel 的相互干扰。",
          "Default Memory Sync Domain of NCCL kernels (CUDA 12.0, sm90 and later), to reduce interference "
          "with compute kernels.",
          default="1", choices=("0", "1"), since="2.16"),
    _nccl("NCCL_CUMEM_ENABLE", "bool",
          "用 CUDA cuMem* 系列函数分配 NCCL 的显存。2.19 起在系统支持时自动开启，设置它可以覆盖自动检测。",
          "Allocates NCCL memory with the CUDA cuMem* functions; since 2.19 enabled automatically when "
          "supported, and this variable overrides the detection.",
          default="auto (since 2.19)", since="2.18"),
    _nccl("NCCL_CUMEM_HOST_ENABLE", "bool",
          "用 cuMem 分配主机内存（代替 /dev/shm）。2.24 起在 CUDA 驱动 ≥ 12.6、运行时 ≥ 12.2 且支持时默认开启；"
          "在 NUMA 支持不完整的虚拟机或容器里出问题时，可以设为 0 关掉。",
          "Allocates host memory with cuMem (instead of /dev/shm). Since 2.24 on by default with driver "
          ">= 12.6, runtime >= 12.2 and support present; set 0 if it causes trouble, e.g. in VMs or "
          "containers without working NUMA.",
          default="1 when supported (since 2.24)", since="2.23"),
    _nccl("NCCL_NET_GDR_LEVEL", "enum",
          "控制网卡与 GPU 之间多远的距离内使用 GPU Direct RDMA：LOC 从不使用；PIX 同一 PCI 交换机下；PXB 经过多个 "
          "PCI 交换机；PHB 同一 NUMA 节点（经过 CPU）；SYS 跨 NUMA 节点也用。不设置时自动选择。0-4 的整数写法只为兼容保留。",
          "The largest NIC-to-GPU distance at which GPU Direct RDMA is used: LOC never; PIX same PCI "
          "switch; PXB across PCI switches; PHB same NUMA node (through the CPU); SYS across NUMA nodes. "
          "Unset, NCCL chooses. The integer spellings 0-4 are legacy and discouraged.",
          choices=_LEVELS, deprecated_choices=_LEGACY_LEVEL_INTS, since="2.3.4", check="path_level"),
    _nccl("NCCL_IB_GDR_LEVEL", "enum",
          "NCCL_NET_GDR_LEVEL 的旧名字。",
          "The old name of NCCL_NET_GDR_LEVEL.",
          choices=_LEVELS, status="renamed", replacement="NCCL_NET_GDR_LEVEL",
          status_zh="NCCL 2.4.0 把它改名为 NCCL_NET_GDR_LEVEL；文档没有说旧名字是否还生效，请改用新名字。",
          status_en="renamed NCCL_NET_GDR_LEVEL in NCCL 2.4.0; the docs do not say the old name still "
                    "works, so use the new one.",
          since="2.3.4"),
    _nccl("NCCL_NET_GDR_C2C", "bool",
          "网卡挂在 CPU 上（距离 PHB）而 CPU 通过 C2C 连接 GPU 时，也使用 GPU Direct RDMA，对这块网卡覆盖 NCCL_NET_GDR_LEVEL。",
          "Uses GPU Direct RDMA through a NIC attached to a CPU (distance PHB) that reaches the GPU over "
          "C2C, overriding NCCL_NET_GDR_LEVEL for that NIC.",
          default="1 (since 2.27)", since="2.26"),
    _nccl("NCCL_NET_GDR_READ", "bool",
          "发送数据时是否让网卡直接读 GPU 显存（前提是距离在 NCCL_NET_GDR_LEVEL 之内）。在 PCI-E 等平台上直接读显存可能略慢于读主存。",
          "Whether the NIC reads GPU memory directly when sending (within NCCL_NET_GDR_LEVEL's distance); "
          "on some platforms such as PCI-E this is slightly slower than reading host memory.",
          default="1 on NVLink-based platforms, 0 otherwise (since 2.4.2)"),
    _nccl("NCCL_GDRCOPY_ENABLE", "bool",
          "为 NCCL 内部控制结构使用的、CPU 可访问的显存启用 GDRCopy。",
          "Enables GDRCopy for the CPU-accessible CUDA memory of NCCL's internal control structures.",
          default="0"),
    _nccl("NCCL_GDRCOPY_FIFO_ENABLE", "bool",
          "启用 GDRCopy 时，通信器的 work FIFO 是否放在 GDRCopy 映射的显存里（关闭时放在 CUDA 主机内存）。",
          "With GDRCopy, whether the communicator work FIFO lives in GDRCopy-mapped CUDA memory (else in "
          "CUDA host memory).",
          default="1"),
    _nccl("NCCL_GDRCOPY_SYNC_ENABLE", "bool",
          "网络 proxy 的同步字（例如连接的 head/tail 指针）是否放在 GDRCopy 映射的显存里。",
          "Whether network proxy synchronization words (connection head/tail pointers) use GDRCopy-mapped "
          "CUDA memory.",
          default="1"),
    _nccl("NCCL_GDRCOPY_FLUSH_ENABLE", "bool",
          "接收端的 GDRDMA 可见性 flush 是否改用对 GDRCopy 映射显存的一次 CPU 读。",
          "Whether the receive-side GDRDMA visibility flush is a CPU read of GDRCopy-mapped memory.",
          default="0"),
    _nccl("NCCL_NET_SHARED_BUFFERS", "bool",
          "节点间点对点通信使用共享缓冲池，内存占用不再随远端 peer 数线性增长。",
          "Shared buffers for inter-node point-to-point traffic: one pool for all remote peers, so memory "
          "does not grow with their number.",
          default="1", since="2.8"),
    _nccl("NCCL_NET_SHARED_COMMS", "bool",
          "PXN 场景下复用同一批连接，便于聚合消息，但会降低网络包的熵。",
          "Reuses connections in the PXN case: allows message aggregation but lowers packet entropy.",
          default="1", since="2.12"),
    _nccl("NCCL_IGNORE_NET_MISMATCH", "bool",
          "各 rank 可用的网络设备数不一致时是否忽略（默认忽略）；设为 0 时初始化会失败。",
          "Whether mismatched network device counts across ranks are ignored (default); 0 makes "
          "initialization fail.",
          default="1", since="2.30"),
    _nccl("NCCL_IGNORE_COLLNET_MISMATCH", "bool",
          "各 rank 可用的 CollNet 设备数不一致时是否忽略；默认不忽略，初始化直接报错，因为这通常意味着配置有误。",
          "Whether mismatched CollNet device counts across ranks are ignored; by default initialization "
          "fails, as it usually means a misconfiguration.",
          default="0", since="2.30"),
    _nccl("NCCL_SINGLE_RING_THRESHOLD", "int",
          "曾用于设置只用一个 ring 的消息大小上限（字节）。",
          "Set the size below which NCCL used a single ring.",
          status="removed",
          status_zh="NCCL 2.3 已删除，设置它不会有任何效果。",
          status_en="removed in NCCL 2.3: setting it has no effect.", since="2.1"),
    _nccl("NCCL_LL_THRESHOLD", "int",
          "曾用于设置使用低延迟（LL）算法的消息大小上限（字节）。",
          "Set the size below which NCCL used low-latency algorithms.",
          status="removed", replacement="NCCL_PROTO",
          status_zh="NCCL 2.5 已删除，设置它不会有任何效果；协议选择现在由 NCCL_PROTO 控制。",
          status_en="removed in NCCL 2.5: setting it has no effect; protocols are now chosen with NCCL_PROTO.",
          since="2.1"),
    _nccl("NCCL_TREE_THRESHOLD", "int",
          "曾用于设置使用 tree 算法（而不是 ring）的消息大小上限（字节）。",
          "Set the size below which NCCL used tree algorithms instead of rings.",
          status="removed", replacement="NCCL_ALGO",
          status_zh="NCCL 2.5 已删除，设置它不会有任何效果；算法选择现在由 NCCL_ALGO 控制。",
          status_en="removed in NCCL 2.5: setting it has no effect; algorithms are now chosen with NCCL_ALGO.",
          since="2.4"),
    _nccl("NCCL_ALGO", "list",
          "限定 NCCL 可用的算法，逗号分隔、不区分大小写：Ring、Tree、CollnetChain、CollnetDirect、NVLS、NVLSTree、"
          "PAT（旧版本的 Collnet 只到 2.13）。以 ^ 开头表示排除。2.24 起还可以按函数指定，例如 "
          "allreduce:tree;broadcast:ring，并且遇到不认识的名字会直接失败。不设置时由 NCCL 按拓扑自动选择。",
          "Which algorithms NCCL may use, comma-separated and case-insensitive: Ring, Tree, CollnetChain, "
          "CollnetDirect, NVLS, NVLSTree, PAT (Collnet only up to 2.13); a leading ^ excludes. Since 2.24 "
          "per-function lists such as allreduce:tree;broadcast:ring are accepted and unknown tokens make "
          "NCCL fail. Unset, NCCL chooses from the topology.",
          choices=ALGORITHMS, deprecated_choices=("Collnet",), case_insensitive=True, since="2.5",
          check="algo"),
    _nccl("NCCL_PROTO", "list",
          "限定 NCCL 可用的协议，逗号分隔、不区分大小写：LL、LL128、Simple，以 ^ 开头表示排除；2.24 起也可以按函数指定。"
          "官方不建议设置它，除非怀疑某个协议有 bug 而要禁用它；在不支持 LL128 的平台上强制 LL128 可能导致数据损坏。",
          "Which protocols NCCL may use, comma-separated and case-insensitive: LL, LL128, Simple; a leading "
          "^ excludes; per-function lists since 2.24. The docs discourage setting it except to disable a "
          "protocol suspected of a bug: forcing LL128 where unsupported can corrupt data.",
          choices=PROTOCOLS, case_insensitive=True, since="2.5", check="proto"),
    _nccl("NCCL_NVB_DISABLE", "bool",
          "禁止节点内经由中间 GPU 走 NVLink 转发的通信。",
          "Disables intra-node communication through NVLink via an intermediate GPU.",
          default="0", since="2.11"),
    _nccl("NCCL_PXN_DISABLE", "bool",
          "禁止 PXN：节点间通信经 NVLink 和中间 GPU 使用非本地网卡。",
          "Disables PXN: inter-node traffic through a non-local NIC via NVLink and an intermediate GPU.",
          default="0", since="2.12"),
    _nccl("NCCL_P2P_PXN_LEVEL", "enum",
          "send/receive 什么情况下使用 PXN：0 从不；1 目标偏好的网卡无法经 PCI 交换机到达时；2（默认）总是使用，"
          "把节点内各 GPU 的数据聚合到中间 GPU 上。",
          "When send/receive use PXN: 0 never; 1 when the destination's preferred NIC is not reachable "
          "through PCI switches; 2 (default) always, aggregating data on an intermediate GPU.",
          default="2", choices=("0", "1", "2"), since="2.12"),
    _nccl("NCCL_PXN_C2C", "bool",
          "对端 GPU 经 C2C + PCIe 连到目标网卡时，允许使用 PXN。",
          "Allows PXN when the peer GPU reaches the target NIC through C2C + PCIe.",
          default="1 (since 2.28)", since="2.27"),
    _nccl("NCCL_RUNTIME_CONNECT", "bool",
          "在运行时（第一次调用集合通信时）才建立 peer 连接，而不是在初始化阶段；设为 0 改为初始化时连接。",
          "Connects peers at runtime (first collective call) instead of at init; 0 connects at init.",
          default="1", since="2.22"),
    _nccl("NCCL_GRAPH_REGISTER", "bool",
          "NCCL 调用被 CUDA Graph 捕获时启用用户缓冲区注册，以减少拷贝（只在 CollNet 等条件满足时生效）。",
          "User buffer registration when NCCL calls are captured by CUDA Graphs, to save copies (only "
          "effective under conditions such as CollNet being used).",
          default="1", since="2.11"),
    _nccl("NCCL_LOCAL_REGISTER", "bool",
          "用户显式调用 ncclCommRegister 时启用本地缓冲区注册。",
          "Local user buffer registration when ncclCommRegister is called explicitly.",
          default="1", since="2.19"),
    _nccl("NCCL_LEGACY_CUDA_REGISTER", "bool",
          "是否允许注册 cudaMalloc 分配的旧式缓冲区；这可能引入隐式同步甚至卡死，因此默认关闭，应改用基于 cuMem 的分配器。",
          "Whether legacy (cudaMalloc) buffers may be registered; this can synchronize implicitly and hang, "
          "so it is off by default; move to cuMem-based allocators instead.",
          default="0", since="2.24"),
    _nccl("NCCL_WIN_ENABLE", "bool",
          "启用 window 内存注册。",
          "Enables window memory registration.",
          default="1", since="2.27"),
    _nccl("NCCL_SET_STACK_SIZE", "bool",
          "把 CUDA kernel 栈大小设为所有 NCCL kernel 中的最大值，可避免加载时重新配置显存；遇到因此卡住的情况时设为 1。",
          "Sets the CUDA kernel stack size to the largest among NCCL kernels, avoiding a memory "
          "reconfiguration on load; set 1 if that reconfiguration hangs.",
          default="0", since="2.9"),
    _nccl("NCCL_GRAPH_MIXING_SUPPORT", "bool",
          "是否支持多个并行 CUDA Graph（或 Graph 与未捕获的调用）同时有未完成的 NCCL 调用；关掉它是为了绕开同一线程"
          "发起多个 rank 的 cudaGraphLaunch 时出现过的卡死。",
          "Support for outstanding NCCL calls from parallel CUDA graphs, or a graph plus non-captured calls; "
          "disabling it works around hangs seen when one thread launches graphs for several ranks.",
          default="1", since="2.13"),
    _nccl("NCCL_GRAPH_STREAM_ORDERING", "bool",
          "CUDA Graph 捕获期间，NCCL 是否在内部把通信 kernel 串行化。设为 0 可提升频繁捕获场景的性能，"
          "但要由应用自己保证同一 GPU 上的 NCCL 操作不重叠，而且不能与 graph mixing 同时使用。",
          "Whether NCCL serializes communication kernels internally during CUDA graph capture. 0 can speed "
          "up capture-heavy workloads but the application must keep NCCL operations on a GPU from "
          "overlapping, and graph mixing must be off.",
          default="1", since="2.30"),
    _nccl("NCCL_RMA_EAGER_INIT", "bool",
          "单边 RMA 信号在通信器初始化时就建立（1），还是等到第一次 ncclCommWindowRegister（0，默认）。",
          "Whether one-sided RMA signal setup happens at communicator init (1) or at the first "
          "ncclCommWindowRegister (0, default).",
          default="0", since="2.31"),
    _nccl("NCCL_DMABUF_ENABLE", "bool",
          "通过 Linux dma-buf 子系统注册 GPU Direct RDMA 缓冲区；内核或驱动不支持时自动关闭。",
          "GPU Direct RDMA buffer registration through Linux dma-buf; disabled automatically when the "
          "kernel or drivers lack support.",
          default="1", since="2.13"),
    _nccl("NCCL_P2P_NET_CHUNKSIZE", "int",
          "ncclSend/ncclRecv 经网络发送时每条消息的大小（字节），建议取 2 的幂。",
          "Size in bytes of the network messages of ncclSend/ncclRecv; powers of 2 are recommended.",
          default="131072", lo=1, since="2.14", check="pow2"),
    _nccl("NCCL_P2P_LL_THRESHOLD", "int",
          "P2P 操作使用 LL 协议的最大消息大小（字节）。",
          "Largest message size (bytes) for which P2P operations use the LL protocol.",
          default="16384", lo=0, since="2.14"),
    _nccl("NCCL_ALLOC_P2P_NET_LL_BUFFERS", "bool",
          "为所有 P2P 网络连接分配专用 LL 缓冲区；rank 很多的 all-to-all 场景下内存开销会很大。",
          "Dedicated LL buffers for every P2P network connection; costly in memory for all-to-all with "
          "many ranks.",
          default="0", since="2.14"),
    _nccl("NCCL_COMM_BLOCKING", "bool",
          "NCCL 调用是否允许阻塞：1 为阻塞式通信器，0 为非阻塞式；设置后会覆盖所有通信器配置里的 blocking。",
          "Whether NCCL calls may block: 1 blocking communicators, 0 non-blocking; overrides the blocking "
          "field of every communicator's config.",
          since="2.14"),
    _nccl("NCCL_CGA_CLUSTER_SIZE", "int",
          "CUDA Cooperative Group Array（线程块簇）的大小（sm90 及以上），取值 0-8；会覆盖通信器配置里的 cgaClusterSize。",
          "CUDA Cooperative Group Array (thread block cluster) size on sm90+, 0 to 8; overrides "
          "cgaClusterSize in every communicator's config.",
          lo=0, hi=8, since="2.16"),
    _nccl("NCCL_MAX_CTAS", "int",
          "NCCL 最多使用的 CTA 数，正整数，2.25 起上限 64；是已弃用的 NCCL_MAX_NCHANNELS 的替代品。CTA 越多吞吐可能越高，"
          "但会占用更多 GPU 资源。",
          "Maximum number of CTAs, a positive integer up to 64 (32 before 2.25); the replacement of the "
          "deprecated NCCL_MAX_NCHANNELS. More CTAs may raise throughput but take GPU resources.",
          lo=1, hi=64, since="2.17"),
    _nccl("NCCL_MIN_CTAS", "int",
          "NCCL 至少使用的 CTA 数，正整数，上限 64；是已弃用的 NCCL_MIN_NCHANNELS 的替代品。做基准测试时常把最小值和最大值设成一样。",
          "Minimum number of CTAs, a positive integer up to 64; the replacement of the deprecated "
          "NCCL_MIN_NCHANNELS. Benchmarks often set the minimum and maximum to the same value.",
          lo=1, hi=64, since="2.17"),
    _nccl("NCCL_NVLS_ENABLE", "enum",
          "是否使用 NVLink SHARP（NVLS，第三代 NVSwitch + Hopper 及以后的 GPU），把 AllReduce 等集合通信卸载到 "
          "NVSwitch。0 关闭；1 开启（不支持时不报错，但资源分配失败会报错）；2（默认）与 1 相同。",
          "NVLink SHARP (NVLS; third-generation NVSwitch with Hopper or later) offloading collectives such "
          "as AllReduce to the NVSwitch. 0 off; 1 on (no failure without support, failure if resources "
          "cannot be allocated); 2 (default) same as 1.",
          default="2", choices=("0", "1", "2"), since="2.17"),
    _nccl("NCCL_IB_MERGE_NICS", "bool",
          "把双端口 IB 网卡合并成一个逻辑网络设备，便于聚合带宽。",
          "Merges dual-port IB NICs into one logical device to aggregate their bandwidth.",
          default="1", since="2.20"),
    _nccl("NCCL_NET_MERGE_POLICY", "enum",
          "把多个物理 HCA 合并成虚拟 HCA 时的策略：ALL（默认）不看 rail；RAIL 只合并属于同一 rail 的设备。",
          "How physical HCAs are merged into a virtual one: ALL (default) regardless of rail; RAIL only "
          "devices sharing a rail.",
          default="ALL", choices=("ALL", "RAIL"), since="2.30.5"),
    _nccl("NCCL_MNNVL_ENABLE", "enum",
          "是否使用多节点 NVLink（MNNVL，需要 NCCL_CUMEM_ENABLE 和配置好的 IMEX 域）。0 关闭；1 开启，不支持时初始化失败；"
          "2 自动检测，不支持也不报错。",
          "Multi-Node NVLink (needs NCCL_CUMEM_ENABLE and a working IMEX domain). 0 off; 1 on, init fails "
          "without support; 2 automatic, never fails.",
          choices=("0", "1", "2"), since="2.21"),
    _nccl("NCCL_MNNVL_UUID", "int",
          "手工指定多节点 NVLink 的 UUID（64 位整数）；正常情况下由 Fabric Manager 分配，不需要设置。",
          "Overrides the Multi-Node NVLink UUID (64-bit integer); normally assigned by the Fabric Manager.",
          since="2.25"),
    _nccl("NCCL_MNNVL_CLIQUE_ID", "int",
          "手工指定多节点 NVLink 的 clique ID（32 位整数），可用来“软”划分 MNNVL 作业。",
          "Overrides the Multi-Node NVLink clique ID (32-bit integer), e.g. to soft-partition MNNVL jobs.",
          since="2.25"),
    _nccl("NCCL_RAS_ENABLE", "bool",
          "启用 NCCL 的 RAS（可靠性、可用性、可服务性）子系统，运行中可以查询作业的健康状况。",
          "Enables NCCL's RAS (reliability, availability, serviceability) subsystem to query job health "
          "while it runs.",
          default="1", since="2.24"),
    _nccl("NCCL_RAS_ADDR", "str",
          "RAS 子系统监听客户端连接的地址和端口（host:port，IPv6 地址要加方括号）。同一节点跑多个独立作业时，每个作业请用不同端口。",
          "Address and port (host:port; IPv6 in brackets) the RAS subsystem listens on. Independent jobs "
          "sharing a node should use different ports.",
          default="localhost:28028", since="2.24", check="host_port"),
    _nccl("NCCL_RAS_TIMEOUT_FACTOR", "str",
          "RAS 子系统所有超时的倍数（正数）；应用因调试、跟踪而变慢时可以调大。",
          "Multiplier (a positive number) applied to every RAS timeout; raise it when debugging or tracing "
          "slows the application down.",
          default="1", since="2.24", check="positive_number"),
    _nccl("NCCL_LAUNCH_ORDER_IMPLICIT", "bool",
          "按主机程序顺序隐式排序同一设备上不同通信器的 NCCL 操作，避免死锁。",
          "Orders NCCL operations of different communicators on one device by host program order, so they "
          "cannot deadlock.",
          default="0", since="2.26"),
    _nccl("NCCL_LAUNCH_RACE_FATAL", "bool",
          "尝试捕获多个主机线程抢着向同一设备发起 launch 的情况，并返回致命错误。",
          "Tries to catch host threads racing to launch to the same device and returns a fatal error.",
          default="1", since="2.26"),
    _nccl("NCCL_IPC_USE_ABSTRACT_SOCKET", "bool",
          "节点内交换 CUDA IPC 句柄时使用 Linux abstract socket；多个容器处于不同网络命名空间时可能导致节点内 GPU 通信失败，"
          "此时可设为 0。",
          "Uses Linux abstract sockets to exchange CUDA IPC handles within a node; across containers in "
          "different network namespaces this can break intra-node GPU traffic, then set 0.",
          default="1", since="2.29"),
    _nccl("NCCL_SYM_GIN_KERNELS_ENABLE", "bool",
          "启用通过 GIN 做网络通信的对称 kernel。",
          "Enables symmetric kernels that use GIN for network communication.",
          default="1", since="2.29U1"),
]
_NCCL_DEBUGGING = [EnvVar(**{**v.__dict__, "debugging": True}) for v in _NCCL_DEBUGGING]

# ============================================================================== PyTorch
_PYTORCH = [
    _torch("TORCH_NCCL_ASYNC_ERROR_HANDLING", "enum",
           "watchdog 发现 NCCL 异常时如何处理：0 不处理；1 中止 NCCL 通信器并结束进程；2 只中止通信器；"
           "3（默认）直接结束进程、不中止通信器。",
           "What the watchdog does when it sees an NCCL error: 0 nothing; 1 abort the NCCL communicator "
           "and tear the process down; 2 abort the communicator only; 3 (default) tear the process down "
           "without aborting the communicator.",
           default="3", choices=("0", "1", "2", "3")),
    _torch("NCCL_ASYNC_ERROR_HANDLING", "enum",
           "TORCH_NCCL_ASYNC_ERROR_HANDLING 的旧名字（它是 PyTorch 的变量，不是 NCCL 的）。",
           "The old name of TORCH_NCCL_ASYNC_ERROR_HANDLING (a PyTorch variable, not an NCCL one).",
           choices=("0", "1", "2", "3"), status="renamed", replacement="TORCH_NCCL_ASYNC_ERROR_HANDLING",
           source=PT_PGNCCL_HPP),
    _torch("TORCH_NCCL_HIGH_PRIORITY", "bool",
           "NCCL 通信器是否使用高优先级的 CUDA stream。",
           "Whether the NCCL communicator uses a high-priority CUDA stream."),
    _torch("TORCH_NCCL_BLOCKING_WAIT", "bool",
           "wait() 是否阻塞。设置后进程会阻塞等待，直到 init_process_group 的 timeout 到期。",
           "Whether wait() blocks; when set, the process blocks and waits up to init_process_group's "
           "timeout."),
    _torch("NCCL_BLOCKING_WAIT", "bool",
           "TORCH_NCCL_BLOCKING_WAIT 的旧名字（它是 PyTorch 的变量，不是 NCCL 的）。",
           "The old name of TORCH_NCCL_BLOCKING_WAIT (a PyTorch variable, not an NCCL one).",
           status="renamed", replacement="TORCH_NCCL_BLOCKING_WAIT", source=PT_PGNCCL_HPP),
    _torch("TORCH_NCCL_DUMP_ON_TIMEOUT", "bool",
           "watchdog 超时或检测到异常时，把调试信息（flight recorder 记录）落盘；必须同时把 "
           "TORCH_NCCL_TRACE_BUFFER_SIZE 设为大于 0。",
           "Dumps debug information (the flight recorder) when the watchdog times out or sees an error; "
           "needs TORCH_NCCL_TRACE_BUFFER_SIZE above 0."),
    _torch("TORCH_NCCL_DESYNC_DEBUG", "bool",
           "开启 desync 调试，帮助找出集合通信不同步时是哪个 rank 出了问题。",
           "Enables desync debugging, which helps find the culprit rank of a collective desync."),
    _torch("NCCL_DESYNC_DEBUG", "bool",
           "TORCH_NCCL_DESYNC_DEBUG 的旧名字（它是 PyTorch 的变量，不是 NCCL 的）。",
           "The old name of TORCH_NCCL_DESYNC_DEBUG (a PyTorch variable, not an NCCL one).",
           status="renamed", replacement="TORCH_NCCL_DESYNC_DEBUG", source=PT_PGNCCL_HPP),
    _torch("TORCH_NCCL_ENABLE_TIMING", "bool",
           "设为 1 时为所有 ProcessGroupNCCL 集合通信记录起始事件，精确统计每次集合通信的耗时。",
           "1 records start events for every ProcessGroupNCCL collective and computes accurate "
           "per-collective timing."),
    _torch("NCCL_ENABLE_TIMING", "bool",
           "TORCH_NCCL_ENABLE_TIMING 的旧名字（它是 PyTorch 的变量，不是 NCCL 的）。",
           "The old name of TORCH_NCCL_ENABLE_TIMING (a PyTorch variable, not an NCCL one).",
           status="renamed", replacement="TORCH_NCCL_ENABLE_TIMING", source=PT_PGNCCL_HPP),
    _torch("TORCH_NCCL_ENABLE_MONITORING", "bool",
           "设为 1 时启动监控线程：ProcessGroupNCCL 的 watchdog 线程卡住、超过 TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC "
           "没有心跳时结束进程，避免作业长时间卡死占着集群资源。",
           "1 starts a monitoring thread that aborts the process when the ProcessGroupNCCL watchdog gets "
           "stuck with no heartbeat for TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC, so hung jobs free the cluster."),
    _torch("TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC", "seconds",
           "watchdog 心跳超时（秒），超过后监控线程会结束进程。",
           "Watchdog heartbeat timeout in seconds after which the monitoring thread aborts the process.",
           lo=1),
    _torch("TORCH_NCCL_TRACE_BUFFER_SIZE", "int",
           "flight recorder 环形缓冲区最多记录的事件数（一次集合通信的开始或结束各算一个事件）；设为 0 关闭记录和调试信息落盘。",
           "Maximum number of events kept in the flight recorder's ring buffer (the start or the end of a "
           "collective is one event); 0 disables the buffer and the debug dump.",
           lo=0, check="fr_alias"),
    _torch("TORCH_FR_BUFFER_SIZE", "int",
           "flight recorder 环形缓冲区的事件数，是 Flight Recorder 现在优先读取的名字（旧名字 TORCH_NCCL_TRACE_BUFFER_SIZE）。",
           "Number of events in the flight recorder ring buffer: the name the Flight Recorder now reads "
           "first (old name TORCH_NCCL_TRACE_BUFFER_SIZE).",
           lo=0, source=PT_FLIGHT_RECORDER_HPP),
    _torch("TORCH_NCCL_TRACE_CPP_STACK", "bool",
           "flight recorder 是否收集 C++ 调用栈。",
           "Whether the flight recorder collects C++ stack traces.",
           default="0", status="renamed", replacement="TORCH_FR_CPP_STACK",
           status_zh="PyTorch 文档仍列出这个名字，但 Flight Recorder 现在读取的是 TORCH_FR_CPP_STACK，"
                     "旧名字作为兼容别名仍生效，同时会打印一次弃用警告。",
           status_en="the PyTorch docs still list it, but the Flight Recorder now reads TORCH_FR_CPP_STACK "
                     "and accepts this name as a deprecated alias (with a one-time deprecation warning).",
           source=PT_FLIGHT_RECORDER_HPP),
    _torch("TORCH_FR_CPP_STACK", "bool",
           "flight recorder 是否收集 C++ 调用栈（TORCH_NCCL_TRACE_CPP_STACK 的新名字）。",
           "Whether the flight recorder collects C++ stack traces (new name of TORCH_NCCL_TRACE_CPP_STACK).",
           default="0", source=PT_FLIGHT_RECORDER_HPP),
    _torch("TORCH_NCCL_COORD_CHECK_MILSEC", "int",
           "监控线程检查其他 rank 协调信号（例如要求落盘调试信息）的间隔，单位毫秒。",
           "Interval in milliseconds at which the monitoring thread checks coordinated signals from other "
           "ranks (e.g. to dump debug information).",
           default="1000", lo=1),
    _torch("TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC", "int",
           "超时后为了落盘调试信息额外等待多久（毫秒），然后才退出并抛出超时异常。",
           "Extra time in milliseconds spent waiting for the debug dump before exiting with the timeout "
           "exception.",
           lo=0),
    _torch("TORCH_NCCL_DEBUG_INFO_TEMP_FILE", "path",
           "调试信息落盘写入的文件。",
           "The file the debug information is dumped into."),
    _torch("TORCH_NCCL_DEBUG_INFO_PIPE_FILE", "path",
           "用来手动触发落盘的管道文件：往管道里写任何内容都会触发一次调试信息落盘。",
           "A pipe file to trigger the dump by hand: writing anything into it triggers a dump."),
    _torch("TORCH_NCCL_NAN_CHECK", "bool",
           "检查集合通信的输入是否含 NaN，发现时抛出错误。",
           "Checks collective inputs for NaN and raises an error when one is found."),
    _torch("TORCH_NCCL_AVOID_RECORD_STREAMS", "bool",
           "开启后 ProcessGroupNCCL 不再对张量调用 recordStream，而是持有张量引用直到用户 stream 与通信 stream 同步，"
           "以此保证 caching allocator 的安全。",
           "When set, ProcessGroupNCCL does not call recordStream on tensors; it keeps references until "
           "the user streams are synced with the comm streams, for caching-allocator safety.",
           source=PT_PGNCCL_HPP),
    _torch("TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK", "bool",
           "在 CUDA caching allocator 上注册钩子，张量分配或释放时自动在所有 NCCL 通信器上注册或注销它。",
           "Registers hooks on the CUDA caching allocator so tensors are registered with (and deregistered "
           "from) every NCCL communicator as they are allocated and freed.",
           source=PT_PGNCCL_HPP),
    _torch("NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK", "bool",
           "TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK 的旧名字（它是 PyTorch 的变量，不是 NCCL 的）。",
           "The old name of TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK (a PyTorch variable, not an NCCL one).",
           status="renamed", replacement="TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK", source=PT_PGNCCL_HPP),
    _torch("TORCH_NCCL_BCAST_UNIQUEID", "bool",
           "控制是否广播 NCCL 的 uniqueId。",
           "Controls the broadcasting of the NCCL uniqueId.",
           source=PT_PGNCCL_HPP),
    _torch("TORCH_NCCL_PROPAGATE_ERROR", "bool",
           "是否通过 TCPStore 把 NCCL 错误传播给所有 rank。",
           "Whether NCCL errors are propagated to all ranks through the TCPStore.",
           source=PT_PGNCCL_HPP),
    _torch("TORCH_NCCL_RETHROW_CUDA_ERRORS", "bool",
           "watchdog 中遇到 CUDA 错误时是否重新抛出（源码注释说明默认为真）。",
           "Whether the watchdog rethrows CUDA errors (the header comment says it defaults to true).",
           default="1", source=PT_PGNCCL_HPP),
    _torch("TORCH_NCCL_LOG_CPP_STACK_ON_UNCLEAN_SHUTDOWN", "bool",
           "非正常退出时是否记录 C++ 调用栈（源码注释说明默认为真）。",
           "Whether C++ stack traces are logged on unclean shutdown (the header comment says it defaults "
           "to true).",
           default="1", source=PT_PGNCCL_HPP),
    _torch("TORCH_NCCL_CUDA_EVENT_CACHE", "bool",
           "watchdog 线程处理集合通信时是否使用 CudaEventCache；持有 CUDA 全局锁时销毁 CudaEvent 曾导致卡死。",
           "Whether the watchdog uses a CudaEventCache for collectives; destroying CUDA events while the "
           "CUDA global lock is held has caused hangs.",
           source=PT_PGNCCL_HPP),
    _torch("TORCH_NCCL_RANKS_PER_ROOT", "int",
           "NCCL 通信器初始化时每个 root 负责的 rank 数。",
           "How many ranks each root covers during NCCL communicator initialization.",
           lo=1, source=PT_PGNCCL_HPP),
    _torch("TORCH_NCCL_SHOW_EAGER_INIT_P2P_SERIALIZATION_WARNING", "bool",
           "是否显示 eager init 时 P2P 串行化的警告。",
           "Whether the eager-init P2P serialization warning is shown.",
           source=PT_PGNCCL_HPP),
    _torch("TORCH_DISTRIBUTED_DEBUG", "enum",
           "torch.distributed 的调试级别：OFF（默认）、INFO、DETAIL。INFO 在 DDP 初始化时打印更多日志；DETAIL "
           "还会检查每次集合通信在各 rank 上是否一致（形状、类型），能把挂起变成清楚的报错，但会影响性能。"
           "日志要配合 TORCH_CPP_LOG_LEVEL=INFO 才能看到。",
           "torch.distributed debug level: OFF (default), INFO or DETAIL. INFO adds DDP initialization "
           "logging; DETAIL also checks that every collective matches across ranks (shapes, types), "
           "turning hangs into clear errors at a performance cost. The logs need TORCH_CPP_LOG_LEVEL=INFO.",
           default="OFF", choices=("OFF", "INFO", "DETAIL"), source=PT_DISTRIBUTED),
    _torch("TORCH_CPP_LOG_LEVEL", "enum",
           "c10 日志（GLOG 与 c10 logger）的级别：INFO、WARNING、ERROR、FATAL，或对应的数字 0、1、2、3。",
           "Log level of c10 logging (GLOG and c10 loggers): INFO, WARNING, ERROR, FATAL, or 0, 1, 2, 3.",
           choices=("INFO", "WARNING", "ERROR", "FATAL", "0", "1", "2", "3"), source=PT_DEBUG_ENV),
    _torch("TORCH_SHOW_CPP_STACKTRACES", "bool",
           "设为 1 时，PyTorch 检测到 C++ 错误会打印调用栈；与 TORCH_DISTRIBUTED_DEBUG=DETAIL 搭配可记录不同步时的完整调用栈。",
           "1 makes PyTorch print a stack trace when it detects a C++ error; with "
           "TORCH_DISTRIBUTED_DEBUG=DETAIL it logs the whole call stack of a collective desync.",
           source=PT_DEBUG_ENV),
    _torch("TORCH_GLOO_LAZY_INIT", "bool",
           "Gloo 后端按需建立连接，而不是一开始建立全连接，非 all-to-all 的负载可以大幅缩短初始化时间。",
           "The Gloo backend connects on demand instead of a full mesh, which can greatly shorten "
           "initialization for non-all-to-all workloads.",
           source=PT_DISTRIBUTED),
    _torch("MASTER_ADDR", "str",
           "rank 0 所在机器的地址（env:// 初始化时必需，rank 0 自己可以不设）。torchrun 会替你设置。",
           "Address of the rank-0 node (required for env:// initialization, except on rank 0). torchrun "
           "sets it for you.",
           source=PT_DISTRIBUTED),
    _torch("MASTER_PORT", "int",
           "rank 0 机器上的一个空闲端口，用于建立 TCPStore（env:// 初始化时必需）。torchrun 会替你设置。",
           "A free port on the rank-0 machine, used for the TCPStore (required for env:// initialization). "
           "torchrun sets it for you.",
           lo=1, hi=65535, source=PT_DISTRIBUTED),
    _torch("WORLD_SIZE", "int",
           "参与作业的进程总数；可以用环境变量设置，也可以在 init_process_group 里传入。",
           "Total number of processes in the job; set here or passed to init_process_group.",
           lo=1, source=PT_DISTRIBUTED),
    _torch("RANK", "int",
           "本进程的全局 rank；可以用环境变量设置，也可以在 init_process_group 里传入。",
           "The global rank of this process; set here or passed to init_process_group.",
           lo=0, source=PT_DISTRIBUTED),
    _torch("LOCAL_RANK", "int",
           "本进程在本机 worker 组里的 rank，由 torchrun 设置；通常用它选择 GPU。",
           "This worker's rank within its node, set by torchrun; commonly used to pick the GPU.",
           lo=0, source=PT_TORCHRUN),
    _torch("LOCAL_WORLD_SIZE", "int",
           "本机 worker 组的大小（本机运行的进程数），由 torchrun 设置。",
           "Size of the local worker group (processes on this node), set by torchrun.",
           lo=1, source=PT_TORCHRUN),
]

# ================================================================================= Gloo
_GLOO = [
    EnvVar("GLOO_SOCKET_IFNAME", "gloo", "list",
           "指定 Gloo 后端使用的网卡，例如 eth0；可以用逗号写多个网卡，Gloo 会轮流使用，"
           "但所有进程在这里写的网卡数量必须相同。",
           "Which network interface the Gloo backend uses, e.g. eth0; several can be given separated by "
           "commas and are used round-robin, but every process must list the same number of interfaces.",
           PT_DISTRIBUTED, check="gloo_ifname"),
]

VARS: dict[str, EnvVar] = {v.name: v for v in (*_NCCL_SYSTEM, *_NCCL_DEBUGGING, *_PYTORCH, *_GLOO)}

# Names that look like settings but that nothing reads. The value is (zh, en).
NOT_VARIABLES: dict[str, tuple[str, str]] = {
    "NCCL_TIMEOUT": (
        "NCCL_TIMEOUT 不是 NCCL 的环境变量，PyTorch 也不读它，设了等于没设。集合通信的超时要在 "
        "torch.distributed.init_process_group(timeout=datetime.timedelta(...)) 里传入"
        "（NCCL 后端默认 10 分钟，其他后端 30 分钟）。另外别和 NCCL_IB_TIMEOUT 搞混：那是 InfiniBand 底层的重传超时指数。",
        "NCCL_TIMEOUT is not an NCCL environment variable and PyTorch does not read it either: setting it "
        "does nothing. The collective timeout is the timeout= argument of "
        "torch.distributed.init_process_group (default 10 minutes for NCCL, 30 for other backends). Do "
        "not confuse it with NCCL_IB_TIMEOUT, the InfiniBand-level timeout exponent.",
    ),
    "TORCH_NCCL_TIMEOUT": (
        "TORCH_NCCL_TIMEOUT 不是 PyTorch 的环境变量（ProcessGroupNCCL 没有这个名字），设了等于没设。集合通信的超时要在 "
        "torch.distributed.init_process_group(timeout=datetime.timedelta(...)) 里传入（NCCL 后端默认 10 分钟）。",
        "TORCH_NCCL_TIMEOUT is not a PyTorch environment variable (ProcessGroupNCCL has no such name): "
        "setting it does nothing. The collective timeout is the timeout= argument of "
        "torch.distributed.init_process_group (default 10 minutes for NCCL).",
    ),
}
# Where the timeout fact comes from (init_process_group's documentation).
NOT_VARIABLES_SOURCE = PT_DISTRIBUTED

# Build-time / packaging names that share the NCCL_ prefix but are not runtime settings: not linted.
BUILD_NAMES = frozenset({"NCCL_VERSION", "NCCL_HOME", "NCCL_ROOT", "NCCL_ROOT_DIR", "NCCL_DIR",
                         "NCCL_INCLUDE_DIR", "NCCL_LIB_DIR", "NCCL_LIBRARY", "NCCL_LIBRARIES",
                         "NCCL_PATH", "NCCL_INSTALL_DIR"})

# Prefixes of the families this module inspects; everything else (PATH, HOME, ...) is ignored.
PREFIXES = ("NCCL_", "TORCH_NCCL_", "TORCH_FR_", "TORCH_DISTRIBUTED_", "GLOO_", "TORCH_GLOO_")
