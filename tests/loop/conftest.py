"""Small end-to-end runs of the real loop: local engines behind the real sglang-router, Ray session
actors, process sandboxes, the torch trainer and the gloo weight broadcast, all on this machine."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from rl360cli import procinfo
from rl360cli.ports import free_port_block
from tests.conftest import REPO

TASKS = REPO / "recipes" / "tasks" / "arith-32"
# recipes/local-smoke.toml's policy v0, committed with the recipe: it earns rewards on the 32 tasks.
LOCAL_SMOKE_V0 = REPO / "recipes" / "models" / "local-smoke-v0"


def write_run_files(folder: Path, *, recipe_body: str, name: str = "e2e", seed: int = 0) -> Path:
    """A profile on free ports and a recipe that uses it; returns the recipe's path."""
    base = free_port_block(20)
    (folder / "profile.toml").write_text(textwrap.dedent(f"""
        name = "test"
        backend = "local"
        base_port = {base}
        sync_port = {base + 15}
        [tiers.service]
        share = 0.2
        [tiers.training]
        share = 0.4
        [tiers.rollout]
        share = 0.4
    """))
    recipe = folder / "recipe.toml"
    recipe.write_text(textwrap.dedent(f"""
        [run]
        name = "{name}"
        seed = {seed}
        profile = "profile.toml"
        [tasks]
        path = "{TASKS}"
        [metrics]
        wandb = false
    """) + textwrap.dedent(recipe_body))
    return recipe


def metrics_of(state_path: Path) -> list[dict]:
    doc = json.loads(state_path.read_text())
    run = doc["runs"][doc["current_run"]]
    return [json.loads(line) for line in Path(run["metrics_path"]).read_text().splitlines()]


@pytest.fixture
def run_folder(tmp_path: Path) -> Path:
    return tmp_path


def assert_nothing_left(state_path) -> None:
    """No component of the state still runs: what `down` stopped is gone, and what `up` started after it
    (the early stop) `up` stopped itself."""
    for cid, rec in json.loads(state_path.read_text())["components"].items():
        assert rec["status"] in ("stopped", "exited", "failed"), (cid, rec["status"])
        assert not procinfo.is_alive(rec["pid"], rec.get("pid_start")), cid
