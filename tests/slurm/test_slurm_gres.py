"""GPU tasks' sandboxes on Slurm: a rollout tier that keeps GPUs for them asks for GRES (`--gres=gpu:N`, or
`gpu:TYPE:N` when the tier names its GPUs' type); a tier without stays `--gpus-per-node`. Checked on the
exact sbatch script submitit renders (no GPU, no Slurm needed)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from rl360cli.backends import slurm_script
from rl360cli.backends.config import TierSpec
from rl360cli.config import load_profile

REFERENCE = Path(__file__).resolve().parents[2] / "cluster" / "reference-33-nodes.toml"


def gpu_lines(profile, tier: str) -> list[str]:
    script = slurm_script.render_tier(profile, tier, Path("/shared/rl360/runs/cluster/slurm/%j"))
    return [line for line in script.splitlines() if "gres" in line or "gpus" in line]


def with_rollout(profile, **changes):
    tiers = dict(profile.tiers)
    tiers["rollout"] = dataclasses.replace(tiers["rollout"], **changes)
    return dataclasses.replace(profile, tiers=tiers)


def test_a_rollout_tier_with_sandbox_gpus_asks_for_gres_of_engines_and_sandboxes_together():
    profile = load_profile(REFERENCE)
    assert gpu_lines(profile, "rollout") == ["#SBATCH --gpus-per-node=8"]  # unchanged without sandbox GPUs
    typed = with_rollout(profile, gpus_per_node=6, sandbox_gpus_per_node=2, gpu_type="h100")
    assert gpu_lines(typed, "rollout") == ["#SBATCH --gres=gpu:h100:8"]
    untyped = with_rollout(profile, gpus_per_node=0, sandbox_gpus_per_node=4)
    assert gpu_lines(untyped, "rollout") == ["#SBATCH --gres=gpu:4"]
    assert gpu_lines(typed, "training") == ["#SBATCH --gpus-per-node=8"]


@pytest.mark.parametrize(("fields", "message"), [
    ({"sandbox_gpus_per_node": -1}, "sandbox_gpus_per_node must be >= 0"),
    ({"gpu_type": "h100:2"}, "gpu_type must be a GRES type name"),
])
def test_bad_gpu_fields_are_refused_with_the_fix(fields, message):
    with pytest.raises(ValueError, match=message):
        TierSpec(**fields)
