"""Digest resolution with HEAD against the real loopback registry (cluster/dev/docker-nodes.sh)."""

from __future__ import annotations

import socket

import pytest

from rl360cli.images.config import ImageRef
from rl360cli.images.registry import ImageNotInRegistry, RegistryClient, RegistryUnreachable
from tests.images.conftest import client_for

pytestmark = pytest.mark.docker


def test_head_resolves_the_digest_docker_push_reported(dev, images):
    pushed = images.push("alpha", size_kb=512)
    client = RegistryClient(dev["registry"], insecure=True)
    ref = ImageRef.parse(pushed["short_ref"], default_registry=dev["registry"])
    resolved = client.resolve(ref)
    assert resolved.digest == pushed["digest"]
    assert resolved.media_type == "application/vnd.docker.distribution.manifest.v2+json"
    # The compressed download is at least the random (incompressible) layer and no more than it on disk.
    size = client.compressed_size(ref, resolved.digest)
    assert 512 * 1024 <= size < 2 * 512 * 1024


def test_a_digest_reference_resolves_to_itself(dev):
    base = dev["images"]["busybox"]
    client = RegistryClient(dev["registry"], insecure=True)
    digest = client.resolve(ImageRef.parse(base, default_registry=dev["registry"])).digest
    by_digest = ImageRef.parse(f"{base.rsplit(':', 1)[0]}@{digest}", default_registry=dev["registry"])
    assert client.resolve(by_digest).digest == digest


def test_resolved_digest_is_what_a_node_records_after_pulling(dev):
    base = dev["images"]["busybox"]
    ref = ImageRef.parse(base, default_registry=dev["registry"])
    digest = RegistryClient(dev["registry"], insecure=True).resolve(ref).digest
    node = client_for(dev["nodes"][0]["docker_host"])
    try:
        image = node.images.pull(ref.name, tag=digest)
        assert f"{ref.name}@{digest}" in image.attrs["RepoDigests"]
    finally:
        node.close()


def test_unknown_image_and_silent_registry(dev):
    client = RegistryClient(dev["registry"], insecure=True)
    with pytest.raises(ImageNotInRegistry, match="not in the registry"):
        client.resolve(ImageRef.parse("rl360-test/absent/ghost:1", default_registry=dev["registry"]))
    with socket.socket() as s:  # a port nothing listens on: bind, never listen
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        silent = RegistryClient(f"127.0.0.1:{port}", insecure=True, timeout_s=2)
        with pytest.raises(RegistryUnreachable, match=f"registry 127.0.0.1:{port} does not answer"):
            silent.resolve(ImageRef.parse("x/y:1", default_registry=f"127.0.0.1:{port}"))
