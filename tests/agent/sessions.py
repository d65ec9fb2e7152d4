"""A session of the built-in agent as the session actors run it, for tests that bring their own engine
(a stand-in with `generate`, or an `EngineClient`), tokenizer and sandbox provider."""

from __future__ import annotations

from typing import Any

from rl360cli.agent.config import AgentConfig, RolloutConfig
from rl360cli.agent.endpoint import SessionEndpoint
from rl360cli.agent.harnesses import harness_factory
from rl360cli.agent.session import SessionSpec, run_session, session_options
from rl360cli.rl.trajectory import Trajectory
from rl360cli.sandbox.provider import SandboxProvider
from rl360cli.sandbox.task import Task


async def builtin_session(spec: SessionSpec, task: Task, *, tokenizer: Any, client: Any, provider: SandboxProvider,
                          rollout: RolloutConfig, agent: AgentConfig = AgentConfig(), exec_timeout_s: float,
                          labels: dict[str, str] | None = None) -> list[Trajectory]:
    """The session's trajectories; its endpoint answers in process (the built-in agent needs no HTTP)."""
    endpoint = SessionEndpoint(tokenizer=tokenizer, client=client)
    return await run_session(spec, task, endpoint=endpoint,
                             harness=harness_factory(agent, rollout, exec_timeout_s=exec_timeout_s)(),
                             options=session_options(agent, rollout, model="policy"), agent=agent, rollout=rollout,
                             provider=provider, exec_timeout_s=exec_timeout_s, labels=labels or {})
