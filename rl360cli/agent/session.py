"""One rollout session: a multi-turn agent attempt at a Harbor task, turned into a Trajectory.

The instruction goes through the model's chat template; then, turn by turn,
the engine generates (token in, token out: its ids and logprobs are kept),
the reply's bash block runs in the sandbox, and the observation is tokenized
once and appended — until the agent submits or a turn or token budget runs
out. The verifier then scores the sandbox. An engine that fails the request
ends the attempt as an `engine_error` infrastructure failure: masked, never a
wrong answer.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from rl360cli.agent.config import RolloutConfig
from rl360cli.agent.conversation import ConversationTokens, format_observation, parse_action
from rl360cli.inference.client import EngineClient, EngineError
from rl360cli.outcome import InfraCause
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

    async def agent(sandbox) -> None:
        nonlocal generate_s
        for _ in range(config.max_turns):
            budget = min(config.max_new_tokens, config.max_total_tokens - len(conversation))
            if budget <= 0:
                return
            started = time.monotonic()
            try:
                reply = await client.generate(
                    conversation.token_ids,
                    {"max_new_tokens": budget, "temperature": config.temperature, "top_p": config.top_p},
                )
            except EngineError as e:
                raise InfraError(InfraCause.ENGINE_ERROR, str(e)) from e
            generate_s += time.monotonic() - started
            conversation.add_generated(reply.output_ids, reply.logprobs, reply.weight_version)
            action = parse_action(reply.text)
            turns.append({"action": action.kind, "tokens": len(reply.output_ids), "finish": reply.finish_reason})
            if action.kind == "submit":
                return
            result = await sandbox.exec(action.command, timeout_s=exec_timeout_s)
            observation = format_observation(result.exit_code, result.output, timed_out=result.timed_out,
                                             max_chars=config.max_observation_chars)
            if len(conversation) + 1 >= config.max_total_tokens:
                return
            conversation.add_observation(observation, finished_turn=reply.finish_reason == "stop")

    attempt = await run_attempt(provider, task, agent, attempt_id=spec.attempt_id, labels=labels)
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
                  "retries": attempt.retries},
    )
