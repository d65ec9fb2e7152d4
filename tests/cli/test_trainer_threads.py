"""How many math threads the trainer gets on one machine: its tier's share, or every core when the loop
is synchronous (generation waits while it updates)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rl360cli.config import load_profile, load_recipe
from rl360cli.configload import parse_override
from rl360cli.stages import provision
from rl360cli.stages.base import Context
from rl360cli.stages.train import thread_env, trainer_spec
from rl360cli.state.store import StateFile

REPO = Path(__file__).resolve().parents[2]
SMOKE = REPO / "recipes" / "local-smoke.toml"


@pytest.fixture
def ctx(state_path: Path) -> Context:
    ctx = Context(state=StateFile(state_path), profile=load_profile(REPO / "cluster/local.toml"),
                  profile_path=REPO / "cluster/local.toml", recipe_path=SMOKE, run_id="r1")
    provision.apply(ctx)
    return ctx


def tier_cpus(ctx: Context) -> dict[str, float]:
    return {name: tier["resources"]["cpus"] for name, tier in ctx.state.read()["tiers"].items()}


@pytest.mark.parametrize("overlap", [False, True])
def test_a_synchronous_trainer_takes_every_core_an_overlapped_one_its_share(ctx, overlap):
    ctx.recipe = load_recipe(SMOKE, overrides=[parse_override(f"loop.overlap={str(overlap).lower()}")])
    cpus = tier_cpus(ctx)
    alone = int(sum(cpus.values()) + 1e-6)  # the tiers split this machine's CPUs
    share = max(1, int(cpus["training"]))
    threads = trainer_spec(ctx).env["OMP_NUM_THREADS"]
    assert threads == str(share if overlap else alone)
    assert trainer_spec(ctx).env["MKL_NUM_THREADS"] == threads


def test_only_tiers_on_the_same_nodes_lend_their_cores(ctx):
    with ctx.state.update() as doc:
        doc["tiers"]["rollout"]["nodes"] = ["elsewhere"]
        doc["tiers"]["service"]["nodes"] = ["elsewhere"]
        doc["tiers"]["training"]["resources"]["cpus"] = 3.0
    assert thread_env(ctx, "training", alone=True)["OMP_NUM_THREADS"] == "3"
    assert thread_env(ctx, "training", alone=True, sharing=2)["OMP_NUM_THREADS"] == "1"
