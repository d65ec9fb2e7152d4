"""One rollout session: a multi-turn agent attempt at a Harbor task, turned into a Trajectory.

The instruction goes through the model's chat template; then, turn by turn,
the engine generates (token in, token out: its ids and logprobs are kept),
the reply's bash block runs in the sandbox, and the observation is tokenized
once and appended — until the agent submits or a turn or token budget runs
out. The verifier then scores the sandbox. A multi-step task is one
trajectory: the first step's instruction opens it, and each later step's
instruction is a new user turn after the previous step was verified (each
step has `[rollout] max_turns` turns and its own agent budget; the token
budget is the trajectory's); its reward is the task's, by Harbor's rule. An engine that fails the request
ends the attempt as an `engine_error` infrastructure failure: masked, never a
wrong answer.

Deadlines: each generation request has `[rollout] generate_timeout_s` (past it, an `engine_error`),
each command the sandbox's exec timeout, the agent and the verifier the task's budgets, and the
whole session `[rollout] session_timeout_s`: past that the session is cut wherever it hangs (a
sandbox start, an upload, a daemon that stopped answering) and ends as a `session_timeout` infra
failure. The cut attempt stops its sandbox in the background, so the step waits for none of it.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

from rl360cli.agent.config import RolloutConfig
from rl360cli.agent.conversation import ConversationTokens, format_observation, parse_action
from rl360cli.inference.client import EngineClient, EngineError
from rl360cli.outcome import InfraCause, Outcome
from rl360cli.rl.trajectory import Trajectory
from rl360cli.sandbox.attempt import InfraError, run_attempt
from rl360cli.sandbox.provider import SandboxProvider
from rl360cli.sandbox.task import Task


@dataclass(frozen=True, slots=True)
class SessionSpec:
    """Which attempt to make: the task, its group (one GRPO group per task per step) and sample."""

    task_id: str
    group_id: str
    sample_index: int
    attempt_id: str


async def run_session(spec: SessionSpec, task: Task, *, tokenizer: Any, client: EngineClient,
                      provider: SandboxProvider, config: RolloutConfig, exec_timeout_s: float,
                      labels: dict[str, str]) -> Trajectory:
    conversation = ConversationTokens(tokenizer, [{"role": "user", "content": task.instruction}],
                                      observation_role=config.observation_role,
                                      template_kwargs=config.chat_template_kwargs)
    turns: list[dict] = []
    generate_s = 0.0

    # Whether the conversation ends in a generation prompt that got no reply (at the start, and after an
    # observation), else the finish reason of the last reply: how a next step's user turn is joined on.
    ending: str | None = None

    async def agent(sandbox, step=None) -> None:
        nonlocal generate_s, ending
        if step is not None and step.index > 0:
            if len(conversation) + 1 >= config.max_total_tokens:
                return
            _add_user_turn(conversation, step.instruction, finished_turn=ending == "stop")
            ending = None
        for _ in range(config.max_turns):
            budget = min(config.max_new_tokens, config.max_total_tokens - len(conversation))
            if budget <= 0:
                return
            started = time.monotonic()
            try:
                reply = await client.generate(
                    conversation.token_ids,
                    {"max_new_tokens": budget, "temperature": config.temperature, "top_p": config.top_p},
                    timeout_s=config.generate_timeout_s,
                )
            except EngineError as e:
                raise InfraError(InfraCause.ENGINE_ERROR, str(e)) from e
            generate_s += time.monotonic() - started
            conversation.add_generated(reply.output_ids, reply.logprobs, reply.weight_version)
            ending = reply.finish_reason
            action = parse_action(reply.text)
            turns.append({"action": action.kind, "tokens": len(reply.output_ids), "finish": reply.finish_reason,
                          **({"step": step.name} if step is not None else {})})
            if action.kind == "submit":
                return
            result = await sandbox.exec(action.command, timeout_s=exec_timeout_s)
            observation = format_observation(result.exit_code, result.output, timed_out=result.timed_out,
                                             max_chars=config.max_observation_chars)
            if len(conversation) + 1 >= config.max_total_tokens:
                return
            conversation.add_observation(observation, finished_turn=reply.finish_reason == "stop")
            ending = None

    began = time.monotonic()
    running = asyncio.ensure_future(run_attempt(provider, task, agent, attempt_id=spec.attempt_id, labels=labels))
    try:
        done, _ = await asyncio.wait({running}, timeout=config.session_timeout_s)
    except asyncio.CancelledError:  # the session itself is cancelled (a carried group, the run's end):
        _cut(running)  # so is its attempt, whose sandbox stops in the background, drained at close
        raise
    if not done:
        _cut(running)
        return _session_timeout(spec, conversation, turns, config.session_timeout_s,
                                timings={"generate": generate_s, "total": time.monotonic() - began})
    attempt = running.result()
    timings = dict(attempt.timings)
    timings["generate"] = generate_s
    return Trajectory(
        task_id=spec.task_id,
        group_id=spec.group_id,
        sample_index=spec.sample_index,
        token_ids=conversation.token_ids,
        loss_mask=conversation.loss_mask,
        logprobs=conversation.logprobs,
        versions=conversation.turn_versions,
        num_prompt_tokens=conversation.num_prompt_tokens,
        reward=attempt.reward,
        outcome=attempt.outcome,
        cause=attempt.cause,
        timings=timings,
        metadata={"turns": turns, "node": attempt.node, "detail": attempt.detail, "injected": attempt.injected,
                  "retries": attempt.retries, "pool_hit": attempt.pool_hit,
                  **({"steps": list(attempt.steps)} if attempt.steps else {})},
    )


def _add_user_turn(conversation: ConversationTokens, text: str, *, finished_turn: bool) -> None:
    """A next step's instruction as a user message, rendered as the template renders one after an
    assistant turn, with the next generation prompt (loss mask 0). An assistant turn left open (a
    reply cut at its token limit, or a prompt that got no reply) is closed first, as empty if need be."""
    role = conversation.observation_role
    conversation.observation_role = "user"
    try:
        conversation.add_observation(text, finished_turn=finished_turn)
    finally:
        conversation.observation_role = role


# Attempts cut at the session deadline or cancelled with their session, still stopping their
# sandboxes; held so that they finish.
_CUT: set[asyncio.Future] = set()


async def drain_cut_sessions(timeout_s: float = 30.0) -> int:
    """Wait (at most `timeout_s`) for the sessions cut at their deadline to stop their sandboxes;
    returns how many are still stopping. A session actor calls it before it closes its provider."""
    if _CUT:
        await asyncio.wait(set(_CUT), timeout=timeout_s)
    return len(_CUT)


def _cut(running: asyncio.Future) -> None:
    """Cancel an attempt (past its deadline, or its session cancelled); its `finally` stops the
    sandbox, in the background."""
    running.cancel()
    _CUT.add(running)
    running.add_done_callback(_CUT.discard)


def _session_timeout(spec: SessionSpec, conversation: ConversationTokens, turns: list[dict], budget_s: float, *,
                     timings: dict[str, float]) -> Trajectory:
    """The masked trajectory of a session cut at its deadline: what it generated, no reward."""
    return Trajectory(
        task_id=spec.task_id, group_id=spec.group_id, sample_index=spec.sample_index,
        token_ids=conversation.token_ids, loss_mask=conversation.loss_mask, logprobs=conversation.logprobs,
        versions=conversation.turn_versions, num_prompt_tokens=conversation.num_prompt_tokens,
        reward=None, outcome=Outcome.INFRA_FAILURE, cause=InfraCause.SESSION_TIMEOUT, timings=timings,
        metadata={"turns": turns, "node": None, "injected": False, "retries": 0,
                  "detail": f"the session ran past its {budget_s:g}s deadline ([rollout] session_timeout_s) "
                            f"after {len(turns)} turns; cut, its sandbox stopped in the background"},
    )
