"""`[trainer] precision`: the torch trainer under bf16 autocast, with float32 weights and AdamW state,
recomputes the engine's own logprobs within bf16's rounding, on the CPU (CPU autocast).

The engine (float32, in this process) samples 16 sequences of 48 tokens at temperature 1 from a tiny
random Llama whose logits are far from uniform (tests' `build_tiny_test_model`); the trainer recomputes
the logprobs of those same tokens. Measured here (2 cores, x86_64, torch 2.13): float32 agrees to
1.2e-5 at most; bf16 autocast differs by 0.043 on average and 0.34 at most per token (p99 0.24).
SmolLM2-135M-Instruct, a real model, measured the same way: 0.035 on average, 0.32 at most. That is
bf16's 8-bit mantissa through every layer, not a bug: the tolerance below is about twice the measured
figures (0.08 mean, 0.6 max), so that another CPU's bf16 kernels pass and a wrong path does not (an
unscaled or mis-shifted logprob is off by whole nats). The errors are not one-sided: in a GRPO step on
these samples the first pass's ratio exp(new - old) averages 0.9998, approx_kl 0.0019, and 0.8% of
the tokens fall outside PPO's clip (0.2).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rl360cli.config import load_recipe
from rl360cli.configload import ConfigError, parse_override
from rl360cli.outcome import Outcome
from rl360cli.rl.batch import build_batch
from rl360cli.rl.config import GRPOConfig
from rl360cli.rl.trajectory import Trajectory
from rl360cli.trainer.config import TrainerConfig
from tests.conftest import REPO

MEAN_TOLERANCE = 0.08
MAX_TOLERANCE = 0.6


@pytest.fixture(scope="module")
def sampled(tmp_path_factory):
    """(model folder, prompts, the engine's answers): the engine's own tokens and float32 logprobs."""
    from rl360cli.inference.engine import Engine
    from rl360cli.inference.protocol import parse_generate
    from rl360cli.inference.testing import build_tiny_test_model

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the engine's thread and this one on 2 cores
    model = build_tiny_test_model(tmp_path_factory.mktemp("precision") / "tiny")
    engine = Engine.load(model, max_batch_size=16, max_wait_ms=20)
    engine.start()
    try:
        prompts = [[5 + i, 6, 7 + i, 8][: 2 + i % 3] for i in range(16)]
        body = {"sampling_params": {"max_new_tokens": 48, "ignore_eos": True, "temperature": 1.0},
                "return_logprob": True}
        futures = [engine.submit(parse_generate({**body, "input_ids": p})[0][0]) for p in prompts]
        answers = [f.result(timeout=120) for f in futures]
    finally:
        engine.stop()
        torch.set_num_threads(threads)
    return model, prompts, answers


def _trainer(model, precision: str):
    from rl360cli.trainer.torch_trainer import TorchTrainer

    return TorchTrainer(model, TrainerConfig(precision=precision, lr=1e-4), GRPOConfig())


def _differences(trainer, prompts, answers) -> torch.Tensor:
    """|trainer's logprob - engine's| of every generated token."""
    out = []
    with torch.no_grad():
        for prompt, answer in zip(prompts, answers):
            ids = torch.tensor([prompt + answer["output_ids"]])
            mine = trainer.logprobs(ids, torch.ones_like(ids))[0, len(prompt) - 1:]
            engine = torch.tensor([entry[0] for entry in answer["meta_info"]["output_token_logprobs"]])
            out.append((mine.float() - engine).abs())
    return torch.cat(out)


def test_bf16_logprobs_agree_with_the_engines_float32_ones_within_bf16_rounding(sampled):
    model, prompts, answers = sampled
    exact = _differences(_trainer(model, "fp32"), prompts, answers)
    assert exact.max() < 1e-4
    bf16 = _differences(_trainer(model, "bf16"), prompts, answers)
    assert len(bf16) == 16 * 48
    assert bf16.mean() < MEAN_TOLERANCE and bf16.max() < MAX_TOLERANCE, (float(bf16.mean()), float(bf16.max()))
    assert bf16.mean() > 1e-3  # autocast did run: float32 would agree to 1e-5


def test_a_bf16_step_keeps_float32_weights_and_optimizer_state_and_sees_ratios_near_one(sampled):
    """A GRPO step on the engine's own samples (old logprobs = the engine's): the first pass's ratios
    are the bf16 agreement seen by the loss; the weights, gradients and AdamW moments stay float32."""
    model, prompts, answers = sampled
    trajectories = []
    for i, (prompt, answer) in enumerate(zip(prompts, answers)):
        output = answer["output_ids"]
        logprobs = [entry[0] for entry in answer["meta_info"]["output_token_logprobs"]]
        trajectories.append(Trajectory(
            task_id=f"t{i // 4}", group_id=f"g{i // 4}", sample_index=i % 4,
            token_ids=np.array(prompt + output, dtype=np.int32),
            loss_mask=np.array([0] * len(prompt) + [1] * len(output), dtype=np.uint8),
            logprobs=np.array([0.0] * len(prompt) + logprobs, dtype=np.float32), versions=(0,),
            num_prompt_tokens=len(prompt), reward=float(i % 2), outcome=Outcome.OK))
    batch, _ = build_batch(trajectories, **GRPOConfig().batch_kwargs())
    trainer = _trainer(model, "bf16")
    before = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    stats = trainer.train_step(batch)  # share_prompts: each group's prompt once, under autocast too
    assert all(np.isfinite(v) for v in stats.values()), stats
    assert abs(stats["ratio_mean"] - 1) < 0.05 and stats["approx_kl"] < 0.01, stats
    assert all(p.dtype == torch.float32 for p in trainer.model.parameters())
    moments = [s["exp_avg"] for s in trainer.optimizer.state.values()]
    assert moments and all(m.dtype == torch.float32 for m in moments)
    assert any(not torch.equal(before[name], p) for name, p in trainer.model.named_parameters())


def test_precision_is_checked_when_the_recipe_loads():
    smoke = REPO / "recipes" / "local-smoke.toml"
    assert load_recipe(smoke, overrides=[parse_override("trainer.precision=bf16")]).trainer.precision == "bf16"
    with pytest.raises(ConfigError) as e:
        load_recipe(smoke, overrides=[parse_override("trainer.precision=bf61")])
    assert "trainer.precision: 'bf61' is not allowed" in str(e.value)
    with pytest.raises(ValueError, match="the megatron trainer runs in float32"):
        TrainerConfig(kind="megatron", precision="bf16")
