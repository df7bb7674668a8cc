"""Lesson 11's library helper: which interfaces NCCL_SOCKET_IFNAME selects (no processes launched)."""
import pytest

from dtrain_lab.nccl import socket_ifname_selects

NAMES = ["eth0", "eth1", "eth10", "ens3", "ib0", "docker0", "docker1", "lo"]


@pytest.mark.parametrize("spec,selected", [
    # the examples of NCCL's env.html, NCCL_SOCKET_IFNAME
    ("eth", ["eth0", "eth1", "eth10"]),                  # prefix: every eth*
    ("=eth0", ["eth0"]),                                 # exact name
    ("=eth0,eth1", ["eth0", "eth1"]),                    # one = makes the whole list exact
    ("^docker", ["eth0", "eth1", "eth10", "ens3", "ib0", "lo"]),
    ("^=docker0", ["eth0", "eth1", "eth10", "ens3", "ib0", "docker1", "lo"]),
    # what the lesson points out: without =, a full name is still a prefix
    ("eth1", ["eth1", "eth10"]),
    ("=eth1", ["eth1"]),
    ("eth9", []),
])
def test_socket_ifname_selects_follows_nccls_rule(spec, selected):
    assert socket_ifname_selects(spec, NAMES) == selected


def test_socket_ifname_selects_keeps_the_given_order_and_accepts_any_iterable():
    assert socket_ifname_selects("e", iter(["ens3", "eth0"])) == ["ens3", "eth0"]


def test_an_equals_sign_only_counts_at_the_start_of_the_list():
    # NCCL reads "=" once, before the first item: in "eth0,=eth1" the second item is the literal
    # name "=eth1", which no interface has
    assert socket_ifname_selects("eth0,=eth1", NAMES) == ["eth0"]
