"""The RL core: trajectories, GRPO advantages and loss, filtering and infra-failure masking.

A pure library: the math and the data, no processes, no network, nothing of the orchestrator
(tests/test_architecture.py holds it to that). It uses the failure taxonomy of `rl360cli.outcome`.
Modules:
- `config`: `GRPOConfig`; no torch.
- `trajectory`, `compaction`: one task attempt, its serialisation and compaction (numpy, msgpack).
- `grpo`: `group_advantages`, `policy_loss`, `aggregate_loss`, `kl_penalty` (torch).
- `batch`, `train_batch`: `build_batch` -> (`TrainBatch`, `BatchReport`), micro-batches (torch).

Names are importable from here too; each is loaded on first use, so importing `rl360cli.rl.config`
(what the recipe loader does) does not import torch.
"""

import importlib

_EXPORTS = {
    "GRPOConfig": "config",
    "Trajectory": "trajectory",
    "CompactionReport": "compaction",
    "group_advantages": "grpo",
    "policy_loss": "grpo",
    "aggregate_loss": "grpo",
    "kl_penalty": "grpo",
    "LossStats": "grpo",
    "build_batch": "batch",
    "BatchReport": "batch",
    "TrainBatch": "train_batch",
    "MicroBatch": "train_batch",
    "MicroBatches": "train_batch",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
