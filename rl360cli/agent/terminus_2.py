"""Harbor's Terminus-2, unchanged, as an rl360 harness (`[agent] harness = "terminus-2"`).

Terminus-2 is Harbor's own agent: it runs outside the sandbox and drives a tmux session inside it through
Harbor's environment interface. Here it is the `harbor` package itself (pinned in cluster/dev/bootstrap.sh,
installed into `.venv-harbor/` from an interpreter already on the machine, since harbor needs Python 3.12 and
rl360 runs on 3.11). For each session the actor:

1. starts the sandbox's tmux server as a long-lived exec (`tmux -D`), so the session Terminus-2 starts with
   `tmux new-session -d` outlives the exec that made it (a process sandbox ends every process a command
   started when that command ends; the persistent shell, rl360cli/sandbox/shell.py, lives the same way);
2. serves the sandbox handle on a unix socket (harbor_bridge.py);
3. runs harbor_runner.py with harbor's interpreter: Terminus-2 with its model pointed at the session's URL
   through litellm's `openai/` provider, its environment calling back over the socket;
4. when it ends, ends the tmux server (with all it started, as the persistent shell ends before the verifier).

rl360 sets only what a rollout needs: Terminus-2's turn limit (`[rollout] max_turns`), the sampling
temperature, the context size litellm is told (`[rollout] max_total_tokens`, `max_new_tokens`), no asciinema
recording (it would install asciinema in the sandbox) and no summarization (it rewrites the history: each
summary would start a new segment). Anything of Terminus-2's own options is yours in `[agent.harness_config]`
(`parser_name = "xml"`, `enable_summarize = true`, ...), and `harbor_python` names another interpreter.

A reply Terminus-2 cannot use (unparsable, or cut at `[rollout] max_new_tokens` before it was whole) is the
model's: Terminus-2 tells the model and goes on, and each one counts as a format error of the session.
Terminus-2 raising is the harness's (`harness_error`, its traceback kept), unless
the session endpoint had refused a request past the token or turn budget (the model's) or the engine failed
one (`engine_error`): rl360cli/agent/session.py decides.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rl360cli.agent.config import AgentConfig, RolloutConfig
from rl360cli.agent.harbor_bridge import SandboxBridge
from rl360cli.agent.harness import AsyncSandbox, Session
from rl360cli.agent.installed import MAX_FILE_CHARS
from rl360cli.errors import Rl360Error

# The harbor release rl360 runs (cluster/dev/bootstrap.sh installs it); harbor_runner.py reports the one it ran.
HARBOR_VERSION = "0.26.0"
RUNNER = Path(__file__).with_name("harbor_runner.py")
# Where the bootstrap makes harbor's environment: beside rl360's own checkout.
DEFAULT_HARBOR_PYTHON = Path(__file__).resolve().parents[2] / ".venv-harbor" / "bin" / "python"
# The tmux server's exec never times out while the agent works; it is cancelled when Terminus-2 ends.
TMUX_LIFETIME_S = 7 * 24 * 3600.0
# How long the tmux server may take to make its socket (seconds), and how often that is looked for.
TMUX_START_S = 30.0
TMUX_POLL_S = 0.05
TMUX_SOCKET = '"${TMUX_TMPDIR:-/tmp}/tmux-$(id -u)/default"'
# Characters of the runner's own output kept in an error that names it.
LOG_TAIL_CHARS = 3000


def harbor_python(agent: AgentConfig) -> str:
    """The interpreter with harbor installed: `[agent.harness_config] harbor_python`, `RL360_HARBOR_PYTHON`,
    or the bootstrap's `.venv-harbor/`; `Rl360Error` naming the fix when it is not there."""
    python = str(agent.harness_config.get("harbor_python") or os.environ.get("RL360_HARBOR_PYTHON")
                 or DEFAULT_HARBOR_PYTHON)
    if not os.access(python, os.X_OK):
        raise Rl360Error(f"[agent] harness \"terminus-2\": no harbor interpreter at {python}",
                         f"run `bash cluster/dev/bootstrap.sh harbor` (harbor=={HARBOR_VERSION} into .venv-harbor/ "
                         "from Python 3.12), or set [agent.harness_config] harbor_python")
    return python


def terminus_options(agent: AgentConfig, rollout: RolloutConfig) -> dict[str, Any]:
    """Terminus-2's keyword arguments: rl360's rollout settings, then the recipe's own (see the docstring)."""
    options: dict[str, Any] = {
        "max_turns": rollout.max_turns, "temperature": rollout.temperature, "enable_summarize": False,
        "record_terminal_session": False, "suppress_max_turns_warning": True,
        # Its chat, returned whole, is where the replies it could not use are counted (harbor_runner.py).
        "store_all_messages": True,
        # litellm knows no "openai/<name>" of ours: its size, and no price.
        "model_info": {"max_input_tokens": rollout.max_total_tokens, "max_output_tokens": rollout.max_new_tokens,
                       "input_cost_per_token": 0.0, "output_cost_per_token": 0.0}}
    options.update({k: v for k, v in agent.harness_config.items() if k != "harbor_python"})
    return options


class Terminus2Failed(RuntimeError):
    """Terminus-2 raised (its own exception's type and words; the traceback is harbor's, from the runner)."""


