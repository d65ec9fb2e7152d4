"""One attempt at a task: start a sandbox, let the agent act, run the verifier, read the reward, stop.

    result = await run_attempt(provider, task, agent, attempt_id="step3-t7-s2", labels={"rl360.run": run})

`agent` is an async callable `agent(sandbox) -> None` that runs the policy's
turns through `sandbox.exec` (the RL loop's multi-turn LLM agent; `rl360
tasks check` passes the oracle or a no-op). It signals an infrastructure
problem it hit itself (the engine failed) by raising `InfraError(cause,
detail)`, and a model that gave no usable answer by raising `ModelFailure`.
The agent runs under the task's agent time budget ([agent] timeout_sec).

Then the tests are uploaded to /tests (anything the agent left there or in
/logs/verifier is removed first, so no file of the agent's counts), `tests/test.sh`
runs under the verifier timeout with `[verifier.env]` beside whatever the agent
left running (Harbor's rule: a server the agent started is there for the tests;
`[sandbox] end_agent_before_verifier` kills it first instead), everything the
sandbox runs ends once test.sh has exited, and the reward is read:
`/logs/verifier/reward.json` first (a flat mapping of numbers; the reward is
its "reward" key, else the mean of its values), else
`/logs/verifier/reward.txt` (one number). The exit code of test.sh is
ignored, as in Harbor.

A prebuilt image's task with files in environment/ (and neither a Dockerfile
nor a compose file there) gets them uploaded into the workdir once its sandbox
has started, as Harbor uploads them.

A multi-step task (`task.steps`) runs its steps in order in the one sandbox:
per step, `steps/<name>/workdir/` is copied into the workdir (and its
`setup.sh`, if any, runs there), the step's healthcheck passes, the agent
runs as `agent(sandbox, step)` under the step's budget, and the step's
verifier runs (the task's tests/ with the step's own on top) under the
step's timeout; /tests and /logs/verifier are emptied again
before the next step's agent. A step below its `min_reward` ends the task.
The task's reward is Harbor's rule over the steps' (steps.task_rewards).

Before each verifier, Harbor's collection pass (artifacts.py): the
`[[verifier.collect]]` hooks run (in the sandbox, then in its sidecars) and
the `artifacts` (with /logs/artifacts) are taken out, kept in `artifacts_dir`
when one is given; their manifest is in the result. A separate verifier
(`task.verifier_task`, or a step's) runs in a second sandbox started from
the verifier's own environment through the same provider: the agent's
processes are ended, the artifacts are copied into it at their source paths,
the tests are uploaded unless its image (built from tests/) holds them, and
the reward is read there. A task no node can hold (GPUs, MCP sidecars) ends as
`sandbox_start` with the reason, before anything starts.

How the attempt ends is decided by the taxonomy table (taxonomy.py) from
what was observed. Every phase is timed; the sandbox is always stopped, also
when the attempt is cancelled.

Test: tests/sandbox/test_attempt.py, tests/sandbox/test_faults.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import shlex
import shutil
import tempfile
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rl360cli.egress.client import EgressReport
from rl360cli.outcome import InfraCause, Outcome
from rl360cli.sandbox.artifacts import Collected, collect_pass, deliver
from rl360cli.sandbox.provider import ExecResult, Sandbox, SandboxProvider
from rl360cli.sandbox.steps import below_min_reward, placement_problem, task_rewards
from rl360cli.sandbox.task import Healthcheck, Step, Task, resolve_env
from rl360cli.sandbox.taxonomy import RULES, Event, InfraError, ModelFailure, Observed, SandboxError, classify

__all__ = ["AttemptResult", "InfraError", "ModelFailure", "run_attempt", "read_reward", "oracle_agent", "noop_agent"]

# `agent(sandbox)`; for a multi-step task `agent(sandbox, step)`, once per step.
Agent = Callable[..., Awaitable[None]]


def run_script(path: str) -> str:
    """Shell that runs the script at `path` as Harbor does (it makes it executable and runs it): by its
    `#!` line's interpreter when it has one (`#!/usr/bin/env python3`), else with bash (sh without bash).
    The interpreter is named rather than the file executed, so a verifier user that may not chmod a
    root-owned upload runs it all the same."""
    q = shlex.quote(path)
    return (f"IFS= read -r first < {q}; case $first in '#!'*) set -- ${{first#??}}; exec \"$@\" {q};; esac; "
            f'exec "$(command -v bash || echo sh)" {q}')


VERIFY_COMMAND = run_script("/tests/test.sh")
REWARD_JSON = "/logs/verifier/reward.json"
REWARD_TXT = "/logs/verifier/reward.txt"


@dataclass(frozen=True, kw_only=True, slots=True)
class AttemptResult:
    outcome: Outcome
    # The infra cause (None unless outcome is infra_failure).
    cause: InfraCause | None
    # The verifier's reward (0.0 when it produced none).
    reward: float
    # Everything reward.json held (or {"reward": x} from reward.txt).
    rewards: dict[str, float]
    # Seconds per phase: start, healthcheck, agent, upload_tests, verify, reward, stop, total.
    timings: dict[str, float]
    node: str | None
    # One line: what decided the outcome.
    detail: str
    attempt_id: str = ""
    task_id: str = ""
    # The failure was injected on purpose ([sandbox] inject_failure_rate).
    injected: bool = False
    # The admission controller may retry it on another node.
    retriable: bool = False
    # Every event observed, in order (taxonomy.Event values).
    events: tuple[str, ...] = ()
    # The tail of the verifier's output, for the operator.
    verifier_output: str = ""
    # Whether the sandbox came from a warm pool (None: the provider has none, or no sandbox started).
    pool_hit: bool | None = None
    # Set by the admission controller: how many times the attempt was retried, and where it ran.
    retries: int = 0
    nodes_tried: tuple[str, ...] = ()
    # "node: cause" of each earlier try that the controller ran again.
    retried_causes: tuple[str, ...] = ()
    # Per agent command: exit code, seconds, timed_out, limit.
    commands: tuple[dict[str, Any], ...] = field(default=(), compare=False)
    # A multi-step task's steps that ran, in order: name, reward, rewards (absent for a single-step task).
    steps: tuple[dict[str, Any], ...] = field(default=(), compare=False)
    # What its sandboxes did through the node's egress proxy (bytes, denials and failures per host, one line
    # each), or, for a task that wanted the internet and got none, that line alone; None when neither.
    egress: EgressReport | None = field(default=None, compare=False)
    # Harbor's collection pass (artifacts.py): each artifact taken (source, destination, type, status,
    # service; "step" in a multi-step task), and each collect hook's end (service, command, exit_code).
    artifacts: tuple[dict[str, Any], ...] = field(default=(), compare=False)
    collect_hooks: tuple[dict[str, Any], ...] = field(default=(), compare=False)

    @property
    def masked(self) -> bool:
        return self.outcome == Outcome.INFRA_FAILURE


async def run_attempt(provider: SandboxProvider, task: Task, agent: Agent, *, attempt_id: str,
                      labels: Mapping[str, str] | None = None, node: str | None = None,
                      timeout_multiplier: float = 1.0, artifacts_dir: Path | None = None) -> AttemptResult:
    """Run one attempt end to end; never raises for an infrastructure failure (it is in the result).

    `timeout_multiplier` scales the task's agent and verifier budgets (and each step's), as Harbor's
    `--timeout-multiplier` does: a slower engine or node than the task's author timed against.
    `artifacts_dir`: where the artifacts taken after the agent are kept, as in Harbor's trial folder
    (a step's under `steps/<name>/artifacts/`); None keeps only their manifest, in the result."""
    observed: list[Observed] = []
    timings: dict[str, float] = {}
    commands: list[dict[str, Any]] = []
    injected = False
    where: str | None = node
    pool_hit: bool | None = None
    verifier_output = ""
    rewards: dict[str, float] = {}
    sandbox: Sandbox | None = None
    step_results: list[dict[str, Any]] = []
    verifier = _VerifierStarter(provider, attempt_id, dict(labels or {}))
    kept = _Kept(folder=artifacts_dir)
    began = time.monotonic()
    try:
        try:
            if task.gpus or task.mcp_servers or task.sidecars:  # what not every node holds: refused before a start
                problem = placement_problem(task, provider.nodes(), getattr(provider, "name", ""),
                                            sidecars=getattr(provider, "supports_sidecars", False),
                                            service_ops=getattr(provider, "supports_service_ops", False))
                if problem is not None:
                    raise SandboxError(Event.START_FAILED, problem)
            with _timed(timings, "start"):
                sandbox = await provider.start(task, attempt_id=attempt_id, labels=dict(labels or {}), node=node)
            where = sandbox.node
            verifier.started.append(sandbox)
            pool_hit = sandbox.info().get("pool_hit")
            if task.environment_upload is not None:
                with _timed(timings, "upload_environment"):
                    for entry in sorted(task.environment_upload.iterdir()):
                        await sandbox.upload(entry, f"{sandbox.workdir.rstrip('/')}/{entry.name}")
            if task.healthcheck is not None:
                with _timed(timings, "healthcheck"):
                    await _healthcheck(sandbox, task)
            if task.steps:
                rewards, verifier_output, injected_here = await _run_steps(
                    sandbox, task, agent, verifier, observed, timings, commands, step_results, timeout_multiplier,
                    kept)
                injected |= injected_here
            else:
                with _timed(timings, "agent"):
                    recorder = _Recorder(sandbox, observed, commands, user=task.agent_user)
                    injected |= await _run_agent(agent, recorder, observed, task.agent_timeout_s * timeout_multiplier)
                if not _infra(observed):
                    async def release() -> None:
                        nonlocal sandbox
                        held, sandbox = sandbox, None
                        await _stop(held)

                    rewards, verifier_output = await _verify(sandbox, task, observed, timings,
                                                             task.verifier_timeout_s * timeout_multiplier,
                                                             verifier=verifier, release=release, kept=kept)
        except InfraError as e:
            observed.append(e.observed())
            injected |= e.injected
            where = getattr(e, "node", None) or where
    finally:
        if sandbox is not None:
            with _timed(timings, "stop"):
                await _stop(sandbox)
        timings["total"] = time.monotonic() - began
    egress = _egress_of(verifier.started, observed)
    verdict = classify(observed)
    injected |= any(o.event == Event.INJECTED for o in observed)
    reward = 0.0
    if verdict.outcome != Outcome.INFRA_FAILURE and rewards:
        reward = _reward_of(rewards)
    return AttemptResult(
        outcome=verdict.outcome, cause=verdict.cause, reward=reward, rewards=rewards, timings=timings, node=where,
        detail=verdict.detail, attempt_id=attempt_id, task_id=task.id, injected=injected,
        retriable=verdict.retriable and verdict.outcome == Outcome.INFRA_FAILURE,
        events=tuple(o.event.value for o in observed), verifier_output=verifier_output[-2000:],
        commands=tuple(commands), pool_hit=pool_hit, steps=tuple(step_results), egress=egress,
        artifacts=tuple(kept.manifest), collect_hooks=tuple(kept.hooks),
    )


def _egress_of(sandboxes: list[Sandbox], observed: list[Observed]) -> EgressReport | None:
    """What the attempt's sandboxes (the agent's, a separate verifier's) did through the egress proxy; a host
    the task was allowed and could not reach is the infrastructure's failure (event `egress_failed`), a host
    off the list the model's own doing (counted, its line kept, the reward stands)."""
    report = EgressReport.merged(s.egress_report() for s in sandboxes)
    if report is None and any(s.info().get("network_denied") for s in sandboxes):
        report = EgressReport(lines=("rl360 egress: the task wants the internet and its sandbox has none (the "
                                     "cluster profile's [egress] mode, or [sandbox] network)",))
    if report is not None and report.failed:
        observed.append(Observed(event=Event.EGRESS_FAILED, detail=report.failure or
                                 f"rl360 egress: {', '.join(report.failed)} could not be reached"))
    return report


# ----------------------------------------------------------------------------- the steps


async def _run_steps(sandbox: Sandbox, task: Task, agent: Agent, verifier: _VerifierStarter,
                     observed: list[Observed], timings: dict[str, float], commands: list[dict[str, Any]],
                     step_results: list[dict[str, Any]], timeout_multiplier: float,
                     kept: _Kept) -> tuple[dict[str, float], str, bool]:
    """Run a multi-step task's steps in order in `sandbox`; the task's rewards by Harbor's rule."""
    injected = False
    per_step: list[dict[str, float]] = []
    output = ""
    recorder = _Recorder(sandbox, observed, commands)
    for step in task.steps:
        if step.index > 0:
            # The previous step's tests and grading files are not the next agent's to read.
            with _timed(timings, "upload_tests"):
                await sandbox.reset_dir("/tests")
                await sandbox.reset_dir("/logs/verifier")
        if step.workdir_dir is not None:
            with _timed(timings, "upload_workdir"):
                for entry in sorted(step.workdir_dir.iterdir()):
                    await sandbox.upload(entry, f"{sandbox.workdir.rstrip('/')}/{entry.name}")
            if (step.workdir_dir / "setup.sh").is_file():  # Harbor runs it there, as the step's agent user
                with _timed(timings, "setup"):
                    await _step_setup(sandbox, step)
        if step.healthcheck is not None:
            with _timed(timings, "healthcheck"):
                await _healthcheck(sandbox, task, step.healthcheck)
        recorder.user = step.agent_user  # the step's own, else the task's (task_loader.py)
        with _timed(timings, "agent"):
            injected |= await _run_agent(lambda box, step=step: agent(box, step), recorder, observed,
                                         step.agent_timeout_s * timeout_multiplier)
        if _infra(observed):
            break
        rewards, output = await _verify(sandbox, task, observed, timings,
                                        step.verifier_timeout_s * timeout_multiplier,
                                        verifier=verifier, step=step, kept=kept)
        if _infra(observed):
            break
        per_step.append(rewards)
        reward = _reward_of(rewards) if rewards else 0.0
        stop = below_min_reward(step, rewards, reward)
        step_results.append({"name": step.name, "reward": reward, "rewards": rewards, "stopped_task": stop})
        if stop:
            break
    return task_rewards(task.reward_strategy, per_step), output, injected


# ----------------------------------------------------------------------------- the agent


async def _run_agent(agent: Agent, sandbox: _Recorder, observed: list[Observed], budget_s: float) -> bool:
    """Run the agent under its budget; returns whether an injected failure ended it."""
    try:
        async with asyncio.timeout(budget_s) as scope:
            await agent(sandbox)
    except TimeoutError as e:
        if scope.expired():
            observed.append(Observed(event=Event.AGENT_BUDGET,
                                     detail=f"the agent used up its {budget_s:g}s budget"))
        else:
            observed.append(Observed(event=Event.AGENT_BUG, detail=f"the agent raised TimeoutError: {e}"))
    except ModelFailure as e:
        observed.append(Observed(event=Event.AGENT_NO_ANSWER, detail=str(e) or "the agent gave no answer"))
    except InfraError as e:
        if not sandbox.recorded(e):
            observed.append(e.observed())
        return e.injected
    except Exception as e:  # noqa: BLE001 — a bug in the agent's code is an infra failure, never a wrong answer
        observed.append(Observed(event=Event.AGENT_BUG, detail=f"the agent raised {type(e).__name__}: {e}"))
    return False


# What the agent sees when its command holds a NUL byte: nothing ran (126: "cannot execute").
NUL_EXIT_CODE = 126
NUL_REFUSAL = "rl360: the command holds a NUL byte, which no shell command line can carry; nothing ran"


class _Recorder(Sandbox):
    """The sandbox as the agent sees it: notes each command's timeout, limit or provider failure."""

    def __init__(self, inner: Sandbox, observed: list[Observed], commands: list[dict[str, Any]], *,
                 user: str | None = None):
        self.inner = inner
        # Who the agent's commands run as unless a command says (`[agent] user`, a step's own): where the
        # provider runs commands as users (docker; a process sandbox has one uid).
        self.user = user
        self.observed = observed
        self.commands = commands
        self.id, self.node, self.provider = inner.id, inner.node, inner.provider
        self.task, self.attempt_id = inner.task, inner.attempt_id
        self._errors: list[InfraError] = []

    @property
    def workdir(self) -> str:
        return self.inner.workdir

    def recorded(self, error: InfraError) -> bool:
        return any(e is error for e in self._errors)

    def _failed(self, error: InfraError) -> None:
        self._errors.append(error)
        self.observed.append(error.observed())

    async def exec(self, command: str, *, timeout_s: float, env=None, user=None) -> ExecResult:
        if "\0" in command:
            # No shell command line can carry a NUL byte (execve would refuse it). A policy can sample
            # one: the turn is the model's failure, answered as a shell answers a command it cannot run.
            result = ExecResult(exit_code=NUL_EXIT_CODE, output=NUL_REFUSAL)
        else:
            try:
                result = await self.inner.exec(command, timeout_s=timeout_s, env=env, user=user or self.user)
            except InfraError as e:
                self._failed(e)
                raise
        self.commands.append({"exit_code": result.exit_code, "seconds": round(result.duration_s, 4),
                              "timed_out": result.timed_out, "limit": result.limit})
        if result.timed_out:
            self.observed.append(Observed(event=Event.AGENT_EXEC_TIMEOUT,
                                          detail=f"an agent command ran past its {timeout_s:g}s timeout"))
        elif result.limit:
            self.observed.append(Observed(event=Event.AGENT_LIMIT,
                                          detail=f"an agent command hit the sandbox's {result.limit} limit"))
        return result

    async def upload(self, local_path, remote_path) -> None:
        try:
            await self.inner.upload(local_path, remote_path)
        except InfraError as e:
            self._failed(e)
            raise

    async def download(self, remote_path, local_path) -> None:
        try:
            await self.inner.download(remote_path, local_path)
        except InfraError as e:
            self._failed(e)
            raise

    async def read_file(self, remote_path, *, max_bytes=1 << 20):
        return await self.inner.read_file(remote_path, max_bytes=max_bytes)

    async def stop(self) -> None:
        """The agent does not stop the sandbox; run_attempt does."""

    def info(self):
        return self.inner.info()

    async def open_door(self, upstream: str, key: str) -> dict[str, str] | None:
        return await self.inner.open_door(upstream, key)


# ----------------------------------------------------------------------------- the verifier


class _VerifierStarter:
    """Starts a separate verifier's sandbox through the attempt's provider, labelled as the attempt's.

    A step's verifier starts while the agent's sandbox lives (the next step needs it): it starts
    beside it, on its node, within the slot the attempt already holds — past the admission
    controller's queue (its `inner` provider), since attempts that each hold a slot and wait in the
    queue for a second one would wait on each other for ever once they hold every slot."""

    def __init__(self, provider: SandboxProvider, attempt_id: str, labels: dict[str, str]):
        self.provider, self.attempt_id, self.labels = provider, attempt_id, labels
        self.count = 0
        # Every sandbox of the attempt, the agent's first (run_attempt adds it): their egress reports add up.
        self.started: list[Sandbox] = []

    async def start(self, task: Task, *, beside: Sandbox | None = None) -> Sandbox:
        self.count += 1
        attempt_id = f"{self.attempt_id}-verifier{self.count}"
        if beside is None:
            separate = await self.provider.start(task, attempt_id=attempt_id, labels=self.labels)
        else:
            provider = getattr(self.provider, "inner", None) or self.provider
            separate = await provider.start(task, attempt_id=attempt_id, labels=self.labels, node=beside.node)
        self.started.append(separate)
        return separate


@dataclass(kw_only=True, slots=True)
class _Kept:
    """Where the attempt keeps what its collection passes take (None: a temporary folder each), and what
    they recorded."""

    folder: Path | None = None
    manifest: list[dict[str, Any]] = field(default_factory=list)
    hooks: list[dict[str, Any]] = field(default_factory=list)

    @contextlib.contextmanager
    def folder_for(self, step: Step | None):
        if self.folder is not None:
            yield self.folder if step is None else self.folder / "steps" / step.name / "artifacts"
            return
        with tempfile.TemporaryDirectory(prefix="rl360-artifacts-") as tmp:
            yield Path(tmp)


async def _verify(sandbox: Sandbox, task: Task, observed: list[Observed], timings: dict[str, float],
                  timeout_s: float, *, verifier: _VerifierStarter | None = None, step: Step | None = None,
                  release: Callable[[], Awaitable[None]] | None = None,
                  kept: _Kept | None = None) -> tuple[dict[str, float], str]:
    """Run the verifier (the task's, or a step's) and read its reward: in the agent's sandbox, or
    in a second sandbox from the verifier's own environment when it is separate. Before it, Harbor's
    collection pass: the collect hooks run and the artifacts are taken (artifacts.py)."""
    of = step if step is not None else task
    tests_dirs = step.tests_dirs if step is not None else (task.tests_dir,)
    kept = kept or _Kept()
    try:
        env = resolve_env(of.verifier_env)
    except KeyError as e:
        observed.append(Observed(event=Event.VERIFIER_ENV_MISSING,
                                 detail=f"[verifier.env] needs ${{{e.args[0]}}}, which is not set"))
        return {}, ""
    separate = of.verifier_task is not None and verifier is not None
    # A shared verifier with no hook and nothing kept: no pass, and no temporary folder (every RL attempt).
    runs_pass = bool(of.collect) or separate or kept.folder is not None
    with kept.folder_for(step) if runs_pass else contextlib.nullcontext() as folder:
        collected = Collected()
        if runs_pass:
            # Separate, on the last (or only) step: the agent is done with its sandbox, its processes end once
            # main's artifacts are taken (Harbor stops main there; an earlier step's live on for the next).
            # The verifier sees only what is handed to it. Shared: the copies are taken only where kept.
            last = step is None or step.index == len(task.steps) - 1
            with _timed(timings, "collect"):
                collected = await collect_pass(sandbox, of.artifacts, of.collect, folder,
                                               end_main=separate and last,
                                               download=separate or kept.folder is not None)
        kept.hooks.extend(collected.hooks)
        kept.manifest.extend({**entry, "step": step.name} if step is not None else entry
                             for entry in collected.manifest)
        if not separate:
            with _timed(timings, "upload_tests"):
                await sandbox.prepare_verifier()
                await _upload_tests(sandbox, tests_dirs)
            # Once test.sh has exited, a single-step task's sandbox is done: what the agent left running (alive
            # for the tests, as Harbor leaves it) ends before the reward is read, so it cannot write the reward
            # after the verifier did. A later step needs it alive.
            return await _run_tests(sandbox, task, of.verifier_user, env, observed, timings, timeout_s,
                                    end_after=step is None)
        assert verifier is not None and of.verifier_task is not None
        if release is not None:
            # A single-step task's agent sandbox is done: stopped before the verifier's starts, so that
            # the two never wait on each other for a reservation.
            with _timed(timings, "stop"):
                await release()
        with _timed(timings, "verifier_start"):
            separate_box = await verifier.start(of.verifier_task, beside=sandbox if release is None else None)
        try:
            with _timed(timings, "upload_tests"):
                await separate_box.reset_dir("/logs/verifier")
                await deliver(separate_box, collected)
                if of.verifier_uploads_tests:
                    await separate_box.reset_dir("/tests")
                    await _upload_tests(separate_box, tests_dirs)
            return await _run_tests(separate_box, of.verifier_task, of.verifier_user, env, observed, timings,
                                    timeout_s)
        finally:
            with _timed(timings, "verifier_stop"):
                await _stop(separate_box)


async def _upload_tests(sandbox: Sandbox, tests_dirs: tuple) -> None:
    """Upload the tests to /tests; several folders are merged first, the later's files winning
    (an upload replaces its target folder on some providers, so they cannot go one by one)."""
    if len(tests_dirs) == 1:
        await sandbox.upload(tests_dirs[0], "/tests")
        return
    with tempfile.TemporaryDirectory(prefix="rl360-tests-") as tmp:
        merged = f"{tmp}/tests"
        for folder in tests_dirs:
            await asyncio.to_thread(shutil.copytree, folder, merged, symlinks=True, dirs_exist_ok=True)
        await sandbox.upload(merged, "/tests")


async def _run_tests(sandbox: Sandbox, task: Task, user: str | None, env: dict[str, str], observed: list[Observed],
                     timings: dict[str, float], timeout_s: float, *,
                     end_after: bool = False) -> tuple[dict[str, float], str]:
    with _timed(timings, "verify"):
        result = await sandbox.exec(VERIFY_COMMAND, timeout_s=timeout_s, env=env, user=user)
        if end_after:
            await sandbox.end_agent_processes()
    with _timed(timings, "reward"):
        rewards, problem = await read_reward(sandbox)
    if result.timed_out:
        observed.append(Observed(event=Event.VERIFIER_TIMEOUT,
                                 detail=f"tests/test.sh ran past the verifier's {timeout_s:g}s timeout"))
    elif result.oom_killed and (problem is not None or _memory_of(sandbox) < task.memory_mb):
        # Out of memory is the infrastructure's fault when the verifier could not even write its reward,
        # or when the sandbox got less memory than the task declares it needs. Under the task's own
        # reservation (which `rl360 tasks check` shows the oracle passes within), a written reward
        # stands: otherwise code that merely prints "MemoryError" would mask its own failures.
        observed.append(Observed(event=Event.VERIFIER_OOM,
                                 detail=f"the verifier ran out of memory (reservation "
                                        f"{_memory_of(sandbox)} MB)"))
    if problem is not None:
        observed.append(problem)
    else:
        observed.append(Observed(event=Event.REWARD, detail=f"reward {_reward_of(rewards):g}"))
    return rewards, result.output


async def read_reward(sandbox: Sandbox) -> tuple[dict[str, float], Observed | None]:
    """The verifier's rewards, or the problem with them (reward.json first, else reward.txt)."""
    raw = await sandbox.read_file(REWARD_JSON, max_bytes=1 << 16)
    if raw is not None:
        try:
            data = json.loads(raw)
        except ValueError as e:  # not JSON, not UTF-8, or an integer of over 4,300 digits
            return {}, Observed(event=Event.VERIFIER_BAD_REWARD, detail=f"reward.json is not JSON ({e})")
        if not isinstance(data, dict) or not data:
            return {}, Observed(event=Event.VERIFIER_BAD_REWARD, detail="reward.json is not a non-empty mapping")
        bad = [k for k, v in data.items() if not _finite_number(v)]
        if bad:
            return {}, Observed(event=Event.VERIFIER_BAD_REWARD,
                                detail="reward.json values must be finite numbers "
                                       f"(not {', '.join(map(repr, bad[:3]))})")
        return {str(k): float(v) for k, v in data.items()}, None
    raw = await sandbox.read_file(REWARD_TXT, max_bytes=4096)
    if raw is None:
        return {}, Observed(event=Event.VERIFIER_NO_REWARD,
                            detail="tests/test.sh wrote neither reward.json nor reward.txt")
    try:
        value = float(raw.decode().strip())
    except (ValueError, UnicodeDecodeError):
        return {}, Observed(event=Event.VERIFIER_BAD_REWARD,
                            detail=f"reward.txt holds {raw[:40]!r}, not a number")
    if not math.isfinite(value):
        return {}, Observed(event=Event.VERIFIER_BAD_REWARD, detail=f"reward.txt holds {value}, not a finite number")
    return {"reward": value}, None


def _finite_number(value) -> bool:
    """A JSON number a reward can be: not a bool, not NaN or infinite, not an integer past float's range."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an integer of 400 digits
        return False


def _reward_of(rewards: Mapping[str, float]) -> float:
    """The "reward" key if present, else the mean of the values (documented in docs/sandboxes.md)."""
    if "reward" in rewards:
        return rewards["reward"]
    return sum(rewards.values()) / len(rewards)


# ----------------------------------------------------------------------------- agents of `tasks check`


def oracle_agent(task: Task, *, runs: list[ExecResult] | None = None) -> Agent:
    """Uploads solution/ to /solution and runs solve.sh with [solution.env], under the agent budget.
    In a multi-step task, each step's own steps/<name>/solution/ (a step without one does nothing).
    `runs`: where each solve.sh run's result is appended (`tasks check` shows the oracle's own output)."""

    async def oracle(sandbox: Sandbox, step: Step | None = None) -> None:
        try:
            env = resolve_env(task.solution_env)
        except KeyError as e:
            raise InfraError(InfraCause.UNKNOWN, f"[solution.env] needs ${{{e.args[0]}}}, which is not set") from None
        folder = task.solution_dir if step is None else step.solution_dir
        if folder is None:
            return
        await sandbox.upload(folder, "/solution")
        result = await sandbox.exec(run_script("/solution/solve.sh"),
                                    timeout_s=task.agent_timeout_s if step is None else step.agent_timeout_s,
                                    env=env, user=task.agent_user if step is None else step.agent_user)
        if runs is not None:
            runs.append(result)

    return oracle


async def noop_agent(sandbox: Sandbox, step: Step | None = None) -> None:
    """Does nothing: the verifier must not give a reward for an untouched sandbox."""


# ----------------------------------------------------------------------------- helpers


async def _healthcheck(sandbox: Sandbox, task: Task, check: Healthcheck | None = None) -> None:
    check = check or task.healthcheck
    assert check is not None
    if check.start_period_s > 0:
        await asyncio.sleep(check.start_period_s)
    last = None
    for attempt in range(check.retries):
        last = await sandbox.exec(check.command, timeout_s=check.timeout_s)
        if last.exit_code == 0:
            return
        if attempt + 1 < check.retries:
            await asyncio.sleep(check.interval_s)
    output = (last.output.strip()[-200:] if last else "") or "no output"
    raise SandboxError(Event.START_FAILED, f"healthcheck `{check.command}` failed {check.retries} times: {output}",
                       node=sandbox.node)


async def _step_setup(sandbox: Sandbox, step: Step) -> None:
    """`steps/<name>/workdir/setup.sh`, uploaded with the workdir, run before the step's agent (Harbor's
    multi_step.py); one that fails fails the attempt's environment, as Harbor records it on the step."""
    script = f"{sandbox.workdir.rstrip('/')}/setup.sh"
    result = await sandbox.exec(f'exec "$(command -v bash || echo sh)" {shlex.quote(script)}',
                                timeout_s=step.agent_timeout_s, user=step.agent_user)
    if result.exit_code != 0:
        raise SandboxError(Event.START_FAILED, f"step {step.name}: setup.sh "
                           f"{'timed out' if result.timed_out else f'exited {result.exit_code}'}: "
                           f"{result.output.strip()[-200:] or 'no output'}", node=sandbox.node)


async def _stop(sandbox: Sandbox) -> None:
    """Stop the sandbox even when the attempt is being cancelled."""
    with contextlib.suppress(Exception):
        await asyncio.shield(sandbox.stop())


def _infra(observed: list[Observed]) -> bool:
    return any(RULES[o.event].outcome == Outcome.INFRA_FAILURE for o in observed)


def _memory_of(sandbox: Sandbox) -> int:
    config = getattr(sandbox, "config", None)
    return getattr(config, "memory_mb", None) or sandbox.task.memory_mb


@contextlib.contextmanager
def _timed(timings: dict[str, float], phase: str):
    began = time.monotonic()
    try:
        yield
    finally:
        timings[phase] = timings.get(phase, 0.0) + time.monotonic() - began
