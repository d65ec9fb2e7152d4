"""The proxy's rule for the node's own networks (rl360cli/egress/own_networks.py): what it refuses and what it
lets an allowed name reach. Pure: no packet is sent."""

from __future__ import annotations

import ipaddress

import pytest

from rl360cli.egress.own_networks import ALWAYS, interface_networks, is_own, node_networks


@pytest.mark.parametrize("address", ["127.0.0.1", "10.0.0.5", "172.16.3.4", "192.168.1.1", "100.64.0.1",
                                     "169.254.169.254", "0.0.0.0", "224.0.0.1", "::1", "fd00::5", "fe80::1",
                                     "::ffff:127.0.0.1", "::ffff:10.0.0.5"])
def test_loopback_private_and_link_local_are_refused(address):
    assert is_own(ipaddress.ip_address(address), ALWAYS)


@pytest.mark.parametrize("address", ["151.101.2.132", "203.0.113.80", "198.51.100.7", "2a04:4e42::644"])
def test_public_and_documentation_addresses_are_not_the_nodes(address):
    # 203.0.113.80: what this dev machine's resolver answers for deb.debian.org and pypi.org (its way out).
    assert not is_own(ipaddress.ip_address(address), ALWAYS)


def test_a_network_the_node_has_an_interface_on_is_refused():
    networks = node_networks()
    if networks is None:
        pytest.skip("no `ip` here: the stricter is_global rule stands")
    interfaces = interface_networks()
    for network in interfaces:
        assert is_own(network.network_address, networks)
    # However the node's address is numbered (this machine's eth0 is on 192.0.2.0/24, a documentation range).
    assert is_own(ipaddress.ip_address("192.0.2.1"), ALWAYS + (ipaddress.ip_network("192.0.2.0/24"),))


def test_without_ip_only_global_addresses_pass():
    assert is_own(ipaddress.ip_address("203.0.113.80"), None)
    assert not is_own(ipaddress.ip_address("151.101.2.132"), None)
