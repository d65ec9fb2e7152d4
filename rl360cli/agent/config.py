"""Configuration of rollouts (a recipe's `[rollout]`): the agent's budgets and sampling, and how many
sessions run at once."""

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
    # Deadlines. One generation request (the engine, or the router before it, may hang); and the
    # whole session, sandbox start to stop: a step never waits on one session longer than this.
    # A cut session is an infra failure (`session_timeout`), masked and counted, never a reward.
    # Keep it above the task's agent and verifier budgets (Harbor's defaults: 600 s each).
    generate_timeout_s: float = 600.0
    session_timeout_s: float = 1800.0
    # How long the session actors may take to start (Ray places them on the rollout tier's nodes and
    # each loads its tokenizer and tasks): a tier whose Ray worker never joined fails the run here.
    actor_start_timeout_s: float = 300.0
    # How many times Ray starts a session actor again after its process or node died (a lost rollout
    # node, an OOM kill), each time running the groups it held again; past it the run fails.
    actor_max_restarts: int = 3

    def __post_init__(self) -> None:
        for name in ("max_turns", "max_new_tokens", "max_total_tokens", "num_session_actors",
                     "max_concurrent_sessions", "max_observation_chars"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1 (got {getattr(self, name)})")
        if self.actor_max_restarts < 0:
            raise ValueError(f"actor_max_restarts must be >= 0 (got {self.actor_max_restarts})")
        for name in ("generate_timeout_s", "session_timeout_s", "actor_start_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be a positive number of seconds (got {getattr(self, name)})")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (got {self.temperature})")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1] (got {self.top_p})")
        if self.observation_role not in ("tool", "user", "ipython", "observation"):
            raise ValueError(f"observation_role must be tool, user, ipython or observation (got {self.observation_role!r})")
