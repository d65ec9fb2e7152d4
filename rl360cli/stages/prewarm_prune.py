"""`prewarm-images --prune`: the images rl360 prewarmed earlier that a node no longer needs, and their removal.

An image no longer in the image list, or a digest a moved tag left behind, is a `PruneItem`; one a running
container uses stays (`keep_reason`), and the old digest of a moved tag goes only once the node holds the
new one (`requires`). Until pruned, the unlisted images still take disk, which the pin map counts
(`kept_unlisted`).

Used by rl360cli/stages/prewarm_images.py. Test: tests/images/test_prewarm_docker.py (the dev Docker nodes).
"""

from __future__ import annotations

from dataclasses import dataclass

from rl360cli.images.config import ImageRef
from rl360cli.images.pinmap import PinMap
from rl360cli.nodes.base import NodeError
from rl360cli.stages.base import Context
from rl360cli.state.images import forget_images, repo_name
from rl360cli.state.queries import node_images
from rl360cli.state.schema import StateDoc


@dataclass(frozen=True, kw_only=True, slots=True)
class PruneItem:
    node: str
    reference: str
    # The repository (`registry/repo`) and the digest the reference stands for on that node.
    name: str
    digest: str
    why: str  # "no longer listed" | "superseded by sha256:..."
    keep_reason: str | None = None  # set when it must stay (a running container uses it)
    # Remove only if the node holds this digest by then (the new digest of a moved tag, pulled this run).
    requires: str | None = None


def kept_unlisted(nodes, doc: StateDoc, scans: dict, listed: set[str], prune: bool):
    """Disk taken on each node by images rl360 prewarmed earlier that are no longer listed (0 when pruning)."""
    usage: dict[str, int] = {}
    names: dict[str, list[str]] = {}
    for node in nodes:
        for ref, rec in node_images(doc, node.name).items():
            if ref in listed or prune:
                continue
            if node.name in scans and not any(i.has_digest(repo_name(ref), rec["digest"])
                                              for i in scans[node.name]):
                continue  # gone from the node already
            usage[node.name] = usage.get(node.name, 0) + int(rec.get("size") or 0)
            names.setdefault(node.name, []).append(ref.rsplit("/", 1)[-1])
    return usage, names


def prune_candidates(nodes: list[str], runtimes: dict, scans: dict, doc: StateDoc, refs: dict[str, ImageRef],
                      digests: dict[str, str], pins: PinMap) -> list[PruneItem]:

    listed = {str(r): name for name, r in refs.items()}
    items = []
    for node in nodes:
        if node not in scans:
            continue
        try:
            in_use = runtimes[node].running_image_ids()
        except NodeError as e:
            in_use, broken = set(), e.reason
        else:
            broken = None
        for ref, rec in node_images(doc, node).items():
            name = repo_name(ref)
            candidates = []
            new = digests.get(listed.get(ref, ""))
            if ref not in listed:
                candidates.append((ref, rec["digest"], "no longer listed", None))
            elif rec["digest"] != new and node in pins.placements[listed[ref]].nodes:
                # The tag moved: the old digest goes once this run has put the new one there.
                candidates.append((f"{name}@{rec['digest']}", rec["digest"], f"superseded by {new[:19]}", new))
            for old in rec.get("superseded") or []:
                if old != new:
                    candidates.append((f"{name}@{old}", old, f"superseded by {(new or rec['digest'])[:19]}", None))
            for reference, digest, why, requires in candidates:
                image = next((i for i in scans[node] if digest and f"{name}@{digest}" in i.digests), None)
                if image is None:
                    continue  # not on the node any more: nothing to remove
                keep = broken or (f"a running container uses it ({image.id[:19]})" if image.id in in_use else None)
                items.append(PruneItem(node=node, reference=reference, name=name, digest=digest, why=why,
                                       keep_reason=keep, requires=requires))
    return items


def prune_images(ctx: Context, items: list[PruneItem], runtimes: dict, *, stage: str) -> list[dict]:
    """Remove each item from its node unless it must stay; each outcome is an event of `stage` and, once
    removed, forgotten by the state."""
    out = []
    for item in items:
        outcome, reason = "removed", None
        if item.keep_reason:
            outcome, reason = "kept", item.keep_reason
        else:
            runtime = runtimes[item.node]
            try:
                images = runtime.images()
                image_ids = {i.id for i in images if i.has_digest(item.name, item.digest)}
                if item.requires and not any(i.has_digest(item.name, item.requires) for i in images):
                    outcome, reason = "kept", f"the new digest {item.requires[:19]} is not on the node"
                elif image_ids & runtime.running_image_ids():
                    outcome, reason = "kept", "a running container uses it"
                else:
                    runtime.remove(item.reference)
            except NodeError as e:
                outcome, reason = "kept", e.reason
        out.append({"node": item.node, "reference": item.reference, "digest": item.digest, "why": item.why,
                    "outcome": outcome, "reason": reason})
        ctx.event(stage, "prune", f"{item.node}/{item.reference}", outcome, why=item.why, reason=reason)
    removed = [p for p in out if p["outcome"] == "removed"]
    if removed:
        forget_images(ctx.state, [(p["node"], p["reference"], p["digest"]) for p in removed])
    return out
