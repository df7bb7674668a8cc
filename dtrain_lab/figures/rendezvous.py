"""Lesson 12: two simulated nodes meeting through torchrun's c10d rendezvous, from what the run
recorded (``cluster.run_local_nodes`` and ``multinode_check``'s reports): the order in which the
agents started, the order of their process ids (the rendezvous sorts its participants by address,
then pid; every "node" here has the address 127.0.0.1), the node rank each agent was given, and the
global ranks of its workers. Orders and ranks only: never a pid, a port or a time."""
from __future__ import annotations

from dtrain_lab.figures._grid import box, color, new_figure
from dtrain_lab.i18n import tr

GREY, DARK = "#6E6E6E", "#4D4D4D"


def inputs(nodes: list, everyone: list, start_order: list[int]) -> dict:
    """The figure's inputs from ``NodesResult.nodes``, one worker's ``everyone`` rows
    ``(host, group rank, local rank, pid, agent pid)`` and the ``start_order`` the nodes were started in."""
    agent_of = {row[1]: row[4] for row in everyone}     # group rank -> its agent's pid
    by_pid = sorted(set(agent_of.values()))
    out = []
    for i in start_order:
        n = next(n for n in nodes if n.requested_rank == i)
        out.append({"node": i, "group_rank": n.group_rank, "ranks": list(n.ranks),
                    "pid_order": by_pid.index(agent_of[n.group_rank])})
    return {"nnodes": len(nodes), "world_size": len(everyone), "nodes": out}


def draw(data: dict, lang: str):
    nodes = data["nodes"]
    n = len(nodes)
    fig = new_figure(10.5, 1.25 * n + 2.0)
    ax = fig.add_subplot()
    ax.set_xlim(-0.6, 3.6)
    ax.set_ylim(n - 0.3, -0.9)
    ax.axis("off")
    heads = ("fig_rdzv_h_start", "fig_rdzv_h_sort", "fig_rdzv_h_assign", "fig_rdzv_h_workers")
    for x, key in enumerate(heads):
        ax.text(x, -0.7, tr(key, lang), ha="center", va="center", fontsize=8.5, color=DARK)
    for k, node in enumerate(nodes):
        c = color(node["group_rank"])
        box(ax, 0, k, tr("fig_rdzv_started", lang, node=node["node"], k=k + 1), GREY, w=0.8, h=0.72, size=7.5)
        y = node["pid_order"]
        box(ax, 1, y, tr("fig_rdzv_pid", lang, node=node["node"], k=y + 1), GREY, w=0.8, h=0.72, size=7.5)
        ax.annotate("", xy=(0.6, y), xytext=(0.4, k), arrowprops={"arrowstyle": "->", "color": DARK, "lw": 0.9})
        g = node["group_rank"]
        box(ax, 2, g, tr("fig_rdzv_group", lang, node=node["node"], g=g), c, w=0.8, h=0.72, size=7.5)
        ax.annotate("", xy=(1.6, g), xytext=(1.4, y), arrowprops={"arrowstyle": "->", "color": DARK, "lw": 0.9})
        ranks = ", ".join(str(r) for r in node["ranks"])
        extra = tr("fig_rdzv_store", lang) if g == 0 else ""
        box(ax, 3, g, tr("fig_rdzv_ranks", lang, ranks=ranks, extra=extra), c, w=0.8, h=0.72, size=7.5)
        ax.annotate("", xy=(2.6, g), xytext=(2.4, g), arrowprops={"arrowstyle": "->", "color": DARK, "lw": 0.9})
    ax.set_title(tr("fig_rdzv_title", lang, nnodes=data["nnodes"], p=data["world_size"]), fontsize=10)
    fig.tight_layout()
    return fig
