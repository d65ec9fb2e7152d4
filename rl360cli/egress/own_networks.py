"""Which addresses are the node's own networks, which an allowed name must never lead the egress proxy to.

The rule the proxy keeps: an allowed name that DNS resolves to the node itself, to a private network or to a
network the node has an interface on is refused (a name rebound to 127.0.0.1 would reach the router and the
engines; one rebound into the cluster network, its other machines). Python's `is_global` alone is not that
rule: it also calls the documentation and benchmarking ranges (192.0.2.0/24, 198.18.0.0/15,
203.0.113.0/24, ...) "not global", and a machine whose resolver answers public names with such an address
(this dev machine's answers deb.debian.org and pypi.org with 203.0.113.80, its way out) could then reach
nothing. So the refused set is named here: loopback, RFC 1918 and carrier-grade NAT (100.64.0.0/10),
link-local, multicast, unspecified and broadcast, IPv6 unique-local, and every network of the node's own
interfaces (`ip -j addr`, read when the proxy starts: this machine's 192.0.2.0/24 among them). Without
`ip` the stricter `not is_global` stands.

    networks = node_networks()
    is_own(ipaddress.ip_address("203.0.113.80"), networks)   # False unless an interface is on it

Test: tests/egress/test_own_networks.py.
"""

from __future__ import annotations

import ipaddress
import json
import shutil
import subprocess

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address

ALWAYS = tuple(ipaddress.ip_network(n) for n in (
    "0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16", "172.16.0.0/12",
    "192.168.0.0/16", "224.0.0.0/4", "255.255.255.255/32",
    "::/128", "::1/128", "fc00::/7", "fe80::/10", "ff00::/8"))


def interface_networks() -> tuple[Network, ...] | None:
    """The networks of this machine's interfaces (None when `ip` cannot say)."""
    ip = shutil.which("ip")
    if ip is None:
        return None
    try:
        out = subprocess.run([ip, "-j", "addr", "show"], capture_output=True, text=True, timeout=10, check=True)
        found = []
        for link in json.loads(out.stdout):
            for entry in link.get("addr_info") or []:
                if entry.get("local") and entry.get("prefixlen") is not None:
                    local = entry["local"].split("%")[0]
                    found.append(ipaddress.ip_network(f"{local}/{entry['prefixlen']}", strict=False))
        return tuple(found)
    except (OSError, subprocess.SubprocessError, ValueError, KeyError):
        return None


def node_networks() -> tuple[Network, ...] | None:
    """The refused networks: the fixed ones and the interfaces' (None: `ip` could not say, refuse all but
    global addresses)."""
    interfaces = interface_networks()
    return None if interfaces is None else ALWAYS + interfaces


def is_own(address: Address, networks: tuple[Network, ...] | None) -> bool:
    """Whether `address` is one of the node's own networks (`networks` from node_networks())."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    if networks is None:
        return not address.is_global
    return any(address.version == n.version and address in n for n in networks)
