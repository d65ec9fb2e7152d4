"""One rollout session: a harness's attempt at a Harbor task, turned into trajectories.

The session is registered on the actor's session endpoint (endpoint.py), which gives it an OpenAI base URL
of its own; its harness (the built-in agent, mini-swe-agent, a user's function: harness.py) drives the model
through that URL and the sandbox through its handle, step by step for a multi-step task; the verifier then
scores the sandbox (sandbox/attempt.py). What trains is the endpoint's record of the session: the engine's
exact tokens and the rendered appends, one trajectory per segment (a harness that rewrote its history makes
more than one; `[agent] on_tito_break` trains them with the session's reward, or masks the session).

What broke under the harness is an infrastructure failure, masked: the harness raised (`harness_error`, or
`engine_error` / `endpoint_error` when a request it made failed so; its traceback is kept in the session's
trajectories' metadata, `traceback`), it ran past `[agent] harness_timeout_s` (`harness_timeout`).
`[agent] format_penalty` comes off the reward of a successful attempt with format errors.

Deadlines: each generation request has `[rollout] generate_timeout_s` (past it, an `engine_error`),
each command the sandbox's exec timeout, the agent and the verifier the task's budgets, and the
whole session `[rollout] session_timeout_s`: past that the session is cut wherever it hangs (a
sandbox start, an upload, a daemon that stopped answering) and ends as a `session_timeout` infra
failure. The cut attempt stops its sandbox in the background, so the step waits for none of it.
"""

from __future__ import annotations

import asyncio
import functools
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rl360cli.agent.config import AgentConfig, RolloutConfig
from rl360cli.agent.endpoint import SessionEndpoint, SessionOptions
from rl360cli.agent.harness import AsyncSandbox, Harness, Session, SessionLimits, SyncSandbox, TaskInfo, run_harness
from rl360cli.agent.session_record import SessionRecord
from rl360cli.outcome import InfraCause, Outcome
from rl360cli.rl.trajectory import Trajectory
from rl360cli.sandbox.attempt import AttemptResult, InfraError, ModelFailure, run_attempt
from rl360cli.sandbox.provider import SandboxProvider
from rl360cli.sandbox.task import Task


# Characters of a harness's traceback kept with its session (its last ones: where it raised).
MAX_TRACEBACK_CHARS = 8000


@dataclass(frozen=True, slots=True)
class SessionSpec:
    """Which attempt to make: the task, its group (one GRPO group per task per step) and sample."""

    task_id: str
    group_id: str
    sample_index: int
    attempt_id: str


def session_options(agent: AgentConfig, rollout: RolloutConfig, *, model: str) -> SessionOptions:
    """How the endpoint serves a session of this recipe."""
    return SessionOptions(model=model, tool_parser=agent.tool_parser or None,
                          reasoning_parser=agent.reasoning_parser or None,
                          chat_template_kwargs=dict(rollout.chat_template_kwargs),
                          max_new_tokens=rollout.max_new_tokens, max_total_tokens=rollout.max_total_tokens,
                          max_turns=rollout.max_turns, temperature=rollout.temperature, top_p=rollout.top_p,
                          generate_timeout_s=rollout.generate_timeout_s)


