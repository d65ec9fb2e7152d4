"""bench/bench_smollm2_agent.py's pure parts: the section it writes from metrics rows, and the full
fine-tuning variant of the recipe (LoRA's comparison). The run itself is the bench's, not a test's."""

from __future__ import annotations

import statistics
import tomllib

import pytest

from bench.bench_smollm2_agent import full_finetune_recipe, rise, section, seed_result, seeds_section
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


def seed_run(seed: int, rewards: list[float], *, before: dict[str, float], after: dict[str, float]) -> dict:
    """One seed's kept result: its step rows, and the held-out evaluations before step 0 and after the last."""
    evaluation = lambda step, tags: {"step": step, "eval/pass@1": statistics.mean(tags.values()),  # noqa: E731
                                     **{f"eval/pass@1/domain/{t}": v for t, v in tags.items()}}
    rows = [evaluation(-1, before)] + [step_row(i, r) for i, r in enumerate(rewards)]
    rows[-1] |= evaluation(len(rewards) - 1, after)
    return seed_result(seed, rows, wall_s=3000.0, returncode=0)


def test_the_seeds_section_gives_mean_and_range_and_judges_the_hint_command_goal():
    results = [seed_run(0, [0.2, 0.4], before={"hint-command": 0.0, "hint-call": 0.2},
                        after={"hint-command": 0.5, "hint-call": 0.8}),
               seed_run(1, [0.4, 0.6, 0.9], before={"hint-command": 0.1, "hint-call": 0.2},
                        after={"hint-command": 0.2, "hint-call": 0.9})]
    text = seeds_section(results, command="rl360 up")
    assert "| 0 | 2 | 50.0 | 0 |" in text and "| 0.000 -> 0.500 | 0.200 -> 0.800 |" in text
    assert "| 1 | 2 | 0.500 (0.400-0.600) |" in text and "| 2 | 1 | 0.900 |" in text
    # hint-command: +0.5 and +0.1, mean 0.3 >= 0.25; hint-call rose in both.
    assert "| hint-command | 0.050 (0.000-0.100) | 0.350 (0.200-0.500) | 0.300 (0.100-0.500) |" in text
    assert "Goal (issue 49" in text and ": met; hint-command rise 0.300, hint-call kept." in text
    # The second seed's hint-command falls 0.1 and its hint-call 0.8: mean rises 0.2 and -0.1, the goal not met.
    results[1] = seed_run(1, [0.4], before={"hint-command": 0.1, "hint-call": 0.9},
                          after={"hint-command": 0.0, "hint-call": 0.1})
    text = seeds_section(results, command="rl360 up")
    assert ": not met; hint-command rise 0.200, hint-call not kept." in text
