"""The stage as `rl360 up` / `rl360 plan` use it: when it applies, and the plan it shows."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from rl360cli.config import load_profile, load_recipe
from rl360cli.stages import prewarm_images
from rl360cli.stages.lifecycle import UP_STAGES
from rl360cli.stages.base import Context
from rl360cli.state.store import StateFile
from tests.conftest import REPO
from tests.images.conftest import write_images, write_profile


def _context(tmp_path: Path, profile_path: Path, provider: str) -> Context:
    recipe = load_recipe(REPO / "recipes" / "local-smoke.toml")
    recipe = dataclasses.replace(recipe, sandbox=dataclasses.replace(recipe.sandbox, provider=provider))
    return Context(state=StateFile(tmp_path / "rl360" / "state.json"), profile=load_profile(profile_path),
                   profile_path=profile_path, recipe=recipe)


def test_it_runs_between_provision_and_serve():
    names = [stage.NAME for stage in UP_STAGES]
    assert "prewarm-images" in names
    assert names.index("prewarm-images") == names.index("provision") + 1


def test_applies_only_to_docker_sandboxes_on_a_profile_with_nodes(tmp_path):
    docker_profile = REPO / "cluster" / "dev-docker.toml"
    assert prewarm_images.applies(_context(tmp_path, docker_profile, "docker"))
    assert not prewarm_images.applies(_context(tmp_path, docker_profile, "process"))
    assert not prewarm_images.applies(_context(tmp_path, REPO / "cluster" / "local.toml", "docker"))


@pytest.mark.docker
def test_plan_shows_the_pin_map_and_the_waves_and_starts_nothing(dev, images, tmp_path):
    alpha = images.push("alpha")
    image_list = write_images(tmp_path / "images.toml", {"alpha": {"ref": alpha["short_ref"]}})
    profile_path = write_profile(tmp_path / "three.toml", dev["nodes"][:3], images=str(image_list))
    ctx = _context(tmp_path, profile_path, "docker")
    actions = prewarm_images.plan(ctx)
    verbs = [(a.verb, a.subject) for a in actions]
    assert verbs == [("pin", "alpha"), ("pull", "wave 1"), ("pull", "wave 2")]
    assert actions[0].detail.startswith(f"{alpha['ref']}@{alpha['digest'][:19]}")
    assert actions[1].detail == "n1/alpha, n2/alpha" and actions[2].detail == "n3/alpha"
    assert not ctx.state.path.parent.exists()  # neither the state nor the events log
