"""Configuration of the overlapped training loop (a recipe's `[loop]`): steps, groups per step, overlap."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True, slots=True)
class LoopConfig:
    num_steps: int = 20
    # Groups (tasks) per training batch, and samples per group.
    num_tasks_per_step: int = 32
    num_samples_per_task: int = 8
    # Generation for step k+1 runs while step k trains (samples more than `grpo.max_staleness`
    # policy versions behind are dropped). `overlap = false` runs the same loop synchronously.
    overlap: bool = True
    # Dynamic filtering: keep sampling until the batch holds `num_tasks_per_step` groups with
    # reward variance, at most this many generation rounds per step.
    max_generation_rounds: int = 3

    def __post_init__(self) -> None:
        for name in ("num_steps", "num_tasks_per_step", "max_generation_rounds"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1 (got {getattr(self, name)})")
        if self.num_samples_per_task < 2:
            raise ValueError(f"num_samples_per_task must be at least 2 for GRPO (got {self.num_samples_per_task})")