async def run_session(spec: SessionSpec, task: Task, *, endpoint: SessionEndpoint, harness: Harness,
                      options: SessionOptions, agent: AgentConfig, rollout: RolloutConfig,
                      provider: SandboxProvider, exec_timeout_s: float, labels: dict[str, str],
                      log: Callable[[str], None] = print) -> list[Trajectory]:
    """Attempt `task` with `harness`; the session's trajectories (one per segment; see the module docstring)."""
    handle = endpoint.register(options, log=log)
    loop = asyncio.get_running_loop()
    limits = SessionLimits(max_turns=options.max_turns, max_new_tokens=options.max_new_tokens,
                           max_total_tokens=options.max_total_tokens)

    async def attempt_agent(sandbox, step=None) -> None:
        endpoint.start_step(handle.token)  # each step (each call of the harness) may take max_turns
        view = AsyncSandbox(sandbox, default_timeout_s=exec_timeout_s)
        session = Session(
            task=TaskInfo(id=task.id, instruction=step.instruction if step is not None else task.instruction,
                          metadata=dict(task.metadata), step=step.name if step is not None else None,
                          step_index=step.index if step is not None else 0, workdir=sandbox.workdir,
                          skills_dir=task.skills_dir),
            base_url=handle.base_url, api_key=handle.token, model=options.model, sandbox=SyncSandbox(view, loop),
            async_sandbox=view, log=log, config=agent.harness_config,
            complete=functools.partial(endpoint.complete, handle.token), limits=limits,
            keep_file=handle.record.keep_file)
        try:
            await _run_harness(harness, session, handle.record, agent.harness_timeout_s)
        finally:
            await view.close()  # its persistent shell, with all it started, ends before the verifier

    began = time.monotonic()
    running = asyncio.ensure_future(run_attempt(provider, task, attempt_agent, attempt_id=spec.attempt_id,
                                                labels=labels, timeout_multiplier=agent.timeout_multiplier))
    try:
        done, _ = await asyncio.wait({running}, timeout=rollout.session_timeout_s)
    except asyncio.CancelledError:  # the session itself is cancelled (a carried group, the run's end):
        _cut(running)  # so is its attempt, whose sandbox stops in the background, drained at close
        endpoint.unregister(handle.token)
        raise
    record = endpoint.unregister(handle.token)
    timings = {"generate": record.generate_s, "total": time.monotonic() - began}
    if not done:
        _cut(running)
        detail = (f"the session ran past its {rollout.session_timeout_s:g}s deadline ([rollout] session_timeout_s) "
                  f"after {record.num_turns} turns; cut, its sandbox stopped in the background")
        return _trajectories(spec, task, record, harness, agent, reward=None, outcome=Outcome.INFRA_FAILURE,
                             cause=InfraCause.SESSION_TIMEOUT, timings=timings, metadata={
                                 "node": None, "injected": False, "retries": 0, "detail": detail})
    attempt: AttemptResult = running.result()
    return _trajectories(spec, task, record, harness, agent, reward=attempt.reward, outcome=attempt.outcome,
                         cause=attempt.cause, timings={**attempt.timings, **timings}, metadata={
                             "node": attempt.node, "detail": attempt.detail, "injected": attempt.injected,
                             "retries": attempt.retries, "pool_hit": attempt.pool_hit,
                             **({"rewards": dict(attempt.rewards)} if len(attempt.rewards) > 1 else {}),
                             "egress": attempt.egress.to_json() if attempt.egress else None,
                             **({"steps": list(attempt.steps)} if attempt.steps else {}),
                             **({"artifacts": list(attempt.artifacts)} if attempt.artifacts else {}),
                             **({"collect_hooks": list(attempt.collect_hooks)} if attempt.collect_hooks else {})})


async def _run_harness(harness: Harness, session: Session, record: SessionRecord, timeout_s: float) -> None:
    """The harness, under its own deadline; what breaks under it becomes its infra cause."""
    try:
        async with asyncio.timeout(timeout_s or None) as scope:
            await run_harness(harness, session)
    except TimeoutError as e:
        if scope.expired():
            raise InfraError(InfraCause.HARNESS_TIMEOUT,
                             f"the harness ran past its {timeout_s:g}s ([agent] harness_timeout_s)") from e
        record.harness_traceback = "".join(traceback.format_exception(e))[-MAX_TRACEBACK_CHARS:]
        raise InfraError(InfraCause.HARNESS_ERROR, f"the harness raised TimeoutError: {e}") from e
    except (InfraError, ModelFailure):
        raise
    except Exception as e:  # noqa: BLE001 - what the harness's own code raised is never the model's fault
        # Kept with the session (its trajectories' metadata), the end of it where it is long.
        record.harness_traceback = "".join(traceback.format_exception(e))[-MAX_TRACEBACK_CHARS:]
        if record.budget_exhausted:  # it gave up when its conversation outgrew the token budget: the model's
            session.log(f"the harness ended when the conversation reached the token budget ({type(e).__name__})")
            return
        if record.engine_errors:
            cause, why = InfraCause.ENGINE_ERROR, record.engine_errors[-1]
        elif record.endpoint_errors:
            cause, why = InfraCause.ENDPOINT_ERROR, record.endpoint_errors[-1]
        else:
            cause, why = InfraCause.HARNESS_ERROR, ""
        raise InfraError(cause, f"the harness raised {type(e).__name__}: {e}" + (f" (after: {why})" if why else "")) \
            from e


