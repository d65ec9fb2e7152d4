"""The trainer's log-probabilities are the engine's at the sampling temperature: rl360's engine samples local-smoke's
policy at temperature 0.7 and reports each drawn token's logprob (SGLang's convention: log_softmax(logits / T)),
and the torch trainer, told the recipe's temperature, recomputes the same numbers from the same weights. A recipe
with top_p < 1, whose truncated distribution neither side describes, is refused when it loads."""

from __future__ import annotations

import pytest
import torch

from rl360cli.agent.config import RolloutConfig
from rl360cli.inference.engine import Engine
from rl360cli.inference.protocol import parse_generate
from rl360cli.rl.config import GRPOConfig
from rl360cli.trainer.config import TrainerConfig
from rl360cli.trainer.torch_trainer import TorchTrainer
from tests.loop.conftest import LOCAL_SMOKE_V0

TEMPERATURE = 0.7


@pytest.fixture(scope="module")
def sampled():
    """Four prompts sampled at 0.7 by the engine: (prompt, output ids, reported logprobs) each."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    engine = Engine.load(LOCAL_SMOKE_V0, max_batch_size=8, max_wait_ms=20)
    engine.start()
    try:
        prompts = [[5, 6, 7], [9, 10, 11, 12], [20] * 12, [30, 31]]
        futures = [engine.submit(parse_generate({"input_ids": p, "return_logprob": True, "sampling_params": {
            "temperature": TEMPERATURE, "max_new_tokens": 16, "ignore_eos": True, "sampling_seed": i}})[0][0])
            for i, p in enumerate(prompts)]
        answers = [f.result(timeout=60) for f in futures]
    finally:
        engine.stop()
        torch.set_num_threads(threads)
    return [(p, a["output_ids"], [e[0] for e in a["meta_info"]["output_token_logprobs"]])
            for p, a in zip(prompts, answers)]


def trainer_logprobs(temperature: float, prompt: list[int], output: list[int]) -> torch.Tensor:
    trainer = TorchTrainer(LOCAL_SMOKE_V0, TrainerConfig(), GRPOConfig(), temperature=temperature)
    ids = torch.tensor([prompt + output])
    with torch.no_grad():
        return trainer.logprobs(ids, torch.ones_like(ids))[0, len(prompt) - 1:]


def test_the_trainer_recomputes_the_engines_logprobs_at_temperature_0_7(sampled):
    for prompt, output, reported in sampled:
        mine = trainer_logprobs(TEMPERATURE, prompt, output)
        assert torch.allclose(mine, torch.tensor(reported), atol=1e-4, rtol=0), (mine, reported)
    # At temperature 1 they differ: the trainer would train against another behaviour policy.
    prompt, output, reported = sampled[0]
    assert (trainer_logprobs(1.0, prompt, output) - torch.tensor(reported)).abs().max() > 1e-2


def test_a_recipe_with_top_p_below_1_is_refused():
    with pytest.raises(ValueError, match="top_p 0.9 samples from a truncated distribution .* set top_p = 1.0"):
        RolloutConfig(top_p=0.9)
