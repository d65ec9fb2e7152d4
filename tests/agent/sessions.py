"""Sessions for tests: a session of the built-in agent as the session actors run it, for tests that bring
their own engine (a stand-in with `generate`, or an `EngineClient`), tokenizer and sandbox provider
(`builtin_session`); and any harness's session (`attempt`) on the session endpoint served over loopback
HTTP in front of the scripted stand-in engine of endpoint_standin.py (the `served` and `engine` fixtures;
a test module imports both names so pytest finds them), at an example task in a sandbox of the test's."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from rl360cli.agent.config import AgentConfig, RolloutConfig
from rl360cli.agent.endpoint import SessionEndpoint
from rl360cli.agent.harnesses import harness_factory
from rl360cli.agent.session import SessionSpec, run_session, session_options
from rl360cli.rl.trajectory import Trajectory
from rl360cli.sandbox.provider import SandboxProvider
from rl360cli.sandbox.task import Task
from rl360cli.sandbox.task_loader import load_task
from tests.agent.chat_fixtures import qwen_tokenizer
from tests.agent.endpoint_standin import ServedEndpoint
from tests.conftest import REPO

EXAMPLES = REPO / "recipes" / "tasks" / "examples"
ROLLOUT = RolloutConfig(max_turns=4, max_new_tokens=64, max_total_tokens=4096)
HELLO = "printf 'Hello, world!\\n' > hello.txt"


def call(command: str) -> str:
    """A Hermes tool call of the `bash` tool, as Qwen writes one."""
    return f'<tool_call>\n{json.dumps({"name": "bash", "arguments": {"command": command}})}\n</tool_call>'


@pytest.fixture(scope="module")
def served():
    """The session endpoint and a scripted engine behind it (Qwen2.5's chat template), for a module's tests."""
    served = ServedEndpoint(qwen_tokenizer("qwen2.5-instruct"))
    yield served
    served.close()


@pytest.fixture()
def engine(served):
    """The scripted engine, with nothing queued, asked or failing."""
    served.engine.script.clear()
    served.engine.requests.clear()
    served.engine.outputs.clear()
    served.engine.fail_with = None
    served.engine.delay_s = 0.0
    return served.engine


def attempt(served, harness, *, agent: AgentConfig = AgentConfig(), task: str = "hello-world",
            rollout: RolloutConfig = ROLLOUT, provider) -> list:
    """One session of `harness` at an example task, in the endpoint's event loop; its trajectories."""

    async def one():
        try:
            return await run_session(
                SessionSpec(task_id=task, group_id="g", sample_index=0, attempt_id=f"a{time.monotonic_ns()}"),
                load_task(EXAMPLES / task), endpoint=served.endpoint, harness=harness,
                options=session_options(agent, rollout, model="policy"), agent=agent, rollout=rollout,
                provider=provider, exec_timeout_s=30.0, labels={}, log=lambda line: None)
        finally:
            await provider.close()

    return served.call(one(), timeout_s=120)


def builtin(agent: AgentConfig, rollout: RolloutConfig = ROLLOUT):
    """The harness `agent` names (the built-in agent, mini-swe-agent, ...), made as a session actor makes it."""
    return harness_factory(agent, rollout, exec_timeout_s=30.0)()


async def builtin_session(spec: SessionSpec, task: Task, *, tokenizer: Any, client: Any, provider: SandboxProvider,
                          rollout: RolloutConfig, agent: AgentConfig = AgentConfig(), exec_timeout_s: float,
                          labels: dict[str, str] | None = None) -> list[Trajectory]:
    """The session's trajectories; its endpoint answers in process (the built-in agent needs no HTTP)."""
    endpoint = SessionEndpoint(tokenizer=tokenizer, client=client)
    return await run_session(spec, task, endpoint=endpoint,
                             harness=harness_factory(agent, rollout, exec_timeout_s=exec_timeout_s)(),
                             options=session_options(agent, rollout, model="policy"), agent=agent, rollout=rollout,
                             provider=provider, exec_timeout_s=exec_timeout_s, labels=labels or {})
