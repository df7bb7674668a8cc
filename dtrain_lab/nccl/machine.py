"""The doctor: this machine as NCCL and torch.distributed will see it (GPUs, network interfaces,
/dev/shm, ulimits, versions, the relevant variables), and :func:`format_doctor` to print it.

Safe on CPU-only machines: CUDA APIs are only touched when CUDA is available, and a broken driver
never breaks the report.
"""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Mapping

from dtrain_lab import caps
from dtrain_lab import i18n
from dtrain_lab.nccl.lint import lint_env, relevant
from dtrain_lab.nccl.recommend import GIB, SHM_MIN, recommend
from dtrain_lab.nccl.vars import VARS

ICON = {"error": "✗", "warning": "!", "info": "·"}


def _cuda_available(torch) -> bool:
    # A CPU build, a missing driver or a broken one must never break the doctor (caps catches them).
    return caps.have("cuda")


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

            info["count"] = caps.gpu_count()
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
        out.append({
            "name": name, "up": bool(st.isup) if st else None,
            "speed_mbps": (st.speed or None) if st else None, "mtu": st.mtu if st else None,
            "addresses": addresses, "kind": _interface_kind(name, flags),
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
            "total_gib": round(u.total / GIB, 2), "free_gib": round(u.free / GIB, 2), "low": u.total < SHM_MIN}


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


def doctor(environ: Mapping[str, str] | None = None) -> dict:
    """Inspect this machine the way NCCL / torch.distributed will see it.

    Keys: ``torch`` (versions, CUDA/NCCL/Gloo availability, NCCL version), ``gpus`` (devices,
    ``nvidia-smi topo -m``), ``network`` (interfaces: up, speed, addresses, kind), ``shm``
    (/dev/shm size), ``ulimits`` (memlock, nofile, stack), ``env`` (the relevant variables and
    their lint findings) and ``recommendations`` (code, severity, message {"zh", "en"}, source).
    """
    environ = os.environ if environ is None else environ
    t = _torch_info()
    env_vars = {k: ("<hidden>" if k in VARS and VARS[k].secret else v)
                for k, v in sorted(environ.items()) if relevant(k)}
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
    report["recommendations"] = recommend(report, environ)
    return report


def format_doctor(report: dict, lang: str | None = None) -> str:
    """``doctor()``'s report as text for a terminal, in ``lang`` (default: the learner's language)."""
    def h(key, **fields):
        return i18n.tr(key, lang, **fields)

    yn = lambda b: h("nccl_doctor_yes") if b else h("nccl_doctor_no")  # noqa: E731
    t, g = report["torch"], report["gpus"]
    lines = [h("nccl_doctor_h_torch"),
             f"  torch {t['version']}  (CUDA build: {t['cuda_build'] or '-'}, "
             f"CUDA available: {yn(t['cuda_available'])})",
             f"  nccl backend: {yn(t['nccl_available'])}   gloo backend: {yn(t['gloo_available'])}   "
             f"NCCL version: {t['nccl_version'] or '-'}",
             h("nccl_doctor_h_gpus"), h("nccl_doctor_gpu_count", count=g["count"])]
    for d in g["devices"]:
        lines.append(f"  [{d['index']}] {d['name']}  {d['memory_gib']} GiB  sm_{d['capability'].replace('.', '')}")
    if g.get("topology"):
        lines += ["  nvidia-smi topo -m:"] + ["    " + x for x in g["topology"].splitlines()]
    lines.append(h("nccl_doctor_h_network"))
    for n in report["network"]:
        if "name" not in n:
            continue
        addrs = ", ".join(a["address"] for a in n["addresses"]) or "-"
        speed = f"{n['speed_mbps']} Mb/s" if n["speed_mbps"] else "-"
        note = f"  ({h('nccl_doctor_skipped_by_default')})" if n["nccl_skips_by_default"] else ""
        lines.append(f"  {n['name']:<12} {'UP' if n['up'] else 'down':<5} {n['kind']:<15} {speed:<11} {addrs}{note}")
    shm = report["shm"]
    lines.append(h("nccl_doctor_h_shm"))
    lines.append("  " + (h("nccl_doctor_shm_size", total=shm["total_gib"], free=shm["free_gib"]) if shm
                         else h("nccl_doctor_none")))
    lines.append(h("nccl_doctor_h_ulimits"))
    for k, v in report["ulimits"].items():
        lines.append(f"  {k:<8} soft={v['soft']}  hard={v['hard']}")
    lines.append(h("nccl_doctor_h_env"))
    lines += [f"  {k}={v}" for k, v in report["env"]["vars"].items()] or [f"  {h('nccl_doctor_none')}"]
    lines.append(h("nccl_doctor_h_recs"))
    if not report["recommendations"]:
        lines.append(f"  {h('nccl_doctor_none')}")
    for rec in report["recommendations"]:
        lines.append(f"  {ICON[rec['severity']]} {i18n.pick(rec['message'], lang)}")
        if rec.get("source"):
            lines.append(f"      {rec['source']}")
    return "\n".join(lines)
