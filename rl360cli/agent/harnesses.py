"""`[agent] harness` to the harness a session runs: the built-in agent, mini-swe-agent, or a user's function.

    new_harness = harness_factory(recipe.agent, recipe.rollout, exec_timeout_s=30.0)
    harness = new_harness()          # one per session: the built-in agent keeps its conversation across steps

A user's harness is "python:package.module:function" (docs/agents.md): imported once, where the session
actors run; a name that does not import, or no such function, is one line naming the fix.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable

from rl360cli.agent import mini_swe_agent
from rl360cli.agent.builtin import BuiltinAgent
from rl360cli.agent.config import AgentConfig, RolloutConfig
from rl360cli.agent.harness import Harness
from rl360cli.errors import Rl360Error


def harness_factory(agent: AgentConfig, rollout: RolloutConfig, *, exec_timeout_s: float) -> Callable[[], Harness]:
    """What makes each session's harness (see the module docstring)."""
    if agent.harness == "bash":
        return lambda: BuiltinAgent(agent=agent, rollout=rollout, exec_timeout_s=exec_timeout_s)
    if agent.harness == "mini-swe-agent":
        run = functools.partial(mini_swe_agent.run, agent=agent, rollout=rollout, exec_timeout_s=exec_timeout_s)
        return lambda: run
    harness = python_harness(agent.harness)
    return lambda: harness


@functools.cache
def python_harness(spec: str) -> Harness:
    """The function "python:package.module:function" names."""
    module_name, _, function_name = spec.removeprefix("python:").rpartition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise Rl360Error(f"[agent] harness {spec!r}: module {module_name} does not import ({e})",
                         "install it where the session actors run (or put it on their PYTHONPATH), or fix the name") \
            from None
    harness = getattr(module, function_name, None)
    if not callable(harness):
        raise Rl360Error(f"[agent] harness {spec!r}: {module_name} has no function {function_name}",
                         "name a function that takes the session (docs/agents.md)")
    return harness
