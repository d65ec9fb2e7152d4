"""The image list and image references: parsing, qualification with the profile's registry, validation."""

from __future__ import annotations

from pathlib import Path

import pytest

from rl360cli.configload import ConfigError
from rl360cli.images.config import ImageRef, ImageSpec, load_images
from tests.conftest import REPO

DIGEST = "sha256:" + "ab" * 32


@pytest.mark.parametrize("text, registry, repository, tag, digest", [
    ("rl360/python:3.11", "127.0.0.1:5000", "rl360/python", "3.11", None),
    ("busybox", "127.0.0.1:5000", "busybox", "latest", None),
    ("registry.example.org/team/img:v2", "registry.example.org", "team/img", "v2", None),
    ("localhost/img", "localhost", "img", "latest", None),
    ("10.0.0.5:5000/a/b/c:x_1", "10.0.0.5:5000", "a/b/c", "x_1", None),
    (f"h.io/img@{DIGEST}", "h.io", "img", None, DIGEST),
    (f"h.io/img:v1@{DIGEST}", "h.io", "img", "v1", DIGEST),
])
def test_reference_parsing(text, registry, repository, tag, digest):
    ref = ImageRef.parse(text, default_registry="127.0.0.1:5000")
    assert (ref.registry, ref.repository, ref.tag, ref.digest) == (registry, repository, tag, digest)
    assert ref.name == f"{registry}/{repository}"


def test_reference_string_round_trips():
    ref = ImageRef.parse("rl360/python:3.11", default_registry="127.0.0.1:5000")
    assert str(ref) == "127.0.0.1:5000/rl360/python:3.11"
    assert ImageRef.parse(str(ref), default_registry="other:1") == ref
    pinned = ImageRef.parse(f"h.io/img@{DIGEST}", default_registry="x")
    assert str(pinned) == f"h.io/img@{DIGEST}" and pinned.reference == DIGEST


@pytest.mark.parametrize("bad, why", [
    ("Upper/Case:1", "lowercase"),
    ("img:bad tag", "not a valid Docker tag"),
    ("img@sha256:short", "64 hex"),
])
def test_bad_references(bad, why):
    with pytest.raises(ValueError, match=why):
        ImageRef.parse(bad, default_registry="r:1")


@pytest.mark.parametrize("fields, why", [
    ({"pin": ("n1",), "pin_count": 2}, "not both"),
    ({"pin_count": 0}, "pin_count must be at least 1"),
    ({"tiers": ("gpu",)}, "tiers must name"),
    ({"expected_concurrency": 0}, "expected_concurrency must be at least 1"),
    ({"pin": ("n1", "n1")}, "twice"),
    ({"cpus": 0.0}, "positive"),
    ({"ref": "Bad Ref"}, "lowercase"),
])
def test_image_spec_validation(fields, why):
    with pytest.raises(ValueError, match=why):
        ImageSpec(**{"ref": "rl360/x:1", **fields})


def test_the_repository_image_list_loads():
    images = load_images(REPO / "images" / "images.toml")
    assert {"busybox", "python"} <= set(images.images)
    for spec in images.images.values():
        assert spec.dockerfile and (REPO / spec.dockerfile).exists()


def test_unknown_key_suggests_the_close_one(tmp_path: Path):
    path = tmp_path / "images.toml"
    path.write_text('[images.py]\nref = "rl360/python:3.11"\npin_cont = 2\n')
    with pytest.raises(ConfigError, match=r"images\.py\.pin_cont: unknown key; did you mean 'pin_count'"):
        load_images(path)


def test_empty_list_and_missing_file(tmp_path: Path):
    (tmp_path / "empty.toml").write_text("")
    with pytest.raises(ConfigError, match="lists no images"):
        load_images(tmp_path / "empty.toml")
    with pytest.raises(ConfigError, match="no such file"):
        load_images(tmp_path / "nope.toml")
