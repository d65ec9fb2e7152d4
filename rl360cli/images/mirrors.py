"""Base-image mirrors: image references rewritten through the profile's `[registry] mirrors` before a
daemon sees them, as Docker's own `registry-mirrors` does for pulls, and for builds too.

    [registry]
    address = "127.0.0.1:5000"
    mirrors = { "docker.io" = "127.0.0.1:5000" }

A reference is read as Docker reads it: `python:3.12-slim` is `docker.io/library/python:3.12-slim`,
`ghcr.io/x/y:1` is on `ghcr.io`. Through a mirror `docker.io -> 127.0.0.1:5000/hub` it becomes
`127.0.0.1:5000/hub/library/python:3.12-slim` (the repository path is kept, as a pull-through mirror
keeps it). With mirrors set, nothing leaves for a host the profile does not name: a reference on the
profile's registry or a mirror passes as written, one on a mirrored host is rewritten, and any other
is refused (`MirrorRefused`) before the daemon could try to reach it. Without mirrors, references
pass unchanged (the daemon's own configuration decides).

A task's Dockerfile gets the same rewrite of its `FROM` lines (`rewrite_dockerfile`): build stages
named by an earlier `FROM ... AS name` and `scratch` stay as they are, and a `FROM` that takes its
image from a build argument (`FROM $BASE`) is refused with mirrors set, since the daemon would
resolve it unseen.

Test: tests/images/test_mirrors.py.
"""

from __future__ import annotations

import re

from rl360cli.errors import Rl360Error
from rl360cli.images.config import ImageRef, RegistrySpec

DOCKER_HUB = "docker.io"
_HUB_ALIASES = {"docker.io", "index.docker.io", "registry-1.docker.io"}
_FROM = re.compile(r"^(\s*FROM\s+)((?:--\S+\s+)*)(\S+)(.*)$", re.IGNORECASE)
# `COPY --from=<image>`: an image the classic builder pulls as it pulls a FROM's.
_COPY_FROM = re.compile(r"^(\s*COPY\s+(?:--\S+\s+)*?--from=)(\S+)(.*)$", re.IGNORECASE)
_STAGE = re.compile(r"\bAS\s+(\S+)", re.IGNORECASE)


class MirrorRefused(Rl360Error):
    """A reference on a host the profile names neither as its registry nor as a mirrored one."""


def host_of(ref: str) -> str:
    """The registry host a reference is pulled from, as Docker reads it (`python:3` -> docker.io)."""
    return _canonical(ImageRef.parse(ref, default_registry=DOCKER_HUB).registry)


def through_mirrors(ref: str, registry: RegistrySpec) -> str:
    """`ref` as the nodes must pull it; refused (MirrorRefused) when it would leave for an unnamed host."""
    if not registry.mirrors:
        return ref
    parsed = ImageRef.parse(ref, default_registry=DOCKER_HUB)
    host = _canonical(parsed.registry)
    if host == _canonical(registry.address) or any(host == _canonical(m.split("/")[0])
                                                   for m in registry.mirrors.values()):
        return ref
    mirror = registry.mirrors.get(host) or (registry.mirrors.get(DOCKER_HUB) if host in _HUB_ALIASES else None)
    if mirror is None:
        named = ", ".join(sorted({registry.address, *registry.mirrors}))
        raise MirrorRefused(f"image {ref} is on {host}, which the profile names neither as its registry nor "
                            f"as a mirrored host ({named})",
                            f"add {host!r} to the profile's [registry] mirrors, or push the image to "
                            f"{registry.address}")
    repository = parsed.repository
    if host == DOCKER_HUB and "/" not in repository:
        repository = f"library/{repository}"  # Docker Hub's official images
    suffix = f"@{parsed.digest}" if parsed.digest else f":{parsed.tag}"
    return f"{mirror.rstrip('/')}/{repository}{suffix}"


def rewrite_dockerfile(text: str, registry: RegistrySpec) -> str:
    """The Dockerfile with every base image's `FROM` (and `COPY --from=<image>`) through the mirrors (unchanged without mirrors)."""
    if not registry.mirrors:
        return text
    stages: set[str] = set()
    count = 0  # the stages so far (COPY --from=0 names the first)
    lines = []
    for number, line in enumerate(text.splitlines(keepends=True), start=1):
        match = _FROM.match(line.rstrip("\r\n"))
        if match:
            head, flags, image, tail = match.groups()
            if "$" in image:
                raise MirrorRefused(f"Dockerfile line {number}: FROM {image} takes its image from a build "
                                    "argument, which rl360 cannot send through the profile's mirrors",
                                    "write the base image's reference in the FROM line")
            if image.lower() != "scratch" and image.lower() not in stages:
                image = through_mirrors(image, registry)
            stage = _STAGE.search(tail)
            if stage:
                stages.add(stage.group(1).lower())
            line = f"{head}{flags}{image}{tail}" + line[len(line.rstrip("\r\n")):]
            count += 1
        copy = _COPY_FROM.match(line.rstrip("\r\n"))
        if copy:
            head, image, tail = copy.groups()
            if "$" in image:
                raise MirrorRefused(f"Dockerfile line {number}: COPY --from={image} takes its image from a build "
                                    "argument, which rl360 cannot send through the profile's mirrors",
                                    "write the image's reference in the COPY line")
            if image.lower() not in stages and not (image.isdigit() and int(image) < count):
                line = f"{head}{through_mirrors(image, registry)}{tail}" + line[len(line.rstrip("\r\n")):]
        lines.append(line)
    return "".join(lines)


def _canonical(host: str) -> str:
    host = host.lower()
    return DOCKER_HUB if host in _HUB_ALIASES else host
