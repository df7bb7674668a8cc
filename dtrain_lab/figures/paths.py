"""Lesson 11: the paths NCCL can take between two GPUs (P2P over NVLink, SHM through host memory,
NET over InfiniBand, NET over sockets), drawn from a topology description, never from hand-placed
shapes: each device is placed from the description and each path is routed along the devices it lists.

* Stored: a DGX-like node, :data:`NODE` (``node_topology.toml``, with its sources): the same picture on
  every machine.
* Live only: :func:`plot_here`, the same kind of description built from what the course detects on this
  machine (:func:`dtrain_lab.nccl.doctor`'s report: GPUs, NVLink in ``nvidia-smi topo -m``, network
  interfaces, ``/dev/shm``). It depends on the machine, so it is never stored."""
from __future__ import annotations

import functools
import tomllib
from pathlib import Path

from dtrain_lab.figures._grid import box, color, new_figure
from dtrain_lab.i18n import tr

GREY, DARK, LIGHT = "#6E6E6E", "#4D4D4D", "#8C8C8C"
# transport -> (catalogue key of its legend, colour index)
TRANSPORTS = {"p2p_nvlink": ("fig_paths_p2p_nvlink", 2), "p2p_pcie": ("fig_paths_p2p_pcie", 2),
              "shm": ("fig_paths_shm", 1), "net_ib": ("fig_paths_net_ib", 0),
              "net_socket": ("fig_paths_net_socket", 5), "gloo_socket": ("fig_paths_gloo_socket", 5)}


@functools.lru_cache(maxsize=1)
def node() -> dict:
    """The DGX-like node of ``node_topology.toml`` as the figure's inputs (plain JSON data)."""
    data = tomllib.loads((Path(__file__).with_name("node_topology.toml")).read_text(encoding="utf-8"))
    return {"name": data["name"], "world_size": data["gpus"], "gpus": data["gpus"], "nvswitch": data["nvswitch"],
            "cpus": data["cpus"], "switches": data["switch"], "paths": data["path"]}


def here(report: dict) -> dict:
    """The same description for this machine, from :func:`dtrain_lab.nccl.doctor`'s ``report``."""
    gpus = min(int(report["gpus"]["count"]), 8)
    nvlink = "NV" in (report["gpus"].get("topology") or "")
    ib = [n for n in report["network"] if n.get("kind") == "infiniband" and n.get("up")]
    nics = list(range(len(ib)))
    switches = [{"cpu": 0, "gpus": list(range(gpus)), "nics": nics}] if gpus or nics else []
    paths = []
    if gpus >= 2:
        last = gpus - 1
        paths.append({"transport": "p2p_nvlink" if nvlink else "p2p_pcie",
                      "via": ["gpu:0", "nvswitch" if nvlink else "switch:0", "gpu:1"]})
        if report.get("shm"):
            paths.append({"transport": "shm", "via": [f"gpu:{last}", "switch:0", "cpu:0", "switch:0", "gpu:0"]})
    if gpus and ib:
        paths.append({"transport": "net_ib", "via": ["gpu:0", "switch:0", "nic:0", "ib_fabric", "remote"]})
    if gpus:
        paths.append({"transport": "net_socket", "via": ["gpu:0", "switch:0", "cpu:0", "eth", "ip_network", "remote"]})
    else:
        paths.append({"transport": "gloo_socket", "via": ["cpu:0", "eth", "ip_network", "remote"]})
    return {"name": report.get("platform", "?"), "world_size": gpus, "gpus": gpus, "nvswitch": nvlink, "cpus": 1,
            "switches": switches, "paths": paths}


def _places(data: dict) -> dict:
    """Where each device sits: (x, y) of its centre."""
    n = max(data["gpus"], 2)
    at = {f"gpu:{i}": (i, 1.0) for i in range(data["gpus"])}
    at["nvswitch"] = ((n - 1) / 2, 0.0)
    cpu_x: dict[int, list[float]] = {}
    for k, sw in enumerate(data["switches"]):
        x = sum(sw["gpus"]) / len(sw["gpus"]) if sw["gpus"] else 0.5
        at[f"switch:{k}"] = (x, 2.2)
        for j, nic in enumerate(sw["nics"]):
            at[f"nic:{nic}"] = (x - 0.25 + 0.5 * j / max(len(sw["nics"]) - 1, 1), 3.2)
        cpu_x.setdefault(sw["cpu"], []).append(x)
    for c in range(data["cpus"]):
        xs = cpu_x.get(c, [c * 2.0])
        at[f"cpu:{c}"] = (sum(xs) / len(xs), 4.4)
    cpus = [at[f"cpu:{c}"][0] for c in range(data["cpus"])]
    at["eth"] = ((min(cpus) + max(cpus)) / 2 if len(cpus) > 1 else cpus[0] + 1.6, 5.5)
    right = n + 0.9
    at["ib_fabric"] = (right, 3.2)
    at["ip_network"] = (right, 5.5)
    at["remote"] = (right + 1.7, 4.3)
    return at


