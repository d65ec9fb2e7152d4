"""The image list (`images/images.toml`): which image, which tier's nodes need it, how it is pinned.

    [images.python]
    ref = "rl360/python:3.11"            # no registry host: the profile's [registry] address is used
    tiers = ["rollout"]
    expected_concurrency = 4             # or: pin = ["n1", "n2"], or: pin_count = 2

A reference without a registry host (`rl360/python:3.11`) is qualified with the
profile's registry, so one image list serves the dev cluster and a real one.
`ImageRef` parses references the way Docker does (the first path part is a
host when it holds a '.' or ':' or is `localhost`).

    images = load_images(Path("images/images.toml"))
    ref = ImageRef.parse("rl360/python:3.11", default_registry="127.0.0.1:5000")

Test: tests/images/test_images_config.py.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from rl360cli.backends.config import TIERS
from rl360cli.configload import NAME, NAME_RULE, ConfigError, check_at_least, check_positive, load_toml

_REPO = re.compile(r"^[a-z0-9]+(?:[._-]+[a-z0-9]+)*(?:/[a-z0-9]+(?:[._-]+[a-z0-9]+)*)*$")
_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
_HOST = re.compile(r"^[a-z0-9]([a-z0-9.-]*[a-z0-9])?(:\d{1,5})?$")
_MIRROR = re.compile(r"^[a-z0-9]([a-z0-9.-]*[a-z0-9])?(:\d{1,5})?(/[a-z0-9]+([._-][a-z0-9]+)*)*$")


@dataclass(frozen=True, kw_only=True, slots=True)
class RegistrySpec:
    """The registry the nodes pull from (a cluster profile's `[registry]`)."""

    address: str = "127.0.0.1:5000"
    # Image pulls in flight at once across all nodes, to stay within the registry's capacity.
    max_concurrent_pulls: int = 8
    insecure: bool = True
    # Registry host -> where the nodes get its images instead ("host[:port][/path]"), for pulls and for
    # tasks' FROM lines (rl360cli/images/mirrors.py). With any mirror set, a reference on a host named
    # neither here nor as `address` is refused before a daemon sees it.
    mirrors: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_at_least(self, 1, "max_concurrent_pulls")
        for host, target in self.mirrors.items():
            if not _HOST.match(host):
                raise ValueError(f"mirrors: {host!r} is not a registry host (e.g. docker.io, ghcr.io)")
            if not _MIRROR.match(target):
                raise ValueError(f"mirrors.{host}: {target!r} is not host[:port][/path] (e.g. 127.0.0.1:5000/hub)")


@dataclass(frozen=True, kw_only=True, slots=True)
class ImageRef:
    """A fully qualified image reference: registry host, repository, and a tag or a digest."""

    registry: str
    repository: str
    tag: str | None = None
    digest: str | None = None

    @classmethod
    def parse(cls, text: str, *, default_registry: str) -> ImageRef:
        """`rl360/python:3.11` -> registry `default_registry`; `host:5000/x/y@sha256:...` as written."""
        rest, digest = text, None
        if "@" in rest:
            rest, digest = rest.split("@", 1)
            if not _DIGEST.match(digest):
                raise ValueError(f"{text!r}: the digest must be sha256:<64 hex digits>")
        first, _, after = rest.partition("/")
        if after and ("." in first or ":" in first or first == "localhost"):
            registry, path = first, after
        else:
            registry, path = default_registry, rest
        tag = None
        last = path.rsplit("/", 1)[-1]
        if ":" in last:
            path, tag = path.rsplit(":", 1)
            if not _TAG.match(tag):
                raise ValueError(f"{text!r}: tag {tag!r} is not a valid Docker tag")
        if not _REPO.match(path):
            raise ValueError(f"{text!r}: repository {path!r} must be lowercase path parts (a-z, 0-9, . _ -)")
        if tag is None and digest is None:
            tag = "latest"
        return cls(registry=registry, repository=path, tag=tag, digest=digest)

    @property
    def name(self) -> str:
        """`registry/repository`: what Docker's RepoDigests entries start with."""
        return f"{self.registry}/{self.repository}"

    @property
    def reference(self) -> str:
        """The tag, else the digest: the `<reference>` of `/v2/<name>/manifests/<reference>`."""
        return self.tag or self.digest or "latest"

    def __str__(self) -> str:
        if self.tag:
            return f"{self.name}:{self.tag}"
        return f"{self.name}@{self.digest}"


@dataclass(frozen=True, kw_only=True, slots=True)
class ImageSpec:
    """One image of the list (its name is its table's key)."""

    # The reference; without a registry host it is qualified with the profile's [registry] address.
    ref: str
    # The tiers whose nodes need it.
    tiers: tuple[str, ...] = ("rollout",)
    # Exactly these nodes hold it warm ...
    pin: tuple[str, ...] = ()
    # ... or this many of the tiers' nodes ...
    pin_count: int | None = None
    # ... or as many nodes as it takes to run this many of its sandboxes at once (every node when none is set).
    expected_concurrency: int | None = None
    # What one sandbox of this image reserves, to count how many fit on a node.
    cpus: float = 1.0
    memory_mb: int = 1024
    # The image's size on a node's disk, when known; otherwise taken from a node that holds it, else
    # estimated from the registry's compressed layer sizes (see pinmap.EXPANSION).
    disk_mb: float | None = None
    # Where it is built (documentation; rl360 does not build images).
    dockerfile: str | None = None

    def __post_init__(self) -> None:
        unknown = [t for t in self.tiers if t not in TIERS]
        if not self.tiers or unknown:
            raise ValueError(f"tiers must name some of {', '.join(TIERS)} (got {list(self.tiers)})")
        set_ = [k for k in ("pin", "pin_count") if getattr(self, k)]
        if len(set_) > 1:
            raise ValueError("set pin or pin_count, not both")
        if len(set(self.pin)) != len(self.pin):
            raise ValueError(f"pin names a node twice (got {list(self.pin)})")
        check_at_least(self, 1, "pin_count", fix="remove it to use every node")
        check_at_least(self, 1, "expected_concurrency")
        check_positive(self, "cpus", "memory_mb")
        check_positive(self, "disk_mb", fix="remove it to measure it")
        ImageRef.parse(self.ref, default_registry="registry.invalid")  # raises ValueError on a bad ref


@dataclass(frozen=True, kw_only=True, slots=True)
class ImageList:
    images: dict[str, ImageSpec] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in self.images:
            if not NAME.match(name):
                raise ValueError(f"image name {name!r} must be {NAME_RULE}")


def load_images(path: Path | str) -> ImageList:
    """The image list at `path`; an empty list is an error (there is nothing to prewarm)."""
    path = Path(path)
    images = load_toml(ImageList, path)
    if not images.images:
        raise ConfigError(f"{path}: lists no images", "add an [images.NAME] table with at least `ref = ...`")
    return images
