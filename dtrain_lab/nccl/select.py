"""Which devices an NCCL device list selects, parsed exactly as NCCL parses it (lesson 11)."""
from __future__ import annotations

import re


def nccl_list_selects(spec: str, name: str, port: int = -1) -> bool:
    """Does the NCCL device list ``spec`` (``NCCL_SOCKET_IFNAME``, ``NCCL_IB_HCA``) select device
    ``name`` (on ``port``; -1: any)? Exactly as NCCL parses it (``parseStringList`` and
    ``matchIfList`` in NCCL's src/misc/utils.cc, and their callers):

    * an optional leading ``^`` turns the list into an exclude list;
    * then an optional ``=`` makes *every* item an exact name (``=eth0,eth1``); an ``=`` in front
      of a later item is just a character of that item's name, so that item matches nothing;
    * items are comma-separated ``name[:port]``; without ``=`` a name is a prefix (``mlx5_1``
      also matches ``mlx5_10``); an item without a port matches every port.
    """
    exclude = spec.startswith("^")
    rest = spec[1:] if exclude else spec
    exact = rest.startswith("=")
    rest = rest[1:] if exact else rest
    items = []
    for raw in rest.split(","):
        prefix, colon, tail = raw.partition(":")
        if not prefix:
            continue
        m = re.match(r"\s*[+-]?\d+", tail) if colon else None
        items.append((prefix, int(m.group()) if m else (0 if colon else -1)))  # C's atoi: junk -> 0
    if not items:  # NCCL: an empty list matches everything
        hit = True
    else:
        hit = any((name == p if exact else name.startswith(p)) and (port == -1 or ip == -1 or ip == port)
                  for p, ip in items)
    return hit != exclude


def socket_ifname_selects(spec: str, names) -> list[str]:
    """The interfaces among ``names`` that ``NCCL_SOCKET_IFNAME=spec`` lets NCCL use.

    NCCL's rule (env.html, NCCL_SOCKET_IFNAME): a comma-separated list of name *prefixes*
    (``eth`` selects eth0, eth1, ...); a leading ``^`` turns it into an exclude list; ``=`` at the
    start of the list (after ``^`` if any) makes every item an exact name (``=eth0,eth1``,
    ``^=docker0``); the matching itself is :func:`nccl_list_selects`. Only this filter is
    modelled: what NCCL prefers among the survivors when the variable is unset (ib* first, lo and
    docker* only if nothing else exists) is not.

        >>> socket_ifname_selects("eth", ["eth0", "eth10", "ens1", "lo"])
        ['eth0', 'eth10']
        >>> socket_ifname_selects("=eth1", ["eth1", "eth10"])
        ['eth1']
    """
    return [n for n in names if nccl_list_selects(spec, n)]
