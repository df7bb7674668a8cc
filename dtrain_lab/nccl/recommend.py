"""The doctor's recommendations: what in a machine report (``doctor()``) NCCL is known to trip on."""
from __future__ import annotations

import os
from collections.abc import Mapping

from dtrain_lab import i18n
from dtrain_lab.nccl.select import nccl_list_selects
from dtrain_lab.nccl.vars import NCCL_ENV, NCCL_NET_TROUBLESHOOTING, NCCL_RUNTIME_TROUBLESHOOTING, PT_DISTRIBUTED

GIB = 1024 ** 3
SHM_MIN = 1 * GIB           # NCCL's docs suggest --shm-size=1g for containers
NOFILE_HINT = 32768         # NCCL's docs: a 144-rank job with 16 GIN contexts may need over 32K


def _rec(code: str, severity: str, key: str, source: str | None = None, **fields) -> dict:
    return {"code": code, "severity": severity, "key": key, "message": i18n.rendered(key, **fields), "source": source}


def _torch_and_gpus(r: dict) -> list[dict]:
    recs = []
    t, g = r["torch"], r["gpus"]
    if not t["cuda_available"]:
        recs.append(_rec("no-gpu", "info", "nccl_rec_no_gpu", PT_DISTRIBUTED))
    elif not t["nccl_available"]:
        recs.append(_rec("no-nccl", "warning", "nccl_rec_no_nccl", PT_DISTRIBUTED))
    if t["cuda_available"] and not g["nvidia_smi"]:
        recs.append(_rec("no-nvidia-smi", "info", "nccl_rec_no_nvidia_smi"))
    return recs


def _shm_and_limits(r: dict) -> list[dict]:
    recs = []
    shm = r["shm"]
    if shm is None:
        recs.append(_rec("no-shm", "info", "nccl_rec_no_shm", NCCL_RUNTIME_TROUBLESHOOTING))
    elif shm["low"]:
        recs.append(_rec("small-shm", "warning", "nccl_rec_small_shm", NCCL_RUNTIME_TROUBLESHOOTING,
                         gib=shm["total_gib"]))
    lim = r["ulimits"]
    has_ib = os.path.isdir("/sys/class/infiniband") and bool(os.listdir("/sys/class/infiniband"))
    if lim and lim["memlock"]["soft"] != "unlimited" and (has_ib or r["torch"]["cuda_available"]):
        recs.append(_rec("memlock", "warning" if has_ib else "info", "nccl_rec_memlock", NCCL_NET_TROUBLESHOOTING,
                         limit=lim["memlock"]["soft"]))
    if lim and isinstance(lim["nofile"]["soft"], int) and lim["nofile"]["soft"] < NOFILE_HINT:
        recs.append(_rec("nofile", "info", "nccl_rec_nofile", NCCL_RUNTIME_TROUBLESHOOTING, limit=lim["nofile"]["soft"]))
    if lim and lim["stack"]["soft"] == "unlimited":
        recs.append(_rec("stack-unlimited", "warning", "nccl_rec_stack_unlimited", NCCL_RUNTIME_TROUBLESHOOTING))
    return recs


def _network(r: dict, environ: Mapping[str, str]) -> list[dict]:
    recs = []
    nets = [n for n in r["network"] if "name" in n]
    up = [n for n in nets if n["up"]]
    usable = [n for n in up if n["kind"] not in ("loopback", "container")]
    if nets and not usable:
        recs.append(_rec("loopback-only", "warning", "nccl_rec_loopback_only", NCCL_NET_TROUBLESHOOTING))
    nccl_if, gloo_if = environ.get("NCCL_SOCKET_IFNAME"), environ.get("GLOO_SOCKET_IFNAME")
    if len(usable) > 1 and not nccl_if:
        recs.append(_rec("several-interfaces", "info", "nccl_rec_several_interfaces", NCCL_NET_TROUBLESHOOTING,
                         names=", ".join(n["name"] for n in usable)))
    if any(n["name"].startswith("docker") for n in nets):
        recs.append(_rec("docker-bridge", "info", "nccl_rec_docker_bridge", NCCL_ENV))
    if nccl_if and nets and not any(nccl_list_selects(nccl_if.strip(), n["name"]) for n in up):
        recs.append(_rec("ifname-no-match", "warning", "nccl_rec_ifname_no_match", NCCL_ENV, value=nccl_if))
    if gloo_if and nets:
        missing = [i for i in gloo_if.split(",") if i and i not in {n["name"] for n in nets}]
        if missing:
            recs.append(_rec("gloo-ifname-missing", "warning", "nccl_rec_gloo_ifname_missing", PT_DISTRIBUTED,
                             names=", ".join(missing)))
    return recs


def recommend(r: dict, environ: Mapping[str, str]) -> list[dict]:
    """Recommendations for the machine report ``r`` (``code``, ``severity``, ``key``, ``message``
    in both languages, ``source``)."""
    recs = _torch_and_gpus(r) + _shm_and_limits(r) + _network(r, environ)
    bad = [f for f in r["env"]["findings"] if f["severity"] in ("error", "warning")]
    if bad:
        recs.append(_rec("env-findings", "warning", "nccl_rec_env_findings", n=len(bad)))
    return recs
