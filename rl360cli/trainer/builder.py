"""The trainer a recipe's `[trainer] kind` names, built from the prepared policy folder.

    trainer = build_trainer(run_policy_dir(run_dir), recipe.trainer, recipe.grpo, seed=recipe.run.seed,
                            temperature=recipe.rollout.temperature)

The megatron trainer (megatron-core, loaded only when asked for) must be built on every rank of its
torchrun world; the torch trainer is one process; the simulated one (a stand-in for scale runs)
loads no model at all.
"""

from __future__ import annotations

from pathlib import Path

from rl360cli.rl.config import GRPOConfig
from rl360cli.trainer.config import TrainerConfig
from rl360cli.trainer.protocol import Trainer


def build_trainer(model_dir: Path, config: TrainerConfig, grpo: GRPOConfig, *, seed: int,
                  temperature: float = 1.0) -> Trainer:
    """`temperature`: the rollouts' sampling temperature, at which the trainer computes the policy's
    log-probabilities (the engines report theirs so)."""
    if config.kind == "simulated":
        from rl360cli.trainer.simulated import SimulatedTrainer

        return SimulatedTrainer(config.simulated)
    if config.kind == "megatron":
        from rl360cli.trainer.megatron_trainer import MegatronTrainer, default_device

        return MegatronTrainer(model_dir, config, grpo, seed=seed, device=default_device(), temperature=temperature)
    from rl360cli.trainer.torch_trainer import TorchTrainer

    return TorchTrainer(model_dir, config, grpo, seed=seed, temperature=temperature)
