"""Resolve image references to manifest digests with the registry's HTTP API (Distribution v2).

`resolve(ref)` sends one HEAD to `/v2/<name>/manifests/<tag>` with the Accept
headers of every manifest kind Docker pulls (Docker v2 manifest and list, OCI
manifest and index) and reads `Docker-Content-Digest`: the digest `docker pull`
would record for that tag, so a node's RepoDigests can be compared with it.
`compressed_size(ref, digest)` reads the manifest by digest (immutable, so
asked once) and adds up its layer sizes, for disk planning before a pull.

Loopback and `insecure` registries are spoken to over plain HTTP, others over
HTTPS; proxies from the environment are ignored (registries here are local).

    client = RegistryClient("127.0.0.1:5000", insecure=True)
    resolved = client.resolve(ImageRef.parse("rl360/busybox:latest", default_registry="127.0.0.1:5000"))

Test: tests/images/test_registry.py (the real loopback registry of cluster/dev/docker-nodes.sh).
"""

from __future__ import annotations

import hashlib
import json
import socket
import urllib.error
import urllib.request
from dataclasses import dataclass

from rl360cli.errors import Rl360Error
from rl360cli.images.config import ImageRef

MANIFEST_TYPES = (
    "application/vnd.docker.distribution.manifest.v2+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.oci.image.index.v1+json",
)
INDEX_TYPES = (MANIFEST_TYPES[1], MANIFEST_TYPES[3])
ACCEPT = ", ".join(MANIFEST_TYPES)


class RegistryUnreachable(Rl360Error):
    """The registry did not answer at all (bad address, not running, timeout)."""


class ImageNotInRegistry(Rl360Error):
    """The registry answered, but has no manifest for that reference."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Resolved:
    ref: ImageRef
    digest: str
    media_type: str


class RegistryClient:
    """One registry host; reuses nothing between requests but the opener (requests are few)."""

    def __init__(self, address: str, *, insecure: bool = False, timeout_s: float = 5.0):
        self.address = address
        host = address.rsplit(":", 1)[0] if not address.startswith("[") else address
        plain = insecure or host in ("localhost", "::1") or host.startswith("127.")
        self.base = f"{'http' if plain else 'https'}://{address}"
        self.timeout_s = timeout_s
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        self._sizes: dict[str, int] = {}

    def resolve(self, ref: ImageRef) -> Resolved:
        """The digest the registry serves for `ref` now (HEAD; a GET only if the registry omits the header)."""
        url = f"{self.base}/v2/{ref.repository}/manifests/{ref.reference}"
        headers, _ = self._request("HEAD", url, ref)
        digest = headers.get("Docker-Content-Digest")
        media_type = (headers.get("Content-Type") or "").split(";")[0]
        if not digest:
            _, body = self._request("GET", url, ref)
            digest = "sha256:" + hashlib.sha256(body).hexdigest()
        if ref.digest and digest != ref.digest:
            raise ImageNotInRegistry(f"{ref}: the registry serves {digest} for this digest reference",
                                     "check the registry; it should never do that")
        return Resolved(ref=ref, digest=digest, media_type=media_type)

    def compressed_size(self, ref: ImageRef, digest: str, *, platform: tuple[str, str] = ("linux", "amd64")) -> int:
        """Bytes the pull of `digest` downloads (layers + config); for an index, the `platform` entry's."""
        if digest not in self._sizes:
            manifest = self._manifest(ref, digest)
            if manifest.get("mediaType") in INDEX_TYPES or "manifests" in manifest:
                entry = _platform_entry(manifest, platform, ref)
                manifest = self._manifest(ref, entry["digest"])
            parts = [manifest.get("config") or {}, *(manifest.get("layers") or [])]
            self._sizes[digest] = sum(int(p.get("size") or 0) for p in parts)
        return self._sizes[digest]

    def _manifest(self, ref: ImageRef, digest: str) -> dict:
        _, body = self._request("GET", f"{self.base}/v2/{ref.repository}/manifests/{digest}", ref)
        try:
            return json.loads(body)
        except json.JSONDecodeError:
            raise Rl360Error(f"{ref}: the registry's manifest {digest} is not JSON") from None

    def _request(self, method: str, url: str, ref: ImageRef) -> tuple[dict, bytes]:
        request = urllib.request.Request(url, method=method, headers={"Accept": ACCEPT})
        try:
            with self._opener.open(request, timeout=self.timeout_s) as reply:
                return dict(reply.headers), reply.read() if method != "HEAD" else b""
        except urllib.error.HTTPError as e:
            if e.code == 404:
                raise ImageNotInRegistry(f"{ref} is not in the registry {self.address} (manifest unknown)") from None
            if e.code == 401:
                raise Rl360Error(f"registry {self.address} asks for credentials for {ref}",
                                 "rl360 prewarms from registries that allow anonymous pulls; "
                                 "use a pull-through mirror without auth") from None
            raise RegistryUnreachable(f"registry {self.address} answered {e.code} {e.reason} for {ref}") from None
        except (urllib.error.URLError, ConnectionError, TimeoutError, socket.timeout, OSError) as e:
            reason = getattr(e, "reason", e)
            raise RegistryUnreachable(f"registry {self.address} does not answer ({reason})") from None


def _platform_entry(index: dict, platform: tuple[str, str], ref: ImageRef) -> dict:
    for entry in index.get("manifests") or []:
        p = entry.get("platform") or {}
        if (p.get("os"), p.get("architecture")) == platform:
            return entry
    raise ImageNotInRegistry(f"{ref} has no {platform[0]}/{platform[1]} image in its index",
                             "push an image for that platform")