class Terminus2Harness:
    """One session's Terminus-2 (an async harness; see the module docstring). `format_errors`: the replies
    Terminus-2 could not use, which session.py adds to the session's count."""

    def __init__(self, *, agent: AgentConfig, rollout: RolloutConfig, exec_timeout_s: float):
        self.python = harbor_python(agent)
        self.options = terminus_options(agent, rollout)
        self.exec_timeout_s = exec_timeout_s
        self.format_errors = 0

    async def __call__(self, session: Session) -> None:
        folder = Path(tempfile.mkdtemp(prefix="rl360-t2-"))
        bridge = SandboxBridge(session.async_sandbox, folder, default_timeout_s=self.exec_timeout_s)
        tmux = None
        try:
            made = await session.async_sandbox.exec("mkdir -p /logs/agent", timeout_s=30)
            if made.exit_code != 0:
                raise RuntimeError(f"cannot make /logs/agent in the sandbox: {made.output.strip()[-200:]}")
            tmux = await start_tmux_server(session.async_sandbox, session.log)
            await bridge.start()
            outcome = await self._run_runner(session, folder, bridge)
        finally:
            await bridge.close()
            if tmux is not None:
                tmux.cancel()  # the provider ends the exec and everything it started
                with contextlib.suppress(BaseException):
                    await tmux
            keep_trajectory(session, folder)
            shutil.rmtree(folder, ignore_errors=True)
        self.format_errors += outcome.get("unusable_replies", 0)
        session.log(f"terminus-2 (harbor {outcome.get('harbor_version')}) ended after {outcome.get('episodes')} "
                    f"episodes, {outcome.get('unusable_replies', 0)} replies it could not use, "
                    f"{bridge.num_calls} sandbox calls"
                    + (f": {outcome['error_type']}" if "error_type" in outcome else ""))
        if "error_type" in outcome:
            if bridge.failure is not None:  # the sandbox broke under it: that, not harbor's report of it
                raise bridge.failure
            raise Terminus2Failed(f"Terminus-2 raised {outcome['error_type']}: {outcome['error'][:500]}") \
                from Terminus2Failed(outcome.get("traceback", ""))

    async def _run_runner(self, session: Session, folder: Path, bridge: SandboxBridge) -> dict[str, Any]:
        """harbor_runner.py with harbor's interpreter, to its end; its outcome (see harbor_runner.py)."""
        config = {"trial_dir": str(folder / "trial"), "task_id": session.task.id,
                  "session_id": f"{session.task.id}__rl360", "model": session.model, "base_url": session.base_url,
                  "api_key": session.api_key, "instruction": session.task.instruction, "options": self.options}
        (folder / "config.json").write_text(json.dumps(config))
        result, log = folder / "result.json", folder / "runner.log"
        # Harbor's interpreter with nothing of rl360's environment that would point it at 3.11's packages;
        # litellm reads its model map from the package instead of fetching it.
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
        env.update(LITELLM_LOCAL_MODEL_COST_MAP="True", OPENAI_API_KEY=session.api_key,
                   OPENAI_BASE_URL=session.base_url, PYTHONUNBUFFERED="1")
        with log.open("wb") as out:
            proc = await asyncio.create_subprocess_exec(
                self.python, str(RUNNER), "--socket", bridge.path, "--config", str(folder / "config.json"),
                "--result", str(result), stdin=asyncio.subprocess.DEVNULL, stdout=out, stderr=out, env=env,
                cwd=folder, start_new_session=True)
            try:
                code = await proc.wait()
            except BaseException:  # cancelled (the harness's deadline, the session's): Terminus-2 ends too
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, 9)
                await proc.wait()
                raise
        if code != 0 or not result.exists():
            tail = log.read_text(errors="replace")[-LOG_TAIL_CHARS:]
            raise RuntimeError(f"harbor's runner exited {code} without an outcome ({self.python}):\n{tail}")
        return json.loads(result.read_text())


def keep_trajectory(session: Session, folder: Path) -> None:
    """Terminus-2's own trajectory file (ATIF, in its logs folder: `trajectory.json`, and `trajectory.cont-N.json`
    after a summary) kept with the session's record, as an installed agent's files are (its end, where long)."""
    for path in sorted((folder / "trial" / "agent").glob("trajectory*.json")):
        with contextlib.suppress(OSError):
            session.keep_file(path.name, path.read_text(errors="replace")[-MAX_FILE_CHARS:])


async def start_tmux_server(sandbox: AsyncSandbox, log: Callable[[str], None]) -> asyncio.Future | None:
    """The sandbox's tmux server as a long-lived exec, once its socket is up; None where the sandbox has no
    tmux (Terminus-2 then installs it itself, as under Harbor, where the sandbox can) or one without `-D`
    (before 3.2: Terminus-2's `new-session -d` daemon serves, which lasts in a container, not a process
    sandbox). Cancelling the future ends the server and every session and process in it."""
    if (await sandbox.exec("command -v tmux", timeout_s=30)).exit_code != 0:
        log("terminus-2: the sandbox has no tmux; Terminus-2 will try to install it")
        return None
    server = asyncio.ensure_future(sandbox.exec("exec tmux -D", timeout_s=TMUX_LIFETIME_S))
    loop = asyncio.get_running_loop()
    deadline = loop.time() + TMUX_START_S
    while not server.done() and loop.time() < deadline:
        if (await sandbox.exec(f"test -S {TMUX_SOCKET}", timeout_s=30)).exit_code == 0:
            return server
        await asyncio.sleep(TMUX_POLL_S)
    if server.done():  # a tmux before 3.2 has no -D: its own daemon then serves (it lasts in a container)
        ended = server.exception() or server.result().output.strip()[-200:]
        log(f"terminus-2: the sandbox's tmux server did not stay up ({ended}); Terminus-2's own starts instead")
        return None
    server.cancel()
    raise RuntimeError(f"the sandbox's tmux server made no socket in {TMUX_START_S:g}s")
