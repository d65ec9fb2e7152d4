"""The node image caches as the state file records them, and their transitions (`rl360 prewarm-images` writes them).

    nodes[name]["images"][ref] = {"digest": "sha256:...", "size": bytes, "pulled_at": iso, "seconds": float,
                                  "started_at": iso, "attempts": int, "image_id": "sha256:...",
                                  "source": "prewarm" | "found", "superseded": ["sha256:...", ...]}

`ref` is the fully qualified tag reference (`127.0.0.1:5000/rl360/python:3.11`);
`digest` is the manifest digest that tag points at on that node, so a consumer
can tell a warm node (same digest as the registry) from a stale one. `source` is
`prewarm` for pulls rl360 made and `found` for images the node already held
(then `seconds` is 0). `superseded` lists digests this ref held before on that
node and that are still on its disk (`--prune` removes them). The sandbox
admission controller reads these records to place sandboxes on warm nodes first
(rl360cli/sandbox/waves.py). A node that prewarm reaches before any provision
gets its record here, from what the profile says of it (`NodeFacts`).

Test: tests/images/test_prewarm_docker.py (through the stage).
"""

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from rl360cli.state.schema import NodeImage, NodeRecord, PrewarmRecord, StateDoc, now_iso
from rl360cli.state.store import StateFile


@dataclass(frozen=True, kw_only=True, slots=True)
class NodeFacts:
    """What the profile says of a node: its record is created from it if the state does not know the node."""

    name: str
    address: str
    tier: str
    cpus: float
    memory_mb: int
    docker_host: str
    disk_budget_gb: float | None


@dataclass(frozen=True, kw_only=True, slots=True)
class ImagePull:
    """One image rl360 pulled onto a node."""

    node: str
    ref: str
    digest: str
    size: int | None
    started_at: str
    pulled_at: str
    seconds: float
    attempts: int
    image_id: str | None


@dataclass(frozen=True, kw_only=True, slots=True)
class FoundImage:
    """A listed image a node already holds at the digest the list pins."""

    ref: str
    digest: str
    size: int
    image_id: str
    tagged_at: str | None  # when the node's tag was set, if known (only asked for refs not recorded yet)


@dataclass(frozen=True, kw_only=True, slots=True)
class NodeScan:
    """What a node's daemon holds now: every `repo@digest` of its images, and the listed images among them."""

    node: NodeFacts
    repo_digests: Collection[str]
    found: Sequence[FoundImage]


def repo_name(ref: str) -> str:
    """`registry/repo` of a qualified reference (`registry/repo:tag` or `registry/repo@sha256:...`)."""
    if "@" in ref:
        return ref.split("@", 1)[0]
    head, sep, tail = ref.rpartition(":")
    return head if sep and "/" not in tail else ref


# ----------------------------------------------------------------------------- transitions


def record_pulls(state: StateFile, nodes: Mapping[str, NodeFacts], pulls: Sequence[ImagePull]) -> None:
    """A wave's pulls: each node's cache holds the pulled digest for its ref (the one before is superseded)."""
    with state.update() as doc:
        for pull in pulls:
            images = _node_record(doc, nodes[pull.node])["images"]
            images[pull.ref] = {"digest": pull.digest, "size": pull.size, "pulled_at": pull.pulled_at,
                                "seconds": pull.seconds, "started_at": pull.started_at, "attempts": pull.attempts,
                                "image_id": pull.image_id, "source": "prewarm",
                                "superseded": _superseded(images.get(pull.ref), pull.digest)}


def record_scans(state: StateFile, scans: Sequence[NodeScan], unreachable: Mapping[NodeFacts, str]) -> None:
    """What each reachable node holds now: recorded images that vanished from its daemon are dropped (removed by
    hand, a purged node), listed images it holds are recorded as found; unreachable nodes get their reason."""
    with state.update() as doc:
        for scan in scans:
            recorded = _node_record(doc, scan.node)["images"]
            for ref in list(recorded):
                entry = recorded[ref]
                present = [d for d in [entry["digest"], *(entry.get("superseded") or [])]
                           if d and f"{repo_name(ref)}@{d}" in scan.repo_digests]
                if entry["digest"] not in present:
                    del recorded[ref]
                else:
                    entry["superseded"] = [d for d in present if d != entry["digest"]]
            for image in scan.found:
                _set_found(recorded, image)
        for node, reason in unreachable.items():
            _node_record(doc, node)["prewarm"] = {"status": "failed", "reason": reason, "at": now_iso()}


def forget_images(state: StateFile, removed: Sequence[tuple[str, str, str]]) -> None:
    """Images `--prune` removed, as (node, reference, digest): a recorded ref goes; a superseded digest is
    no longer listed under the ref that held it."""
    with state.update() as doc:
        for node, reference, digest in removed:
            images = (doc["nodes"].get(node) or {}).get("images", {})
            if reference in images:
                del images[reference]
                continue
            for entry in images.values():
                if digest in (entry.get("superseded") or []):
                    entry["superseded"].remove(digest)


def record_prewarm(state: StateFile, nodes: Sequence[NodeFacts], failed: Mapping[str, str],
                   summary: PrewarmRecord) -> None:
    """A prewarm ended: each node's outcome (`failed`: node -> why), and what it pinned where."""
    with state.update() as doc:
        for node in nodes:
            reason = failed.get(node.name)
            _node_record(doc, node)["prewarm"] = {"status": "failed" if reason else "ok", "reason": reason,
                                                  "at": now_iso()}
        doc["prewarm"] = summary


# ----------------------------------------------------------------------------- records


def _node_record(doc: StateDoc, node: NodeFacts) -> NodeRecord:
    """The node's record, created (with what the profile says) if missing."""
    rec = doc["nodes"].setdefault(node.name, {})
    rec.setdefault("address", node.address)
    rec.setdefault("tier", node.tier)
    rec.setdefault("cpus", node.cpus)
    rec.setdefault("memory_mb", node.memory_mb)
    rec["docker_host"] = node.docker_host
    rec["disk_budget_gb"] = node.disk_budget_gb
    rec.setdefault("images", {})
    return rec


def _set_found(images: dict[str, NodeImage], image: FoundImage) -> None:
    """Record an image the node already holds; an existing record with the same digest is kept as it is."""
    old = images.get(image.ref)
    if old and old["digest"] == image.digest:
        old["size"] = image.size
        return
    images[image.ref] = {"digest": image.digest, "size": image.size, "pulled_at": image.tagged_at or now_iso(),
                         "seconds": 0.0, "started_at": None, "attempts": 0, "image_id": image.image_id,
                         "source": "found", "superseded": _superseded(old, image.digest)}


def _superseded(old: NodeImage | None, digest: str) -> list[str]:
    if not old:
        return []
    out = [d for d in old.get("superseded") or [] if d != digest]
    if old["digest"] != digest and old["digest"] not in out:
        out.append(old["digest"])
    return out
