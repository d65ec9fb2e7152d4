"""bench/bench_smollm2_agent.py's pure parts: the section it writes from metrics rows, and the full
fine-tuning variant of the recipe (LoRA's comparison). The run itself is the bench's, not a test's."""

from __future__ import annotations

import tomllib

import pytest

from bench.bench_smollm2_agent import full_finetune_recipe, rise, section
from rl360cli.config import load_recipe
from rl360cli.configload import parse_override
from tests.conftest import REPO


def step_row(step: int, reward: float) -> dict:
    return {"step": step, "reward_mean": reward, "pass_rate": reward, "generation_s": 30.0, "train_s": 20.0,
            "weight_sync_s": 1.0, "step_s": 52.0, "tokens_per_s": 40.0, "trainer_peak_rss_mb": 4243.2,
            "weight_sync_bytes": 50.6 * 2**20}


def test_the_section_has_the_curve_the_rise_and_held_out_pass_at_1_by_tag():
    before = {"step": -1, "eval/pass@1": 0.05, "eval/s": 50.0, "eval/pass@1/domain/hint-call": 0.1,
              "eval/pass@1/domain/copy-file": 0.0}
    rows = [before] + [step_row(i, r) for i, r in enumerate([0.2, 0.3, 0.5, 0.6, 0.7])]
    rows[-1] |= {"eval/pass@1": 0.3, "eval/s": 40.0, "eval/pass@1/domain/hint-call": 0.5,
                 "eval/pass@1/domain/copy-file": 0.25}
    text = section(rows, command="rl360 up", wall_s=600.0, done=True, update="full fine-tuning step")
    assert "update (full fine-tuning step)" in text
    assert "| 4 | 0.700 | 0.700 | 0.300 | 30.0 | 20.0 | 1.0 | 1.0 | 52.0 | 40.0 | 4243 | 50.6 | 40.0 |" in text
    assert "| tag | before | after step 4 |" in text
    assert "| hint-call | 0.100 | 0.500 |" in text and "| copy-file | 0.000 | 0.250 |" in text
    assert rise([0.2, 0.3, 0.5, 0.6, 0.7]) == pytest.approx(0.6 - 0.25)
    assert "Goal met" in text


def test_the_full_fine_tuning_recipe_is_the_recipe_without_lora(tmp_path):
    path, sets = full_finetune_recipe(tmp_path)
    doc = tomllib.loads(path.read_text())
    assert "lora" not in doc["trainer"] and doc["trainer"]["lr"] == 2e-4  # the rate comes by --set
    assert "trainer.lr=1e-05" in sets
    # The relative paths still name the recipe's own tasks and manifest (recipes/ is where they live).
    overrides = dict(s.split("=", 1) for s in sets)
    for key in ("tasks.path", "tasks.manifest", "eval.path"):
        assert (tmp_path / overrides[key]).exists(), key
    profile = parse_override(f"run.profile={REPO / 'cluster' / 'local.toml'}")
    recipe = load_recipe(path, overrides=[*map(parse_override, sets), profile])
    assert recipe.trainer.lora is None and recipe.trainer.lr == 1e-5
