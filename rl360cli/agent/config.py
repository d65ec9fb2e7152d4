"""Configuration of rollouts (a recipe's `[rollout]`): the agent's budgets and sampling, and how many
sessions run at once."""

from __future__ import annotations

from dataclasses import dataclass, field

from rl360cli.configload import check_at_least, check_non_negative, check_one_of, check_positive, check_range


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
        check_at_least(self, 1, "max_turns", "max_new_tokens", "max_total_tokens", "num_session_actors",
                       "max_concurrent_sessions", "max_observation_chars")
        check_non_negative(self, "actor_max_restarts", "temperature")
        check_positive(self, "generate_timeout_s", "session_timeout_s", "actor_start_timeout_s")
        check_range(self, 0, 1, "top_p", low_open=True)
        check_one_of(self, ("tool", "user", "ipython", "observation"), "observation_role")
