"""The node image caches as the state file records them, and their updates.

    nodes[name]["images"][ref] = {"digest": "sha256:...", "size": bytes, "pulled_at": iso, "seconds": float,
                                  "started_at": iso, "attempts": int, "image_id": "sha256:...",
                                  "source": "prewarm" | "found", "superseded": ["sha256:...", ...]}

(`NodeImage` in rl360cli/state.py; `state.node_images(doc, node)` reads a node's cache.)

`ref` is the fully qualified tag reference (`127.0.0.1:5000/rl360/python:3.11`);
`digest` is the manifest digest that tag points at on that node, so a
consumer can tell a warm node (same digest as the registry) from a stale one.
`source` is `prewarm` for pulls rl360 made and `found` for images the node
already held (then `seconds` is 0). `superseded` lists digests this ref held
before on that node and that are still on its disk (`--prune` removes them).
The sandbox admission controller reads these records to place sandboxes on
warm nodes first (rl360cli/sandbox/waves.py).

Test: tests/images/test_prewarm_docker.py (through the stage).
"""

from __future__ import annotations

from urllib.parse import urlparse

from rl360cli.nodes.config import NodeSpec
from rl360cli.state import NodeImage, NodeRecord, StateDoc, now_iso


def node_record(doc: StateDoc, node: NodeSpec) -> NodeRecord:
    """The node's record in the state document, created (with what the profile says) if missing."""
    rec = doc["nodes"].setdefault(node.name, {})
    rec.setdefault("address", node_address(node))
    rec.setdefault("tier", node.tier)
    rec.setdefault("cpus", node.cpus)
    rec.setdefault("memory_mb", node.memory_mb)
    rec["docker_host"] = node.docker_host
    rec["disk_budget_gb"] = node.disk_budget_gb
    rec.setdefault("images", {})
    return rec


def node_address(node: NodeSpec) -> str:
    if node.docker_host.startswith("unix://"):
        return "127.0.0.1"
    return urlparse(node.docker_host).hostname or node.docker_host


def repo_name(ref: str) -> str:
    """`registry/repo` of a qualified reference (`registry/repo:tag` or `registry/repo@sha256:...`)."""
    if "@" in ref:
        return ref.split("@", 1)[0]
    head, sep, tail = ref.rpartition(":")
    return head if sep and "/" not in tail else ref


def set_pulled(rec: NodeRecord, ref: str, *, digest: str, size: int | None, started_at: str, pulled_at: str,
               seconds: float, attempts: int, image_id: str | None) -> None:
    images = rec.setdefault("images", {})
    superseded = _superseded(images.get(ref), digest)
    images[ref] = {"digest": digest, "size": size, "pulled_at": pulled_at, "seconds": seconds,
                   "started_at": started_at, "attempts": attempts, "image_id": image_id, "source": "prewarm",
                   "superseded": superseded}


def set_found(rec: NodeRecord, ref: str, *, digest: str, size: int, image_id: str,
              tagged_at: str | None) -> None:
    """Record an image the node already holds; an existing record with the same digest is kept as it is."""
    images = rec.setdefault("images", {})
    old = images.get(ref)
    if old and old["digest"] == digest:
        old["size"] = size
        return
    images[ref] = {"digest": digest, "size": size, "pulled_at": tagged_at or now_iso(), "seconds": 0.0,
                   "started_at": None, "attempts": 0, "image_id": image_id, "source": "found",
                   "superseded": _superseded(old, digest)}


def _superseded(old: NodeImage | None, digest: str) -> list[str]:
    if not old:
        return []
    out = [d for d in old.get("superseded") or [] if d != digest]
    if old["digest"] != digest and old["digest"] not in out:
        out.append(old["digest"])
    return out


def expected_digests(doc: StateDoc) -> dict[str, str]:
    """`{ref: digest}` the last prewarm resolved (for the admission controller's `image_digests`): a node whose
    record for `ref` holds another digest is stale, not warm."""
    prewarm = doc.get("prewarm")
    return {entry["ref"]: entry["digest"] for entry in prewarm["images"].values()} if prewarm else {}
