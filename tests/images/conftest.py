"""Fixtures for the image tests: the dev Docker nodes plus a spare node, unique test images, test profiles.

The dev nodes (n1..n3 of `cluster/dev/docker-nodes.sh up`) are shared with every other test, so these
tests never stop them and never remove the base images: each test pushes its own small images with
unique names (`rl360-test/<uuid>/...`) to the loopback registry, and the node-down test stops only a
spare node `n9` that this fixture starts with `docker-nodes.sh start-node n9` (and stops at the end).
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import tarfile
import uuid
from pathlib import Path

import pytest

from tests.conftest import DEV_ROOT, REPO, need

SPARE = "n9"
SCRIPT = REPO / "cluster" / "dev" / "docker-nodes.sh"


def dev_script(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    proc = subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise AssertionError(f"docker-nodes.sh {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}")
    return proc


def spare_socket() -> str:
    return f"unix://{DEV_ROOT}/docker/{SPARE}/docker.sock"


def spare_running() -> bool:
    import docker

    try:
        client = docker.DockerClient(base_url=spare_socket(), version="auto", timeout=5)
    except Exception:  # noqa: BLE001 - any failure means not up
        return False
    client.close()
    return True


@pytest.fixture(scope="session")
def spare_node(docker_nodes) -> dict:
    """A fourth dockerd, `n9`, only these tests use (so stopping it disturbs no one)."""
    started = False
    if not spare_running():
        dev_script("start-node", SPARE)
        started = True
    yield {"name": SPARE, "docker_host": spare_socket()}
    if started:
        dev_script("stop-node", SPARE)


@pytest.fixture
def spare_up(spare_node) -> dict:
    """The spare node, restarted if an earlier test (or someone's `up`) left it down."""
    if not spare_running():
        dev_script("start-node", SPARE)
    return spare_node


@pytest.fixture(scope="session")
def dev(docker_nodes) -> dict:
    """nodes.json of the dev Docker nodes, checked to have at least 3 running daemons."""
    import docker

    alive = []
    for node in docker_nodes["nodes"]:
        try:
            docker.DockerClient(base_url=node["docker_host"], version="auto", timeout=5).close()
            alive.append(node)
        except Exception:  # noqa: BLE001
            pass
    need(len(alive) >= 3, f"only {len(alive)} dev Docker node(s) answer: run `bash cluster/dev/docker-nodes.sh up`")
    return {**docker_nodes, "nodes": alive}


def client_for(docker_host: str):
    import docker

    return docker.DockerClient(base_url=docker_host, version="auto", timeout=60)


class ImageFactory:
    """Builds small unique images on the spare node, pushes them, and drops them from its cache."""

    def __init__(self, registry: str, builder_host: str):
        self.registry = registry
        self.builder_host = builder_host
        self.run = uuid.uuid4().hex[:10]
        self.pushed: list[tuple[str, str]] = []

    def push(self, name: str, *, tag: str = "v1", size_kb: int = 256, runnable: bool = False,
             base: str | None = None) -> dict:
        """Push `rl360-test/<run>/<name>:<tag>` with a random layer; returns {ref, short_ref, digest}."""
        repo = f"{self.registry}/rl360-test/{self.run}/{name}"
        ref = f"{repo}:{tag}"
        base = base or (f"{self.registry}/rl360/busybox:latest" if runnable else "scratch")
        dockerfile = f"FROM {base}\nCOPY blob /blob-{uuid.uuid4().hex[:8]}\nLABEL rl360.test={uuid.uuid4().hex}\n"
        context = io.BytesIO()
        with tarfile.open(fileobj=context, mode="w") as tar:
            for fname, data in (("Dockerfile", dockerfile.encode()), ("blob", os.urandom(size_kb * 1024))):
                info = tarfile.TarInfo(fname)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        context.seek(0)
        client = client_for(self.builder_host)
        try:
            client.images.build(fileobj=context, custom_context=True, tag=ref, rm=True, network_mode="none",
                                pull=False)
            digest = None
            for line in client.api.push(repo, tag=tag, stream=True, decode=True):
                if line.get("error"):
                    raise AssertionError(f"push {ref}: {line['error']}")
                digest = (line.get("aux") or {}).get("Digest") or digest
            assert digest, f"push {ref} reported no digest"
            client.images.remove(ref, force=True)
        finally:
            client.close()
        self.pushed.append((repo, digest))
        return {"ref": ref, "short_ref": f"rl360-test/{self.run}/{name}:{tag}", "digest": digest, "repo": repo}

    def cleanup(self, hosts: list[str]) -> None:
        """Remove this run's images from the given nodes (the registry keeps its blobs; they are small)."""
        prefix = f"{self.registry}/rl360-test/{self.run}/"
        for host in hosts:
            try:
                client = client_for(host)
            except Exception:  # noqa: BLE001 - a node that is down has nothing to clean
                continue
            try:
                for image in client.api.images():
                    names = (image.get("RepoTags") or []) + (image.get("RepoDigests") or [])
                    if any(n.startswith(prefix) for n in names):
                        for c in client.api.containers(all=True, filters={"ancestor": image["Id"]}):
                            client.api.remove_container(c["Id"], force=True)
                        try:
                            client.api.remove_image(image["Id"], force=True)
                        except Exception:  # noqa: BLE001
                            pass
            finally:
                client.close()


@pytest.fixture
def images(dev, spare_up):
    factory = ImageFactory(dev["registry"], spare_up["docker_host"])
    yield factory
    factory.cleanup([n["docker_host"] for n in dev["nodes"]] + [spare_up["docker_host"]])


def write_profile(path: Path, nodes: list[dict], *, registry: str = "127.0.0.1:5000", max_pulls: int = 2,
                  disk_budget_gb: float = 2.0, images: str = "images/images.toml", cpus: float = 2.0,
                  memory_mb: int = 4096) -> Path:
    """A cluster profile listing `nodes` ({name, docker_host[, key_path, known_hosts]})."""
    lines = [f'name = "{path.stem}"', 'backend = "local"', f'images = "{images}"',
             "[tiers.service]", "share = 0.2", "[tiers.training]", "share = 0.4", "[tiers.rollout]", "share = 0.4",
             "[registry]", f'address = "{registry}"', f"max_concurrent_pulls = {max_pulls}", "insecure = true"]
    for n in nodes:
        lines += ["[[nodes]]", f'name = "{n["name"]}"', 'tier = "rollout"', f'docker_host = "{n["docker_host"]}"',
                  f"cpus = {cpus}", f"memory_mb = {memory_mb}", f"disk_budget_gb = {disk_budget_gb}"]
        for key in ("key_path", "known_hosts"):
            if n.get(key):
                lines.append(f'{key} = "{n[key]}"')
    path.write_text("\n".join(lines) + "\n")
    return path


def write_images(path: Path, entries: dict[str, dict]) -> Path:
    """An image list: {name: {ref, ...}}."""
    lines = []
    for name, fields in entries.items():
        lines.append(f"[images.{name}]")
        for key, value in fields.items():
            lines.append(f"{key} = {json.dumps(value)}")
    path.write_text("\n".join(lines) + "\n")
    return path


def node_digests(docker_host: str) -> dict[str, str]:
    """repo@digest entries of a node's cache -> image id."""
    client = client_for(docker_host)
    try:
        return {d: img["Id"] for img in client.api.images() for d in (img.get("RepoDigests") or [])}
    finally:
        client.close()


def max_overlap(intervals: list[tuple[str, str]]) -> int:
    """The most intervals (ISO start, ISO end) open at one instant; an end at t closes before a start at t."""
    from datetime import datetime

    points = []
    for start, end in intervals:
        points.append((datetime.fromisoformat(start), 1))
        points.append((datetime.fromisoformat(end), -1))
    points.sort(key=lambda p: (p[0], p[1]))
    open_, most = 0, 0
    for _, step in points:
        open_ += step
        most = max(most, open_)
    return most
