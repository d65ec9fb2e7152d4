"""A cluster profile's `[egress]`: where a sandbox that a task lets onto the network may go.

    [egress]
    mode = "allow"                          # "none" (the default) | "allow" | "open"
    allow = ["pypi.org", "files.pythonhosted.org", "*.debian.org"]
    cache_mb = 2048                         # the per-node cache of GET responses

    pypi_as_of = "2026-04-23T00:00:00Z"     # PyPI as it was then (optional)
    ca_bundle = "/etc/ssl/certs/ca-certificates.crt"  # what an installed agent's install step trusts (optional)

    [egress.mirrors]                        # URL prefix -> the prefix fetched instead
    "http://deb.debian.org/debian/" = "http://127.0.0.1:8081/debian/"

- `none`: no sandbox reaches anything beyond its own loopback, whatever its task says. The default: a
  fresh profile knows nothing of what its operator trusts, model-written code runs in these sandboxes,
  and nothing costs less (no proxy, no per-sandbox namespace). A task that wanted the network says so in
  its attempt (`network_denied`).
- `allow`: through rl360's egress proxy on the sandbox's node (rl360cli/egress/proxy.py), and only there:
  plain HTTP to the hosts of `allow` (GETs cached per node), HTTPS tunnelled (CONNECT) to them, and the
  `mirrors` rewrites; everything else is refused with one line naming the host and this table.
- `open`: the network as Harbor's own runs give it (a process sandbox's slirp4netns NAT, a container's
  bridge): anywhere but the node's own 127.0.0.1. For machines whose network is itself the fence.

Host patterns are Harbor's (its `allowed_hosts`): a name (`pypi.org`, that host only), a leading
wildcard (`*.debian.org`: its subdomains, not `debian.org` itself) or an IP address. A mirror's key is an
`http://` or `https://` URL prefix. An `https://` key makes the proxy terminate TLS for a CONNECT to that
key's host and port (a certificate signed by the proxy's own CA, which sandboxes trust: proxy.py, ca.py),
so it can read and rewrite the URLs inside; every other CONNECT stays a blind tunnel. `hosts` pins names
to addresses, as curl's `--resolve` does: a pinned or mirrored address may be one of the node's own
networks (a mirror on 127.0.0.1); a host that DNS resolves there is refused.

`pypi_as_of` (an RFC 3339 time with its zone) holds what the node's sandboxes resolve from PyPI to that
moment: the proxy drops from each Simple API project page (`pypi_indexes`, PyPI's by default) the files
uploaded after it (simple_api.py), for uv and pip alike, and for a mirror of PyPI an `https://` or
`http://` index prefix names (a mirrored prefix is dated too: what the sandbox asked for decides). An
`https://` index is read inside its TLS as an `https://` mirror is, for the sandboxes that trust the CA;
image builds and docker sidecars, which cannot be given the CA, reach it undated through a blind tunnel,
and the proxy's lines for them say so. Why per profile, not per task: the date is of the world the sandboxes
see, as the allow list is; Harbor's task.toml has no field for it (the datasets stay unchanged), and one
run's sandboxes then all see one PyPI (docs/sandboxes.md, "PyPI as of a date").

`ca_bundle` is for a cluster whose own way out re-signs TLS (a TLS-inspecting proxy beyond rl360's): the proxy
tunnels blind, so a build's RUN step meets that proxy's certificate, which a task's image need not trust. The
install step rl360 adds to a task's image (an installed agent's layer) trusts the file beside the image's own
roots, during that step only (agent/installed.py); the task's own Dockerfile and the sandboxes are left as
they are, as Harbor leaves them.

Test: tests/egress/test_egress_config.py.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal
from urllib.parse import urlsplit

from rl360cli.configload import check_at_least, check_positive, check_range

_LABEL = re.compile(r"^[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?$")


def host_pattern_problem(pattern: str) -> str | None:
    """Why `pattern` is not a host pattern (None when it is one): a name, `*.suffix` or an IP address."""
    if pattern != pattern.strip().lower() or not pattern:
        return "write host patterns in lowercase, without spaces"
    if "://" in pattern or "/" in pattern or (":" in pattern and not is_ip(pattern)):
        return "a host pattern is a name, *.suffix or an IP address, not a URL, port or path"
    name = pattern[2:] if pattern.startswith("*.") else pattern
    if is_ip(name):
        return "a wildcard names hosts, not addresses" if pattern.startswith("*.") else None
    if "*" in name or not all(_LABEL.match(label) for label in name.split(".")):
        return "only a leading '*.' wildcard, then letters, digits, '-' and '.'"
    return None


def host_matches(host: str, pattern: str) -> bool:
    """Whether `host` (lowercase, no port) is one `pattern` names: `*.x` is a subdomain of x, never x."""
    if pattern.startswith("*."):
        return host.endswith(pattern[1:])
    return host == pattern


def is_ip(text: str) -> bool:
    """Whether `text` is an IP address (v4 or v6), not a host name."""
    try:
        ipaddress.ip_address(text)
        return True
    except ValueError:
        return False


@dataclass(frozen=True, kw_only=True, slots=True)
class EgressConfig:
    """`[egress]` of a cluster profile (see the module docstring)."""

    mode: Literal["none", "allow", "open"] = "none"
    # `allow`: the hosts a sandbox may reach through the proxy (Harbor's host patterns).
    allow: tuple[str, ...] = ()
    # `allow`: URL prefix -> the prefix fetched in its place (Docker's registry-mirrors, for URLs). A mirrored
    # URL is served whether or not its host is on `allow`: the operator named where it comes from.
    mirrors: dict[str, str] = field(default_factory=dict)
    # Names the proxy resolves to these addresses rather than asking DNS (a mirror's or stand-in's name).
    hosts: dict[str, str] = field(default_factory=dict)
    # The per-node cache of GET responses (plain HTTP and mirrored URLs; never tunnelled bytes).
    cache_mb: int = 2048
    # A cached response that says nothing of its freshness (no Cache-Control max-age) is served this long.
    cache_ttl_s: float = 3600.0
    # The port the proxy listens on inside each sandbox's own network namespace (its 127.0.0.1).
    sandbox_port: int = 3128
    # The port of an installed agent's door to its own session's endpoint, on its sandbox's 127.0.0.1 (door.py).
    door_port: int = 3129
    # Connecting to an upstream host may take this long before it is a failure of an allowed host.
    connect_timeout_s: float = 10.0
    # PyPI as of this moment (RFC 3339 with its zone, "" for today's): files uploaded after it are dropped from
    # the Simple API pages under `pypi_indexes`. For runs whose rewards must not move when a package is released.
    pypi_as_of: str = ""
    # The Simple API prefixes that `pypi_as_of` dates (PyPI's; add a mirror's that sandboxes name themselves).
    pypi_indexes: tuple[str, ...] = ("https://pypi.org/simple/",)
    # A PEM file (an absolute path, the same on every node) that the install step rl360 adds to a task's image (an
    # installed agent's layer: agent/installed.py) trusts beside the image's own roots, for that step alone: for a
    # way out beyond this proxy that re-signs TLS (a TLS-inspecting proxy) with a CA the task's image does not
    # trust. The host's own system bundle is the usual value; "" (the default) adds nothing.
    ca_bundle: str = ""

    def __post_init__(self) -> None:
        if self.mode != "allow" and (self.allow or self.mirrors):
            raise ValueError(f'allow and mirrors are for mode = "allow" (mode is "{self.mode}"): set mode = '
                             '"allow", or remove them')
        for pattern in self.allow:
            problem = host_pattern_problem(pattern)
            if problem:
                raise ValueError(f"allow: {pattern!r}: {problem} (e.g. \"pypi.org\", \"*.debian.org\")")
        for prefix, target in self.mirrors.items():
            if not prefix.startswith(("http://", "https://")) or not urlsplit(prefix).hostname:
                raise ValueError(f"mirrors: {prefix!r} must be an http:// or https:// URL prefix "
                                 "(e.g. \"https://astral.sh/uv/\")")
            if urlsplit(prefix).path == "":
                raise ValueError(f"mirrors: {prefix!r} needs a path, at least \"/\" (e.g. {prefix + '/'!r})")
            if not target.startswith(("http://", "https://")) or not urlsplit(target).hostname:
                raise ValueError(f"mirrors.{prefix!r}: {target!r} must be an http:// or https:// URL prefix")
        for name, address in self.hosts.items():
            if host_pattern_problem(name) or name.startswith("*.") or not is_ip(address):
                raise ValueError(f"hosts: {name!r} = {address!r} must map a host name to an IP address "
                                 "(e.g. \"mirror.internal\" = \"10.0.0.5\")")
        if self.pypi_as_of:
            if self.mode != "allow":
                raise ValueError(f'pypi_as_of is for mode = "allow" (mode is "{self.mode}"): the egress proxy dates '
                                 'the index; set mode = "allow", or remove pypi_as_of')
            try:
                moment = datetime.fromisoformat(self.pypi_as_of)
            except ValueError:
                moment = None
            if moment is None or moment.tzinfo is None:
                raise ValueError(f"pypi_as_of: {self.pypi_as_of!r} must be an RFC 3339 time with its zone "
                                 '(e.g. "2026-04-23T00:00:00Z")')
        for prefix in self.pypi_indexes:
            if not prefix.startswith(("http://", "https://")) or not prefix.endswith("/"):
                raise ValueError(f"pypi_indexes: {prefix!r} must be a Simple API URL prefix ending in \"/\" "
                                 '(e.g. "https://pypi.org/simple/")')
        if self.ca_bundle and not self.ca_bundle.startswith("/"):
            raise ValueError(f"ca_bundle: {self.ca_bundle!r} must be an absolute path to a PEM file, the same on "
                             'every node (e.g. "/etc/ssl/certs/ca-certificates.crt")')
        check_at_least(self, 1, "cache_mb", fix="the cache is how N sandboxes fetch a file once")
        check_positive(self, "cache_ttl_s", "connect_timeout_s")
        check_range(self, 1, 65535, "sandbox_port", "door_port")
        if self.door_port == self.sandbox_port:
            raise ValueError(f"door_port {self.door_port} is sandbox_port's too: give the door another port "
                             "(e.g. 3129)")

    def allows(self, host: str) -> bool:
        """Whether the sandbox may reach `host` (lowercase, no port)."""
        return any(host_matches(host, pattern) for pattern in self.allow)

    def mirrored(self, url: str) -> str | None:
        """The URL fetched in place of `url` (the longest matching prefix's), or None when none maps it."""
        best = max((p for p in self.mirrors if url.startswith(p)), key=len, default=None)
        return None if best is None else self.mirrors[best] + url[len(best):]

    def terminates_tls(self, host: str, port: int, *, trusts_ca: bool = True) -> bool:
        """Whether a CONNECT to `host`:`port` is one the proxy answers itself, rather than a blind tunnel: an
        `https://` mirror key names that host and port, or a dated index does and the client `trusts_ca`."""
        return (host, port) in _origins(self.mirrors) or (trusts_ca and (host, port) in self.dated_hosts)

    @property
    def tls_hosts(self) -> frozenset[tuple[str, int]]:
        """(host, port) of every `https://` mirror key and dated `https://` index: those whose TLS the proxy
        may end (with its CA)."""
        return _origins(self.mirrors) | self.dated_hosts

    @property
    def dated_hosts(self) -> frozenset[tuple[str, int]]:
        """(host, port) of the `https://` indexes `pypi_as_of` dates (none without it)."""
        return _origins(self.pypi_indexes) if self.pypi_as_of else frozenset()

    def as_of(self, url: str) -> datetime | None:
        """The moment the Simple API page at `url` is served as of (None: as it is): `pypi_as_of` for a URL
        under `pypi_indexes`, past the index's root (its list of projects, which says no dates)."""
        if not self.pypi_as_of:
            return None
        if any(url.startswith(p) and url[len(p):].strip("/") for p in self.pypi_indexes):
            return datetime.fromisoformat(self.pypi_as_of)
        return None

    def pinned(self, host: str) -> str | None:
        """The address `hosts` pins `host` to, if any."""
        return self.hosts.get(host)


def _origins(prefixes) -> frozenset[tuple[str, int]]:
    """(host, port) of each `https://` URL prefix."""
    return frozenset(((urlsplit(p).hostname or "").lower(), urlsplit(p).port or 443)
                     for p in prefixes if p.startswith("https://"))
