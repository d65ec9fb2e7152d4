"""Stage `agents try`: one session of a harness on one task, as a run's session actor makes it, against rl360's own
CPU engine serving the recipe's policy v0; what a harness author reads before training with it.

    result = try_harness(ctx, harness="python:my_agents.simple:run", task_path=Path("recipes/tasks/arith-32/arith-00"))
    result.outcome, result.reward, result.turns, result.cause      # the session, as a step would count it
    result.out_dir                                                 # its files: session.log, trajectory.jsonl, ...

The session is the run's own code path: the task loaded as the actors load it (an installed agent's layer over its
image), the recipe's sandbox provider on the profile's nodes (the machine's egress proxy started for the command
where the profile lets sandboxes out, an installed agent given its door), `harness_factory`, a `SessionEndpoint` in
front of the engine, `run_session`. Nothing is trained and nothing is recorded in the state file but the event; the
engine is a child of this command, stopped at its end. Any `[agent] harness` a recipe takes is accepted; a bad one
is refused in one line naming the fix before the engine starts.

What is written to the output folder (`.rl360/tries/<time>-<task>/` beside the state file, or `--out`):
`session.log` (the session's log lines), `trajectory.jsonl` (each segment as the report's trajectories page shows
it), `traceback.txt` (a harness that raised), `agent/<file>` (an installed agent's own files), `engine.log`.

Test: tests/cli/test_agents_try.py (the docs' example harness on an arith task in a real process sandbox).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from rl360cli.agent.config import AgentConfig
from rl360cli.agent.endpoint import SessionEndpoint
from rl360cli.agent.harnesses import harness_factory, python_harness
from rl360cli.agent.installed import check_installed, installed_agent, layer_root, with_agent
from rl360cli.agent.session import SessionSpec, run_session, session_options
from rl360cli.egress.client import node_name
from rl360cli.errors import Rl360Error
from rl360cli.inference.client import EngineClient
from rl360cli.inference.launch import engine_command, health_url, http_url
from rl360cli.inference.tokenizer import load_tokenizer
from rl360cli.loop.samples import kept_rows
from rl360cli.outcome import InfraCause, Outcome
from rl360cli.ports import free_port
from rl360cli.rl.trajectory import Trajectory
from rl360cli.run.policy import prepare_policy
from rl360cli.sandbox.config import WarmPoolConfig
from rl360cli.sandbox.providers import make_provider
from rl360cli.sandbox.task import Task
from rl360cli.sandbox.task_loader import load_task
from rl360cli.stages import egress
from rl360cli.stages.base import Context
from rl360cli.state import queries

NAME = "agents"
# How long the engine may take to load the policy (SmolLM2's GGUF dequantised on a busy machine: ~1 min).
ENGINE_START_TIMEOUT_S = 600.0
# The model name the session answers to, as a run's actors name it (the policy folder's name).
POLICY = "policy-v0"
# The session log's line for an installed agent that exited non-zero (agent/installed.py).
EXITED_BADLY = re.compile(r"^installed:\S+ exited [1-9]")


@dataclass(frozen=True, kw_only=True, slots=True)
class TryResult:
    """One session of `agents try`, as a step would count it."""

    harness: str
    task: str
    outcome: Outcome
    cause: InfraCause | None
    reward: float | None
    # Requests the harness made to the model, and the segments its record has (more than one: a tito break).
    turns: int
    segments: int
    tito_breaks: int
    format_errors: int
    detail: str | None
    # The harness's last error line: its traceback's last line, or the last log line of an installed agent.
    last_error: str | None
    # The conversation as the model saw it, per segment: the decoded tokens, prompt and replies.
    conversation: tuple[str, ...]
    seconds: float
    out_dir: Path
    files: tuple[Path, ...]

    @property
    def masked(self) -> bool:
        return self.outcome is Outcome.INFRA_FAILURE

    def fix(self) -> str:
        """What to do about a masked session (one line)."""
        where = self.out_dir
        match self.cause:
            case InfraCause.HARNESS_ERROR if (where / "traceback.txt").is_file():
                return f"fix the harness: its traceback is {where / 'traceback.txt'}"
            case InfraCause.HARNESS_ERROR if (where / "agent").is_dir():
                return f"read the agent's own log in {where / 'agent'} and {where / 'session.log'}"
            case InfraCause.HARNESS_ERROR:
                return f"make the harness ask the model (session.base_url) before it returns; {where / 'session.log'}"
            case InfraCause.HARNESS_TIMEOUT:
                return "make the harness return sooner, or raise --set agent.harness_timeout_s"
            case InfraCause.ENGINE_ERROR:
                return f"the engine failed a request: {where / 'engine.log'}"
            case InfraCause.PROMPT_TOO_LONG:
                return "shorten the harness's first prompt, or raise --set rollout.max_total_tokens"
            case InfraCause.NO_REPLY_IN_BUDGET:
                return "raise --set agent.timeout_multiplier (the task's agent budget is for a fast model)"
        return f"see {where / 'session.log'}"

    def to_dict(self) -> dict:
        return {"harness": self.harness, "task": self.task, "outcome": self.outcome.value,
                "cause": self.cause.value if self.cause else None, "reward": self.reward, "turns": self.turns,
                "segments": self.segments, "tito_breaks": self.tito_breaks, "format_errors": self.format_errors,
                "detail": self.detail, "last_error": self.last_error, "seconds": round(self.seconds, 1),
                "out_dir": str(self.out_dir), "files": [str(f) for f in self.files],
                "fix": self.fix() if self.masked else None}


def agent_of(ctx: Context, harness: str) -> AgentConfig:
    """The recipe's `[agent]` with `harness` in it; a harness no recipe could name, or a python harness that does not
    import (from this folder, as `rl360 up`'s actors import it), is refused in one line."""
    try:
        agent = dataclasses.replace(ctx.need_recipe().agent, harness=harness)
    except ValueError as e:
        raise Rl360Error(str(e).split("; ")[0],
                         "name bash, mini-swe-agent, terminus-2, installed:<name> or python:module:function") from None
    if harness.startswith("python:"):
        # The actors of `rl360 up` run in its folder, which is on their sys.path: so is it here.
        if os.getcwd() not in sys.path and "" not in sys.path:
            sys.path.insert(0, os.getcwd())
        python_harness(harness)
    # An installed agent's settings, and a recipe whose sandboxes could not run it, refused as `rl360 plan` does.
    check_installed(agent, provider=ctx.need_recipe().sandbox.provider, egress_mode=ctx.profile.egress.mode,
                    ca_bundle=ctx.profile.egress.ca_bundle)
    harness_factory(agent, ctx.need_recipe().rollout, exec_timeout_s=30.0)  # terminus-2's interpreter, refused here
    return agent


def try_harness(ctx: Context, *, harness: str, task_path: Path, out_dir: Path | None = None) -> TryResult:
    """One session of `harness` on the task at `task_path` (see the module docstring)."""
    recipe = ctx.need_recipe()
    agent = agent_of(ctx, harness)
    task = load_task(task_path)
    installed = installed_agent(agent)
    if installed is not None:
        task = with_agent(task, installed, layers=layer_root(), ca_bundle=ctx.profile.egress.ca_bundle)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = (out_dir or ctx.state.home / "tries" / f"{stamp}-{task.id}").absolute()
    out.mkdir(parents=True, exist_ok=True)
    ctx.say(f"policy v0: preparing ({recipe.model.kind})")
    policy = prepare_policy(recipe.model, tasks_dir=Path(recipe.tasks.path), out_dir=out / POLICY,
                            seed=recipe.policy_seed)
    began = time.monotonic()
    proxy = (egress.for_one_command(ctx, command="rl360 agents try")
             if egress.applies(ctx) and recipe.sandbox.provider != "daytona" else contextlib.nullcontext())
    with _engine(ctx, policy, log=out / "engine.log") as url, proxy:
        ctx.say(f"{harness} on {task.id} ({recipe.sandbox.provider} sandbox)")
        log_lines: list[str] = []

        def log(line: str) -> None:
            log_lines.append(line)
            ctx.say(f"[session] {line}")

        trajectories = asyncio.run(_session(ctx, agent, task, policy=policy, engine_url=url, run_id=f"try-{stamp}",
                                            installed=installed is not None, log=log))
        (out / "session.log").write_text("".join(f"{line}\n" for line in log_lines))
    ctx.event(NAME, "try", f"{harness} on {task.id}", outcome=trajectories[0].outcome.value,
              cause=trajectories[0].cause.value if trajectories[0].cause else None)
    return _result(harness, task, trajectories, tokenizer=load_tokenizer(policy), out=out,
                   seconds=time.monotonic() - began, log_lines=log_lines)


async def _session(ctx: Context, agent: AgentConfig, task: Task, *, policy: Path, engine_url: str, run_id: str,
                   installed: bool, log) -> list[Trajectory]:
    """The session, as a run's session actor runs it (rl360cli/rollout/session_actor.py)."""
    recipe = ctx.need_recipe()
    rollout = recipe.rollout
    # One sandbox for one session: a warm pool would start containers nobody takes.
    sandbox = dataclasses.replace(recipe.sandbox, warm_pool=WarmPoolConfig(size=0))
    route = dataclasses.replace(egress.route(ctx).on_node(node_name()), door=installed)
    provider = make_provider(sandbox, nodes=ctx.profile.nodes, run_id=run_id,
                             node_images=queries.image_digests(ctx.state.read()), registry=ctx.profile.registry,
                             egress=route)
    client = EngineClient(engine_url)
    endpoint = SessionEndpoint(tokenizer=load_tokenizer(policy), client=client)
    try:
        await endpoint.start()
        new_harness = harness_factory(agent, rollout, exec_timeout_s=sandbox.exec_timeout_s)
        return await run_session(
            SessionSpec(task_id=task.id, group_id=f"{run_id}-{task.id}", sample_index=0, attempt_id=f"{run_id}-0"),
            task, endpoint=endpoint, harness=new_harness(), options=session_options(agent, rollout, model=POLICY),
            agent=agent, rollout=rollout, provider=provider, exec_timeout_s=sandbox.exec_timeout_s,
            labels={"rl360.run": run_id, "rl360.task": task.id, "rl360.attempt": f"{run_id}-0"}, log=log)
    finally:
        await endpoint.close()
        await client.close()
        await provider.close()


@contextlib.contextmanager
def _engine(ctx: Context, policy: Path, *, log: Path) -> Iterator[str]:
    """rl360's CPU engine serving `policy` on a free loopback port, a child of this command; its URL."""
    recipe = ctx.need_recipe()
    engine = dataclasses.replace(recipe.engine, kind="local", device="cpu")
    port = free_port()
    command = engine_command(engine, model_path=str(policy), host="127.0.0.1", port=port, python=sys.executable,
                             dtype=recipe.model.dtype, seed=recipe.run.seed)
    ctx.say(f"engine: starting on 127.0.0.1:{port} (log {log})")
    with open(log, "wb") as sink:
        proc = subprocess.Popen(list(command.argv), env={**os.environ, **command.env}, stdout=sink,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        _wait_healthy(proc, health_url("127.0.0.1", port), log=log)
        yield http_url("127.0.0.1", port)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _wait_healthy(proc: subprocess.Popen, url: str, *, log: Path) -> None:
    deadline = time.monotonic() + ENGINE_START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            last = (log.read_text(errors="replace").strip().splitlines() or ["no output"])[-1]
            raise Rl360Error(f"the engine exited {proc.returncode} as it started: {last[:200]}",
                             f"read {log} (the recipe's [model] must load on the CPU)")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except (urllib.error.URLError, OSError):
            time.sleep(0.3)
    raise Rl360Error(f"the engine did not answer {url} within {ENGINE_START_TIMEOUT_S:g}s", f"read {log}")


def _result(harness: str, task: Task, trajectories: list[Trajectory], *, tokenizer, out: Path, seconds: float,
            log_lines: list[str]) -> TryResult:
    """The session's outcome, and its files written to `out`."""
    first = trajectories[0]
    meta = first.metadata
    session = meta.get("session") or {}
    files = [out / "session.log"]
    rows = kept_rows(0, trajectories, decode=lambda ids: tokenizer.decode(ids), seed=0, max_chars=1 << 20)
    (out / "trajectory.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    files.append(out / "trajectory.jsonl")
    last_error = None
    if meta.get("traceback"):
        (out / "traceback.txt").write_text(meta["traceback"])
        files.append(out / "traceback.txt")
        last_error = meta["traceback"].strip().splitlines()[-1]
    # An installed agent that failed (it exited non-zero, or the session was masked): its own log's last error.
    failed = first.outcome is Outcome.INFRA_FAILURE or any(EXITED_BADLY.search(line) for line in log_lines)
    for name, text in (meta.get("agent_files") or {}).items():
        (out / "agent").mkdir(exist_ok=True)
        (out / "agent" / name).write_text(text)
        files.append(out / "agent" / name)
        errors = [line for line in text.splitlines() if "error" in line.lower()] if failed else []
        last_error = last_error or (errors[-1].strip()[:300] if errors else None)
    if last_error is None and first.outcome is Outcome.INFRA_FAILURE and log_lines:
        last_error = log_lines[-1]
    files.append(out / "engine.log")
    conversation = tuple("".join(span["text"] for span in row["spans"]) for row in rows)
    return TryResult(harness=harness, task=task.id, outcome=first.outcome, cause=first.cause, reward=first.reward,
                     turns=int(session.get("turns", 0)), segments=len([t for t in trajectories if len(t.token_ids)]),
                     tito_breaks=int(session.get("tito_breaks", 0)), format_errors=int(session.get("format_errors", 0)),
                     detail=meta.get("detail"), last_error=last_error, conversation=conversation, seconds=seconds,
                     out_dir=out, files=tuple(files))
