"""Hung rollouts end: a session whose sandbox command hangs is cut at `[rollout] session_timeout_s`
as a masked `session_timeout` infra failure, its sandbox stopped and nothing of it left running; a
generation request that never gets an answer ends at `[rollout] generate_timeout_s` as `engine_error`.

Real parts: the process sandbox provider (bubblewrap), Harbor task folders, the real `EngineClient`
over HTTP on 127.0.0.1 to a server that never answers. Stand-in: `ScriptedEngineStandIn`, for an
engine that always replies with one bash command.
"""

from __future__ import annotations

import asyncio
import math

import pytest
from aiohttp import web

from rl360cli.agent.config import RolloutConfig
from rl360cli.agent.session import SessionSpec, drain_cut_sessions
from rl360cli.inference.client import EngineClient, GenerateResult
from rl360cli.outcome import InfraCause, Outcome
from rl360cli.sandbox.task_loader import load_task
from tests.agent.sessions import builtin_session
from tests.agent.test_conversation import CHATML, byte_tokenizer
from tests.sandbox.conftest import bwrap, process_config, process_provider, sandbox_root  # noqa: F401 (fixtures)
from tests.sandbox.conftest import run, write_task

SPEC = SessionSpec(task_id="t", group_id="g", sample_index=0, attempt_id="deadline-0")
HANGING = "sleep 86399"  # a marker no other process on the machine runs


class ScriptedEngineStandIn:
    """Stands in for the engine behind the router: every request gets the same reply, one bash
    command, with made-up logprobs. No model, no HTTP, no sampling."""

    def __init__(self, tokenizer, reply: str):
        self.ids = tokenizer.encode(reply, add_special_tokens=False)
        self.reply = reply
        self.requests = []

    async def generate(self, input_ids, sampling_params=None, *, timeout_s=None, **_):
        self.requests.append(timeout_s)
        return GenerateResult(output_ids=list(self.ids), logprobs=[-0.5] * len(self.ids), finish_reason="stop",
                              weight_version=3, text=self.reply, prompt_tokens=len(input_ids))


def hanging_processes() -> list[int]:
    import os
    from pathlib import Path

    found = []
    for name in os.listdir("/proc"):
        try:
            if name.isdigit() and HANGING.encode() in Path(f"/proc/{name}/cmdline").read_bytes().replace(b"\0", b" "):
                found.append(int(name))
        except OSError:
            pass
    return found


@pytest.mark.timeout(120)  # without the deadline it would hang for a day
def test_a_hanging_command_is_cut_at_the_session_deadline(process_provider, tmp_path):
    # The command's own timeout and the agent's budget are far away: only the session deadline can end it.
    provider = process_provider(exec_timeout_s=3600)
    task = load_task(write_task(tmp_path, "t", toml="[agent]\ntimeout_sec = 3600\n"))
    tokenizer = byte_tokenizer(CHATML)
    engine = ScriptedEngineStandIn(tokenizer, f"```bash\n{HANGING}\n```")
    config = RolloutConfig(max_turns=3, max_new_tokens=64, session_timeout_s=3.0)

    async def go():
        [trajectory] = await builtin_session(SPEC, task, tokenizer=tokenizer, client=engine, provider=provider,
                                             rollout=config, exec_timeout_s=3600)
        hung_while_cut = hanging_processes()
        assert await drain_cut_sessions(timeout_s=60) == 0
        await provider.close()
        return trajectory, hung_while_cut

    trajectory, hung_while_cut = run(go())
    assert trajectory.outcome == Outcome.INFRA_FAILURE and trajectory.cause == InfraCause.SESSION_TIMEOUT
    assert trajectory.reward is None and not trajectory.is_valid  # masked: never a reward of 0
    assert "session_timeout_s" in trajectory.metadata["detail"]
    assert trajectory.versions == (3,) and int(trajectory.loss_mask.sum()) == len(engine.ids)  # the turn it made
    assert engine.requests == [config.generate_timeout_s]  # every request carries its deadline
    assert hung_while_cut  # the command was still hanging when the session was cut ...
    assert hanging_processes() == []  # ... and the cut attempt's sandbox stop ended it
    # (the process_provider fixture also checks that no sandbox folder or process is left)


@pytest.mark.timeout(120)
def test_a_generation_that_never_answers_ends_at_its_deadline_as_engine_error(process_provider, tmp_path):
    provider = process_provider()
    task = load_task(write_task(tmp_path, "t"))
    tokenizer = byte_tokenizer(CHATML)
    config = RolloutConfig(generate_timeout_s=1.0, session_timeout_s=600)

    async def never_answers(request: web.Request) -> web.Response:
        await asyncio.sleep(3600)
        raise AssertionError("unreachable")

    async def go():
        app = web.Application()
        app.router.add_post("/generate", never_answers)
        runner = web.AppRunner(app, shutdown_timeout=0.5)  # the handler never ends: do not wait for it
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        try:
            async with EngineClient(f"http://127.0.0.1:{port}") as client:
                [trajectory] = await builtin_session(SPEC, task, tokenizer=tokenizer, client=client,
                                                     provider=provider, rollout=config, exec_timeout_s=30)
                return trajectory
        finally:
            await provider.close()
            await runner.cleanup()

    trajectory = run(go())
    assert trajectory.outcome == Outcome.INFRA_FAILURE and trajectory.cause == InfraCause.ENGINE_ERROR
    assert "timed out after 1s" in trajectory.metadata["detail"]
    assert not trajectory.is_valid and math.isclose(float(trajectory.loss_mask.sum()), 0.0)


def test_the_deadlines_and_the_actor_restarts_are_validated():
    for name in ("generate_timeout_s", "session_timeout_s", "actor_start_timeout_s"):
        with pytest.raises(ValueError, match=f"{name} must be positive"):
            RolloutConfig(**{name: 0})
    with pytest.raises(ValueError, match="actor_max_restarts must be >= 0"):
        RolloutConfig(actor_max_restarts=-1)
    assert RolloutConfig(actor_max_restarts=0).actor_max_restarts == 0
