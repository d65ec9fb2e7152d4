"""Base-image mirrors (rl360cli/images/mirrors.py): references as Docker reads them, rewritten through
the profile's `[registry] mirrors`, refused for hosts the profile does not name. On the dev Docker
nodes: tests/sandbox/test_docker_mirrors.py."""

from __future__ import annotations

import pytest

from rl360cli.configload import ConfigError, from_mapping
from rl360cli.images.config import RegistrySpec
from rl360cli.images.mirrors import MirrorRefused, host_of, rewrite_dockerfile, through_mirrors

HUB = RegistrySpec(address="127.0.0.1:5000", mirrors={"docker.io": "127.0.0.1:5000/hub"})


@pytest.mark.parametrize(("ref", "expected"), [
    ("python:3.12-slim", "127.0.0.1:5000/hub/library/python:3.12-slim"),
    ("ubuntu:24.04", "127.0.0.1:5000/hub/library/ubuntu:24.04"),
    ("busybox", "127.0.0.1:5000/hub/library/busybox:latest"),
    ("docker.io/library/python:3.11-slim", "127.0.0.1:5000/hub/library/python:3.11-slim"),
    ("index.docker.io/someone/tool:1", "127.0.0.1:5000/hub/someone/tool:1"),
    ("alpine@sha256:" + "a" * 64, "127.0.0.1:5000/hub/library/alpine@sha256:" + "a" * 64),
    # On the profile's registry, or already on a mirror: as written.
    ("127.0.0.1:5000/rl360/python:3.11", "127.0.0.1:5000/rl360/python:3.11"),
    ("127.0.0.1:5000/hub/library/busybox:latest", "127.0.0.1:5000/hub/library/busybox:latest"),
])
def test_references_go_through_the_mirror_as_docker_reads_them(ref, expected):
    assert through_mirrors(ref, HUB) == expected


def test_a_host_the_profile_does_not_name_is_refused_with_the_fix():
    with pytest.raises(MirrorRefused) as refused:
        through_mirrors("ghcr.io/org/image:1", HUB)
    assert "ghcr.io" in str(refused.value) and "add 'ghcr.io' to the profile's [registry] mirrors" in str(refused.value)
    assert host_of("ghcr.io/org/image:1") == "ghcr.io" and host_of("python:3") == "docker.io"


def test_without_mirrors_nothing_is_rewritten_or_refused():
    plain = RegistrySpec()
    assert through_mirrors("ghcr.io/org/image:1", plain) == "ghcr.io/org/image:1"
    assert rewrite_dockerfile("FROM python:3.12-slim\n", plain) == "FROM python:3.12-slim\n"


def test_a_dockerfile_gets_its_base_images_rewritten_and_keeps_its_stages():
    text = ("# syntax=docker/dockerfile:1\nFROM --platform=linux/amd64 python:3.12-slim AS build\nRUN pip wheel .\n"
            "FROM build AS test\nFROM scratch\nFROM ubuntu:24.04\r\nCOPY --from=build /w /w\n")
    assert rewrite_dockerfile(text, HUB) == (
        "# syntax=docker/dockerfile:1\nFROM --platform=linux/amd64 127.0.0.1:5000/hub/library/python:3.12-slim AS build\n"
        "RUN pip wheel .\nFROM build AS test\nFROM scratch\nFROM 127.0.0.1:5000/hub/library/ubuntu:24.04\r\n"
        "COPY --from=build /w /w\n")


def test_copy_from_an_image_goes_through_the_mirrors_and_from_a_stage_stays():
    both = RegistrySpec(address="127.0.0.1:5000", mirrors={"docker.io": "127.0.0.1:5000/hub",
                                                           "ghcr.io": "127.0.0.1:5000/ghcr"})
    text = ("FROM python:3.12-slim AS base\nCOPY --from=ghcr.io/astral-sh/uv:latest /uv /uvx /bin/\n"
            "FROM base\nCOPY --chown=1:1 --from=base /a /a\nCOPY --from=0 /b /b\nCOPY --from=busybox:1 /bin/sh /sh\n")
    assert rewrite_dockerfile(text, both) == (
        "FROM 127.0.0.1:5000/hub/library/python:3.12-slim AS base\n"
        "COPY --from=127.0.0.1:5000/ghcr/astral-sh/uv:latest /uv /uvx /bin/\n"
        "FROM base\nCOPY --chown=1:1 --from=base /a /a\nCOPY --from=0 /b /b\n"
        "COPY --from=127.0.0.1:5000/hub/library/busybox:1 /bin/sh /sh\n")
    # A host the profile does not mirror is refused, as in a FROM line.
    with pytest.raises(MirrorRefused, match="ghcr.io"):
        rewrite_dockerfile("FROM python:3.12-slim\nCOPY --from=ghcr.io/astral-sh/uv:latest /uv /bin/\n", HUB)


def test_a_base_image_from_a_build_argument_is_refused_with_mirrors_set():
    with pytest.raises(MirrorRefused, match="line 2: FROM \\$BASE"):
        rewrite_dockerfile("ARG BASE=python:3.12\nFROM $BASE\n", HUB)


@pytest.mark.parametrize(("mirrors", "problem"), [
    ({"Docker.IO!": "127.0.0.1:5000"}, "is not a registry host"),
    ({"docker.io": "http://127.0.0.1:5000"}, "is not host[:port][/path]"),
])
def test_a_malformed_mirror_is_a_one_line_config_error(mirrors, problem):
    with pytest.raises(ConfigError, match=problem.replace("[", "\\[").replace("]", "\\]")):
        from_mapping(RegistrySpec, {"mirrors": mirrors}, where="profile.toml", table="registry")