def task_tags(task: Task) -> list[str]:
    """The task's domain tags (`[metadata] tags`), for the step's figures per domain (rl360cli/loop/domains.py)."""
    tags = task.metadata.get("tags")
    return [str(tag) for tag in tags] if isinstance(tags, list) else []


def _trajectories(spec: SessionSpec, task: Task, record: SessionRecord, harness: Harness, agent: AgentConfig, *,
                  reward: float | None, outcome: Outcome, cause: InfraCause | None, timings: dict[str, float],
                  metadata: dict[str, Any]) -> list[Trajectory]:
    """The session's segments as trajectories, with the attempt's outcome and the recipe's rules applied."""
    samples = record.samples()
    format_errors = record.num_format_errors + getattr(harness, "format_errors", 0)
    if outcome is not Outcome.INFRA_FAILURE:
        if not samples and record.prompt_too_long:
            outcome, cause, reward = Outcome.INFRA_FAILURE, InfraCause.PROMPT_TOO_LONG, None
            metadata["detail"] = f"{record.prompt_too_long}: raise [rollout] max_total_tokens, or leave the task out"
        elif not samples and record.num_requests:
            outcome, cause, reward = Outcome.INFRA_FAILURE, InfraCause.NO_REPLY_IN_BUDGET, None
            metadata["detail"] = (f"{metadata.get('detail') or 'the attempt ended'} before the model's first reply "
                                  f"({record.generate_s:.0f}s waiting on the engine): fewer sessions in flight, "
                                  "more engines, or a larger [agent] timeout_multiplier")
        elif not samples:
            outcome, cause, reward = Outcome.INFRA_FAILURE, InfraCause.HARNESS_ERROR, None
            metadata["detail"] = "the harness made no request to the model: nothing to train on"
        elif record.num_tito_breaks and agent.on_tito_break == "mask":
            outcome, cause, reward = Outcome.INFRA_FAILURE, InfraCause.TITO_BREAK, None
            metadata["detail"] = f"{record.num_tito_breaks} tito breaks ([agent] on_tito_break = \"mask\"): " \
                                 f"{'; '.join(record.break_reasons)}"
        elif reward is not None and reward > 0 and format_errors and agent.format_penalty:
            reward = max(0.0, reward - agent.format_penalty)
    if outcome is Outcome.INFRA_FAILURE:
        reward = None
    if record.harness_traceback is not None:
        metadata["traceback"] = record.harness_traceback
    if record.agent_files:  # an installed agent's own log and trajectory (agent/installed.py)
        metadata["agent_files"] = dict(record.agent_files)
    common = {**metadata, "harness": agent.harness, "tags": task_tags(task),
              "turns": getattr(harness, "turns", None) or record.turns,
              "session": {**record.stats(), "format_errors": format_errors}}
    if outcome is Outcome.INFRA_FAILURE:  # masked: its first segment stands for it, counted once
        samples = samples[:1]
    if not samples:  # nothing was generated: an infra failure with no tokens
        return [Trajectory(task_id=spec.task_id, group_id=spec.group_id, sample_index=spec.sample_index,
                           token_ids=[], loss_mask=[], logprobs=[], versions=(), num_prompt_tokens=0, reward=None,
                           outcome=outcome, cause=cause, timings=timings, metadata=common)]
    return [Trajectory(task_id=spec.task_id, group_id=spec.group_id, sample_index=spec.sample_index, segment=index,
                       reward=reward, outcome=outcome, cause=cause, timings=timings,
                       metadata={**common, "routed_experts": sample.routed_experts},
                       **sample.trajectory_fields())
            for index, sample in enumerate(samples)]


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
