"""The trainers' learning-rate schedule (`TrainerConfig.lr_at`): a linear warm-up, then constant or
cosine; checked once at load time; what a real torch trainer's optimizer steps with."""

from __future__ import annotations

import math

import pytest
import torch

from rl360cli.config import load_recipe
from rl360cli.configload import ConfigError, parse_override
from rl360cli.rl.batch import build_batch
from rl360cli.rl.config import GRPOConfig
from rl360cli.trainer.config import TrainerConfig
from tests.conftest import REPO
from tests.rl.factories import make_trajectory

SMOKE = REPO / "recipes" / "local-smoke.toml"


def test_constant_without_warm_up_is_lr_at_every_step():
    config = TrainerConfig(lr=2e-3)
    assert [config.lr_at(step) for step in (0, 1, 50, 10_000)] == [2e-3] * 4


def test_the_warm_up_rises_linearly_and_reaches_lr_after_it():
    config = TrainerConfig(lr=1e-3, lr_warmup_steps=3)
    assert [config.lr_at(step) for step in range(5)] == pytest.approx([2.5e-4, 5e-4, 7.5e-4, 1e-3, 1e-3])


def test_cosine_falls_from_lr_to_its_lowest_at_the_decay_step_and_stays():
    config = TrainerConfig(lr=1e-3, lr_schedule="cosine", lr_warmup_steps=2, lr_decay_steps=12,
                            lr_min_ratio=0.1)
    after = [config.lr_at(step) for step in range(2, 20)]
    assert after[0] == pytest.approx(1e-3)
    assert all(a >= b for a, b in zip(after, after[1:]))
    assert config.lr_at(7) == pytest.approx((1e-3 + 1e-4) / 2)  # half way: cos(pi/2) = 0
    assert config.lr_at(12) == config.lr_at(19) == pytest.approx(1e-4)
    assert config.lr_at(4) == pytest.approx(1e-4 + 9e-4 * 0.5 * (1 + math.cos(math.pi * 0.2)))


@pytest.mark.parametrize(("settings", "message"), [
    (["trainer.lr_decay_steps=0"],
     "[trainer]: lr_schedule 'cosine' needs lr_decay_steps > lr_warmup_steps (4) (got 0)"),
    (["trainer.lr_warmup_steps=5", "trainer.lr_decay_steps=5"],
     "[trainer]: lr_schedule 'cosine' needs lr_decay_steps > lr_warmup_steps (5) (got 5)"),
    (["trainer.lr_min_ratio=1.5"], "[trainer]: lr_min_ratio must be in [0, 1] (got 1.5)"),
    (["trainer.lr_warmup_steps=-1"], "[trainer]: lr_warmup_steps must be >= 0 (got -1)"),
    (["trainer.lr_schedule=cosin"], "trainer.lr_schedule: 'cosin' is not allowed; did you mean 'cosine'?"),
])
def test_a_bad_schedule_is_one_line_at_load_time(settings, message):
    with pytest.raises(ConfigError) as e:
        load_recipe(SMOKE, overrides=[parse_override(text) for text in settings])
    assert str(e.value).endswith(message), str(e.value)


def test_the_torch_trainer_steps_with_the_schedules_rate(tmp_path):
    """A real TorchTrainer on a tiny Llama: each step's optimizer rate and its `lr` statistic are
    `lr_at(version)`, and a resumed trainer goes on where
    the schedule was (the version comes back with the checkpoint)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from rl360cli.trainer.torch_trainer import TorchTrainer

    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(vocab_size=50_000, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                 num_attention_heads=2, num_key_value_heads=2)).save_pretrained(tmp_path / "m")
    trajectories = [make_trajectory(group_id="g", sample_index=i, reward=float(i % 2), seed=i) for i in range(4)]
    batch, _ = build_batch(trajectories, **GRPOConfig().batch_kwargs())
    config = TrainerConfig(lr=1e-2, lr_schedule="cosine", lr_warmup_steps=2, lr_decay_steps=4, lr_min_ratio=0.1)
    trainer = TorchTrainer(tmp_path / "m", config, GRPOConfig())
    seen = []
    for _ in range(6):
        stats = trainer.train_step(batch)
        seen.append((stats["lr"], trainer.optimizer.param_groups[0]["lr"]))
    assert seen == [(config.lr_at(step),) * 2 for step in range(6)]
    trainer.save_checkpoint(tmp_path / "ckpt", {"next_step": 6})
    resumed = TorchTrainer(tmp_path / "m", config, GRPOConfig())
    resumed.load_checkpoint(tmp_path / "ckpt")
    assert resumed.train_step(batch)["lr"] == config.lr_at(6) == pytest.approx(1e-3)