def _route(at: dict, via: list[str]) -> list[tuple[float, float]]:
    pts = []
    for k, name in enumerate(via):
        x, y = at[name]
        if name == "nvswitch":      # along the NVSwitch bar, between the GPUs on either side
            pts += [(at[via[k - 1]][0], y), (at[via[k + 1]][0], y)]
        else:
            pts.append((x, y))
    return pts


def _draw_on(ax, data: dict, text) -> None:
    at = _places(data)
    n = max(data["gpus"], 2)
    if data["nvswitch"]:
        box(ax, (n - 1) / 2, 0.0, text("fig_paths_nvswitch"), DARK, w=n - 0.1, h=0.45, size=9)
    for i in range(data["gpus"]):
        box(ax, i, 1.0, text("fig_paths_gpu", i=i), "#4E7A00", w=0.8, h=0.55, size=9)
    for k, sw in enumerate(data["switches"]):
        x, y = at[f"switch:{k}"]
        box(ax, x, y, text("fig_paths_switch"), GREY, w=max(len(sw["gpus"]), 1) - 0.2, h=0.45, size=8.5)
        for nic in sw["nics"]:
            box(ax, *at[f"nic:{nic}"], text("fig_paths_nic", n=nic), GREY, w=0.42, h=0.5, size=7.5)
    for c in range(data["cpus"]):
        box(ax, *at[f"cpu:{c}"], text("fig_paths_cpu", c=c), GREY, w=1.5, h=0.6, size=9)
    box(ax, *at["eth"], text("fig_paths_eth"), GREY, w=1.2, h=0.5, size=8.5)
    if any(sw["nics"] for sw in data["switches"]) or any("ib_fabric" in p["via"] for p in data["paths"]):
        box(ax, *at["ib_fabric"], text("fig_paths_ib_fabric"), LIGHT, w=1.3, h=0.5, size=8.5)
    box(ax, *at["ip_network"], text("fig_paths_ip"), LIGHT, w=1.3, h=0.5, size=8.5)
    box(ax, *at["remote"], text("fig_paths_remote"), LIGHT, w=1.3, h=2.6, size=9)
    for k, path in enumerate(data["paths"]):
        key, c = TRANSPORTS[path["transport"]]
        off = 0.06 * (k - (len(data["paths"]) - 1) / 2)
        xs, ys = zip(*[(x + off, y + off) for x, y in _route(at, path["via"])])
        # under the boxes (patches 1, text 3): a path joins the boxes' edges and never covers a label
        ax.plot(xs, ys, color=color(c), linewidth=3, alpha=0.85, solid_capstyle="round", zorder=0.5,
                label=text(key))
    ax.set_xlim(-0.7, n + 3.4)
    ax.set_ylim(6.0, -0.5)
    ax.axis("off")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.01), fontsize=9, frameon=False, ncol=1)


def draw(data: dict, lang: str):
    fig = new_figure(10.5, 7.2)
    ax = fig.add_subplot()
    _draw_on(ax, data, lambda key, **f: tr(key, lang, **f))
    ax.set_title(tr("fig_paths_title", lang, name=data["name"], gpus=data["gpus"]), fontsize=10)
    fig.tight_layout()
    return fig


def plot_here(report: dict):
    """This machine's paths, live only (it depends on the machine): :func:`here` drawn with viz."""
    from dtrain_lab.viz import label, new_figure as live_figure

    fig, ax = live_figure(figsize=(10, 6.8))
    data = here(report)
    _draw_on(ax, data, label)
    ax.set_title(label("fig_paths_here_title", gpus=data["gpus"]), fontsize=10)
    fig.tight_layout()
    return fig
