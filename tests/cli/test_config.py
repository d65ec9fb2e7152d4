"""Recipes and profiles: frozen dataclasses, validated at load time, errors that name file, key and fix."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from rl360cli.config import ClusterProfile, Recipe, load_profile, load_recipe
from rl360cli.configload import ConfigError

REPO = Path(__file__).resolve().parents[2]


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "x.toml"
    path.write_text(text)
    return path


def test_shipped_recipe_and_profile_load():
    recipe = load_recipe(REPO / "recipes/local-smoke.toml")
    profile = load_profile(REPO / "cluster/local.toml")
    assert isinstance(recipe, Recipe) and recipe.run.name == "local-smoke"
    assert isinstance(profile, ClusterProfile) and profile.backend == "local"
    with pytest.raises(dataclasses.FrozenInstanceError):
        recipe.run = None  # type: ignore[misc]


@pytest.mark.parametrize("path", sorted((REPO / "recipes").glob("*.toml")) + sorted((REPO / "cluster").glob("*.toml")),
                         ids=lambda p: p.name)
def test_every_shipped_toml_loads(path):
    loader = load_recipe if path.parent.name == "recipes" else load_profile
    loader(path)


def test_unknown_key_suggests_the_closest(tmp_path):
    path = write(tmp_path, '[run]\nname = "a"\n[tasks]\npath = "t"\n[trainer]\nlrr = 0.1\n')
    with pytest.raises(ConfigError) as e:
        load_recipe(path)
    assert str(e.value) == f"{path}: trainer.lrr: unknown key; did you mean 'lr'?"


def test_unknown_table_suggests_the_closest(tmp_path):
    path = write(tmp_path, '[run]\nname = "a"\n[tasks]\npath = "t"\n[grp]\n')
    with pytest.raises(ConfigError, match="did you mean 'grpo'"):
        load_recipe(path)


def test_wrong_type_names_key_and_expectation(tmp_path):
    path = write(tmp_path, '[run]\nname = "a"\n[tasks]\npath = "t"\n[loop]\nnum_steps = "ten"\n')
    with pytest.raises(ConfigError) as e:
        load_recipe(path)
    assert "loop.num_steps: expected an integer, got a string 'ten'" in str(e.value)


def test_bool_is_not_an_integer(tmp_path):
    path = write(tmp_path, '[run]\nname = "a"\n[tasks]\npath = "t"\n[loop]\nnum_steps = true\n')
    with pytest.raises(ConfigError, match="expected an integer"):
        load_recipe(path)


def test_literal_suggests_the_closest_value(tmp_path):
    path = write(tmp_path, '[run]\nname = "a"\n[tasks]\npath = "t"\n[sandbox]\nprovider = "dockr"\n')
    with pytest.raises(ConfigError, match="did you mean 'docker'"):
        load_recipe(path)


def test_validation_error_names_the_table(tmp_path):
    path = write(tmp_path, '[run]\nname = "a"\n[tasks]\npath = "t"\n[loop]\nnum_samples_per_task = 1\n')
    with pytest.raises(ConfigError) as e:
        load_recipe(path)
    assert str(e.value).startswith(f"{path}: [loop]: num_samples_per_task must be at least 2")


def test_missing_required_key(tmp_path):
    path = write(tmp_path, '[run]\nname = "a"\n')
    with pytest.raises(ConfigError, match=r"tasks: missing; add `tasks = \.\.\.`"):
        load_recipe(path)


def test_malformed_toml_names_the_line(tmp_path):
    path = write(tmp_path, '[run]\nname = "a\n')
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_recipe(path)


def test_profile_shares_must_fit_the_machine(tmp_path):
    path = write(tmp_path, 'name = "x"\n[tiers.service]\nshare = 0.6\n[tiers.training]\nshare = 0.6\n'
                           '[tiers.rollout]\nshare = 0.1\n')
    with pytest.raises(ConfigError, match="shares add up to 1.30"):
        load_profile(path)


def test_profile_needs_all_three_tiers(tmp_path):
    path = write(tmp_path, 'name = "x"\n[tiers.service]\n[tiers.training]\n')
    with pytest.raises(ConfigError, match="missing \\['rollout'\\]"):
        load_profile(path)


def test_tuples_and_nested_tables(tmp_path):
    path = write(tmp_path, 'name = "x"\n[tiers.service]\n[tiers.training]\n[tiers.rollout]\n'
                           '[[nodes]]\nname = "n1"\ndocker_host = "unix:///tmp/d.sock"\n'
                           '[[nodes]]\nname = "n2"\ndocker_host = "ssh://root@127.0.1.2:2222"\n')
    profile = load_profile(path)
    assert [n.name for n in profile.nodes] == ["n1", "n2"]
    assert profile.node("n2").docker_host.startswith("ssh://")
    with pytest.raises(ConfigError, match="use one of: n1, n2"):
        profile.node("n9")
