"""Configuration of rollouts (a recipe's `[rollout]`: the agent's budgets and sampling, and how many sessions
run at once) and of the agent (`[agent]`: which harness drives a session, and how the built-in one acts)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

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
    # node, an OOM kill); the groups it held end masked (`node_lost` for a lost node), never run again. Past it
    # the run fails.
    actor_max_restarts: int = 3
    # After a group was lost with its actor, or while a tier of the run is requeued after a lost node: how long
    # the loop waits, before it sends new groups, for the rollout tier to be live again (the tier back on a new
    # node, its engines in the router, the new node prewarmed, every actor answering); past it the run fails.
    recovery_timeout_s: float = 900.0

    def __post_init__(self) -> None:
        check_at_least(self, 1, "max_turns", "max_new_tokens", "max_total_tokens", "num_session_actors",
                       "max_concurrent_sessions", "max_observation_chars")
        check_non_negative(self, "actor_max_restarts", "temperature")
        check_positive(self, "generate_timeout_s", "session_timeout_s", "actor_start_timeout_s",
                       "recovery_timeout_s")
        check_range(self, 0, 1, "top_p", low_open=True)
        if self.top_p < 1:
            raise ValueError(f"top_p {self.top_p:g} samples from a truncated distribution whose log-probabilities "
                             "neither the engine reports nor the trainer computes: set top_p = 1.0 (lower "
                             "temperature instead)")
        check_one_of(self, ("tool", "user", "ipython", "observation"), "observation_role")


# The harnesses rl360 ships; a user's own is "python:package.module:function" (docs/agents.md).
BUILTIN_HARNESSES = ("bash", "mini-swe-agent", "terminus-2")
# Harbor's installed agents rl360 has presets for: "installed:<name>" (rl360cli/agent/installed.py).
INSTALLED_AGENTS = ("claude-code", "codex", "mini-swe-agent", "terminus-cli")
TOOL_PARSER_NAMES = ("hermes", "qwen25")
REASONING_PARSER_NAMES = ("think", "qwen3", "deepseek-r1")


@dataclass(frozen=True, kw_only=True, slots=True)
class AgentConfig:
    """A recipe's `[agent]`: who drives a rollout session, and how the model's replies are read."""

    # "bash" (the built-in loop), "mini-swe-agent" (the PyPI package, unchanged), "terminus-2" (Harbor's own,
    # unchanged: the `harbor` package in its own Python 3.12 environment), or a user's own:
    # "python:package.module:function" (docs/agents.md has the contract); or an agent installed in the sandbox's
    # image and run inside it, as Harbor runs it: "installed:claude-code" (also codex, mini-swe-agent, terminus-cli).
    harness: str = "bash"
    # The built-in agent's first message, before the task's instruction ("": none).
    system_prompt: str = ""
    # How the built-in agent acts: "tool", a native call of its `bash` tool (the template renders the tool);
    # "fence", a ```bash (or ```sh) block in its reply. A fence in thinking, or of another language, is no action.
    action_format: Literal["tool", "fence"] = "fence"
    # A reply with no action ends a "fence" episode when it is one of these words (any other is a format error);
    # a "tool" reply with no call is the agent's final answer.
    done_words: tuple[str, ...] = ("done",)
    # How tool calls and thinking are read from the model's text (the session endpoint's parsers), per family;
    # "" reads no tool calls / no thinking.
    tool_parser: str = "hermes"
    reasoning_parser: str = ""
    # RL360's knobs: subtracted from the reward of an attempt that succeeded (reward > 0) with format errors;
    # the built-in agent ends after this many failed actions in a row (a reply with no action, a malformed or
    # unknown tool call), 0: never.
    format_penalty: float = 0.0
    max_tool_failures: int = 3
    # A harness that rewrote its history makes a new segment of its session: "segments" trains each segment
    # with the session's reward; "mask" masks the session (infra cause `tito_break`).
    on_tito_break: Literal["segments", "mask"] = "segments"
    # Seconds a harness may run for one step of a task (0: the task's agent budget); past it: `harness_timeout`.
    harness_timeout_s: float = 0.0
    # Scales every task's agent and verifier budgets (Harbor's `--timeout-multiplier`): tasks timed against a
    # fast API model given to a CPU engine, or to engines shared by many sessions, need more.
    timeout_multiplier: float = 1.0
    # The harness's own settings (`[agent.harness_config]`): mini-swe-agent's are merged over its package's
    # config file (e.g. `[agent.harness_config.model] action_regex = ...`); a user's harness reads them as
    # `session.config`.
    harness_config: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        kind, _, name = self.harness.partition(":")
        installed = kind == "installed" and name in INSTALLED_AGENTS
        if self.harness not in BUILTIN_HARNESSES and not _is_python_harness(self.harness) and not installed:
            raise ValueError(f"harness {self.harness!r} is unknown; use {' or '.join(BUILTIN_HARNESSES)}, "
                             f"\"installed:<name>\" ({', '.join(INSTALLED_AGENTS)}), or "
                             "\"python:package.module:function\" for your own (docs/agents.md)")
        check_one_of(self, ("tool", "fence"), "action_format")
        check_one_of(self, ("segments", "mask"), "on_tito_break")
        check_one_of(self, ("", *TOOL_PARSER_NAMES), "tool_parser")
        check_one_of(self, ("", *REASONING_PARSER_NAMES), "reasoning_parser")
        check_non_negative(self, "format_penalty", "max_tool_failures", "harness_timeout_s")
        check_positive(self, "timeout_multiplier")


def _is_python_harness(spec: str) -> bool:
    """`python:package.module:function`, each part a dotted Python name."""
    kind, _, rest = spec.partition(":")
    module, _, function = rest.rpartition(":")
    names = [*module.split("."), function]
    return kind == "python" and bool(module) and all(n.isidentifier() for n in names)
