"""What every way of reaching a node's Docker daemon shares: `NodeRuntime`, `LocalImage`, `NodeError`.

Everything that goes wrong talking to a node is a `NodeError` carrying a
one-line reason, marked `transient` when a retry may help (connection
refused, a reset, a 5xx) and permanent otherwise (manifest unknown, bad
credentials). Standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from rl360cli.images.config import ImageRef

DEFAULT_TIMEOUT_S = 120.0


class NodeError(Exception):
    """Talking to a node's daemon failed; `reason` is one line, `transient` says whether to retry."""

    def __init__(self, reason: str, *, transient: bool = True):
        super().__init__(reason)
        self.reason = reason
        self.transient = transient


@dataclass(frozen=True, kw_only=True, slots=True)
class LocalImage:
    """One image in a node's cache."""

    id: str
    tags: tuple[str, ...]
    # `registry/repository@sha256:...`, one per repository it was pulled from or pushed to.
    digests: tuple[str, ...]
    size: int

    def has_digest(self, name: str, digest: str) -> bool:
        return f"{name}@{digest}" in self.digests


class NodeRuntime(Protocol):
    name: str
    address: str

    def images(self) -> list[LocalImage]:
        """Every image in the node's cache."""

    def pull(self, ref: ImageRef, digest: str) -> LocalImage:
        """Pull `ref.name@digest` (by digest, so a tag that moves meanwhile cannot change what lands)."""

    def tag(self, image_id: str, ref: ImageRef) -> None:
        """Point `ref`'s tag at `image_id` (sandboxes start images by tag)."""

    def last_tag_time(self, image_id: str) -> str | None:
        """When the image was last tagged or pulled on the node (ISO time), if the daemon says."""

    def running_image_ids(self) -> set[str]:
        """Image ids of the node's running containers (never pruned)."""

    def remove(self, reference: str) -> None:
        """Untag / remove one image reference; refuses (NodeError) when a container uses it."""

    def close(self) -> None: ...
