"""Small end-to-end runs of the real loop: local engines behind the real sglang-router, Ray session
actors, process sandboxes, the torch trainer and the gloo weight broadcast, all on this machine."""

from __future__ import annotations

import json
import random
import socket
import textwrap
from pathlib import Path

import pytest

from rl360cli.backends import procinfo
from rl360cli.config import load_recipe
from tests.conftest import REPO

TASKS = REPO / "recipes" / "tasks" / "arith-32"
# The seed of recipes/local-smoke.toml's policy v0 ([model] warmup_seed): tests that warm up as it does,
# with this as their run seed, share its cached policy v0.
LOCAL_SMOKE_SEED = load_recipe(REPO / "recipes" / "local-smoke.toml").policy_seed


def free_port_block(count: int) -> int:
    """A base port with `count` free ports after it (loopback), below the kernel's ephemeral range
    (32768-60999), where outgoing connections take their ports, and from a random start, so that two
    test runs at once rarely probe the same block."""
    start = random.randrange(10000, 30000)
    for base in [*range(start, 32768 - count, 97), *range(10000, start, 97)]:
        try:
            for port in range(base, base + count):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
    raise RuntimeError("no free port block on 127.0.0.1")


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
