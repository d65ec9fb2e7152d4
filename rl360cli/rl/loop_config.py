"""Configuration of rollouts (the agent loop) and of the overlapped training loop."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, kw_only=True, slots=True)
class RolloutConfig:
    max_turns: int = 4
    max_new_tokens: int = 64
    # The whole conversation (prompt, actions, observations) is cut off at this length.
    max_total_tokens: int = 2048
    # Observations longer than this are truncated before they are tokenized.
    max_observation_chars: int = 2000
    temperature: float = 1.0
    top_p: float = 1.0
    # The chat-template role of observations (command results), and extra template arguments
    # (e.g. Qwen3's `enable_thinking = false`).
    observation_role: str = "tool"
    chat_template_kwargs: dict[str, bool | int | str] = field(default_factory=dict)
    # Ray session actors on the rollout tier, and sessions in flight across all of them.
    num_session_actors: int = 2
    max_concurrent_sessions: int = 64

    def __post_init__(self) -> None:
        for name in ("max_turns", "max_new_tokens", "max_total_tokens", "num_session_actors",
                     "max_concurrent_sessions", "max_observation_chars"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1 (got {getattr(self, name)})")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (got {self.temperature})")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1] (got {self.top_p})")
        if self.observation_role not in ("tool", "user", "ipython", "observation"):
            raise ValueError(f"observation_role must be tool, user, ipython or observation (got {self.observation_role!r})")


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
