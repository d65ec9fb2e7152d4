"""Harbor's Terminus-2, unchanged (`[agent] harness = "terminus-2"`): one session on an example task with the real
`harbor` package in its own Python 3.12 environment (.venv-harbor/, cluster/dev/bootstrap.sh harbor), its tmux
session in a real process sandbox, and rl360's real CPU engine (a random tiny Llama) behind the session endpoint.

The tiny model's replies are noise, so Terminus-2 cannot parse them: what is checked is the pipeline. The
session ran and the verifier scored it (reward 0, the model's: no infra failure); each of Terminus-2's turns is
in the session's record with the engine's own tokens (a recording pass-through in front of the engine keeps
what it generated); its prompt shows the tmux pane it read in the sandbox; the replies it could not parse came
back to the model as Terminus-2's own error message and count as format errors.

Beside it, without harbor: the bridge's calls on a real process sandbox (exec with its exit code, working folder,
variables and timeout; upload; download; a bad request), and the tmux server that keeps Terminus-2's session
alive between execs; and the refusals when harbor's interpreter is missing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request

import aiohttp
import pytest
from aiohttp import web
from transformers import AutoTokenizer

from rl360cli.agent.config import AgentConfig, RolloutConfig
from rl360cli.agent.harnesses import harness_factory
from rl360cli.agent.harbor_bridge import SandboxBridge
from rl360cli.agent.harness import AsyncSandbox
from rl360cli.agent.terminus_2 import DEFAULT_HARBOR_PYTHON, start_tmux_server, terminus_options
from rl360cli.errors import Rl360Error
from rl360cli.outcome import InfraCause, Outcome
from rl360cli.ports import free_port
from rl360cli.sandbox.task_loader import load_task
from tests.agent.endpoint_standin import ServedEndpoint
from tests.agent.sessions import EXAMPLES, attempt
from tests.conftest import REPO, need, run_cli

# Terminus-2's prompt is ~3k characters, about as many tokens of the tiny model's 320-token vocabulary.
ROLLOUT = RolloutConfig(max_turns=2, max_new_tokens=24, max_total_tokens=7000, temperature=1.0)


class RecordingEngine:
    """A pass-through in front of the engine's `/generate` that keeps each answer's `output_ids`."""

    def __init__(self, url: str):
        self.url = url
        self.outputs: list[list[int]] = []
        self.inputs: list[list[int]] = []

    async def start(self) -> str:
        self._session = aiohttp.ClientSession()
        app = web.Application(client_max_size=1 << 26)
        app.add_routes([web.post("/generate", self._generate), web.get("/health", self._health)])
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        return f"http://127.0.0.1:{self._runner.addresses[0][1]}"

    async def close(self) -> None:
        await self._runner.cleanup()
        await self._session.close()

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def _generate(self, request: web.Request) -> web.Response:
        body = await request.json()
        async with self._session.post(f"{self.url}/generate", json=body) as answer:
            reply = await answer.json()
        self.inputs.append(body["input_ids"])
        self.outputs.append(reply["output_ids"])
        return web.json_response(reply, status=answer.status)


@pytest.fixture(scope="module")
def engine_url(tmp_path_factory):
    """rl360's CPU engine serving a random tiny Llama with room for Terminus-2's prompt."""
    from rl360cli.inference.testing import build_tiny_test_model

    model = build_tiny_test_model(tmp_path_factory.mktemp("models") / "tiny", max_positions=8192)
    port = free_port()
    log = tmp_path_factory.mktemp("logs") / "engine.log"
    proc = subprocess.Popen([sys.executable, "-m", "rl360cli.inference.server", "--model", str(model), "--port",
                             str(port), "--num-threads", "1"], stdout=open(log, "wb"), stderr=subprocess.STDOUT)
    try:
        while True:
            if proc.poll() is not None:
                raise AssertionError(f"the engine did not start:\n{log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                    break
            except (urllib.error.URLError, OSError):
                time.sleep(0.2)
        yield f"http://127.0.0.1:{port}", model
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_terminus_2_drives_tmux_in_the_sandbox_on_the_engines_tokens(engine_url, process_provider):
    need(os.access(DEFAULT_HARBOR_PYTHON, os.X_OK),
         "harbor's environment is not made: bash cluster/dev/bootstrap.sh harbor (or all)")
    url, model = engine_url
    tokenizer = AutoTokenizer.from_pretrained(model)
    served = ServedEndpoint(tokenizer, engine_url=url)
    recorder = RecordingEngine(url)
    try:
        # The endpoint's engine requests go through the recorder (its client connects at the first request).
        served.client.base_url = served.call(recorder.start())
        # Harbor and litellm take seconds to import: more on a busy machine than the task's 60 s agent budget allows.
        agent = AgentConfig(harness="terminus-2", tool_parser="", timeout_multiplier=5)
        harness = harness_factory(agent, ROLLOUT, exec_timeout_s=30.0)()
        [trajectory] = attempt(served, harness, agent=agent, rollout=ROLLOUT, provider=process_provider())
    finally:
        served.call(recorder.close())
        served.close()
    # The model's junk is the model's: scored by the verifier, nothing masked.
    assert trajectory.outcome is not Outcome.INFRA_FAILURE, trajectory.metadata.get("detail")
    assert trajectory.reward == 0.0 and trajectory.metadata["harness"] == "terminus-2"
    # Terminus-2's turns (its max_turns is the recipe's) are the record's, on the engine's tokens.
    assert len(recorder.outputs) == ROLLOUT.max_turns
    mask = trajectory.loss_mask.tolist()
    runs, start = [], None
    for i, bit in enumerate([*mask, 0]):
        if bit and start is None:
            start = i
        elif not bit and start is not None:
            runs.append((start, i))
            start = None
    ids = trajectory.token_ids.tolist()
    assert [ids[a:b] for a, b in runs] == recorder.outputs
    assert [ids[:a] for a, _ in runs] == recorder.inputs
    first = tokenizer.decode(recorder.inputs[0])
    assert "You are an AI assistant tasked with solving command-line tasks" in first  # Terminus-2's own prompt
    assert "hello.txt" in first                                                       # the task's instruction
    # The pane Terminus-2 read through the bridge: the login shell of its tmux session, in the task's workdir.
    assert "Current terminal state:" in first and "/app" in first.split("Current terminal state:")[1]
    # A reply it could not use (unparsable, or cut at max_new_tokens: junk is both) went back to the model as
    # Terminus-2's own message, and counts against the model as a format error.
    last = tokenizer.decode(recorder.inputs[-1])
    feedback = last.count("Previous response had parsing errors") + last.count("ERROR!! NONE of the actions")
    assert feedback >= 1 and trajectory.metadata["session"]["format_errors"] >= feedback
    # Terminus-2's own trajectory file (ATIF) is kept with the session's record: its steps start from the task.
    kept = json.loads(trajectory.metadata["agent_files"]["trajectory.json"])
    assert kept["agent"]["name"] == "terminus-2" and "hello.txt" in json.dumps(kept["steps"])


def runners() -> list[int]:
    """Pids of harbor_runner.py processes on this machine."""
    found = []
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            if b"harbor_runner.py" in open(f"/proc/{name}/cmdline", "rb").read():
                found.append(int(name))
        except OSError:
            continue
    return found


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_terminus_2_past_its_deadline_is_ended_with_its_runner(engine_url, process_provider):
    """`[agent] harness_timeout_s`: Terminus-2's process and its tmux server end with the harness, masked as
    `harness_timeout`; nothing of it is left on the machine."""
    need(os.access(DEFAULT_HARBOR_PYTHON, os.X_OK),
         "harbor's environment is not made: bash cluster/dev/bootstrap.sh harbor (or all)")
    url, model = engine_url
    served = ServedEndpoint(AutoTokenizer.from_pretrained(model), engine_url=url)
    before = set(runners())
    try:
        agent = AgentConfig(harness="terminus-2", tool_parser="", harness_timeout_s=1, timeout_multiplier=5)
        harness = harness_factory(agent, ROLLOUT, exec_timeout_s=30.0)()
        [trajectory] = attempt(served, harness, agent=agent, rollout=ROLLOUT, provider=process_provider())
    finally:
        served.close()
    assert (trajectory.outcome, trajectory.cause) == (Outcome.INFRA_FAILURE, InfraCause.HARNESS_TIMEOUT)
    assert set(runners()) <= before  # the runner was killed with its process group, not left behind


def test_without_harbors_interpreter_the_harness_is_refused_in_one_line(tmp_path):
    agent = AgentConfig(harness="terminus-2", harness_config={"harbor_python": str(tmp_path / "python")})
    with pytest.raises(Rl360Error) as refused:
        harness_factory(agent, ROLLOUT, exec_timeout_s=30.0)
    assert "bootstrap.sh harbor" in refused.value.fix and "\n" not in str(refused.value)


def test_plan_refuses_terminus_2_without_harbors_interpreter_before_anything_starts(state_path, tmp_path):
    planned = run_cli("plan", "--recipe", str(REPO / "recipes" / "terminus-2-local.toml"), "--set",
                      f"agent.harness_config.harbor_python={tmp_path / 'python'}", state=state_path, cwd=tmp_path)
    assert planned.returncode == 1 and "no harbor interpreter" in planned.stderr, planned.stderr
    assert "bootstrap.sh harbor" in planned.stderr and not state_path.exists()


def test_terminus_2_options_are_the_rollouts_and_the_recipes():
    agent = AgentConfig(harness="terminus-2", harness_config={"parser_name": "xml", "harbor_python": "/x"})
    options = terminus_options(agent, ROLLOUT)
    assert options["max_turns"] == 2 and options["parser_name"] == "xml" and "harbor_python" not in options
    assert options["enable_summarize"] is False and options["model_info"]["max_input_tokens"] == 7000
    json.dumps(options)  # it travels to harbor's interpreter as JSON


async def ask(bridge: SandboxBridge, request: dict) -> dict:
    """One call as harbor_runner.py's BridgeEnvironment makes it: a connection, a JSON line each way."""
    reader, writer = await asyncio.open_unix_connection(bridge.path)
    writer.write(json.dumps(request).encode() + b"\n")
    await writer.drain()
    reply = json.loads(await reader.readline())
    writer.close()
    return reply


def test_the_bridge_maps_harbors_calls_onto_a_process_sandbox(process_provider, tmp_path):
    provider = process_provider()
    (tmp_path / "note.txt").write_text("from the host\n")

    async def go():
        sandbox = await provider.start(load_task(EXAMPLES / "hello-world"), attempt_id="a-bridge", labels={})
        bridge = SandboxBridge(AsyncSandbox(sandbox, default_timeout_s=30), tmp_path, default_timeout_s=30)
        await bridge.start()
        try:
            ran = await ask(bridge, {"op": "exec", "command": "pwd; echo $GREETING; exit 3", "cwd": "/tmp",
                                     "env": {"GREETING": "hi"}, "timeout_s": None})
            timed_out = await ask(bridge, {"op": "exec", "command": "sleep 30", "timeout_s": 1})
            assert await ask(bridge, {"op": "upload", "source": str(tmp_path / "note.txt"),
                                      "target": "/app/note.txt"}) == {}
            seen = await ask(bridge, {"op": "exec", "command": "cat /app/note.txt && echo more >> /app/note.txt"})
            assert await ask(bridge, {"op": "download", "source": "/app/note.txt",
                                      "target": str(tmp_path / "back.txt")}) == {}
            unknown = await ask(bridge, {"op": "rm"})
        finally:
            await bridge.close()
            await sandbox.stop()
            await provider.close()
        return ran, timed_out, seen, unknown, bridge

    ran, timed_out, seen, unknown, bridge = asyncio.run(go())
    assert ran == {"return_code": 3, "output": "/tmp\nhi\n"}
    assert timed_out["return_code"] == 124
    assert seen == {"return_code": 0, "output": "from the host\n"}
    assert (tmp_path / "back.txt").read_text() == "from the host\nmore\n"
    assert "unknown bridge request 'rm'" in unknown["error"] and isinstance(bridge.failure, ValueError)


def test_a_tmux_session_outlives_the_exec_that_made_it_while_the_server_runs(process_provider, tmp_path):
    """Terminus-2 starts its session with `tmux new-session -d` in one exec and drives it from the next ones: in a
    process sandbox that ends every process of an exec with it, the server has to be the long-lived exec."""
    provider = process_provider()

    async def go():
        sandbox = await provider.start(load_task(EXAMPLES / "hello-world"), attempt_id="a-tmux", labels={})
        view = AsyncSandbox(sandbox, default_timeout_s=30)
        try:
            server = await start_tmux_server(view, print)
            assert server is not None
            await view.exec("tmux new-session -d -s t 'bash --login'", timeout_s=30)
            # As Terminus-2 waits for a command: the pane's shell signals a channel the next exec waits on.
            await view.exec("tmux send-keys -t t 'echo $((6 * 7)) > /app/answer; tmux wait -S done' Enter",
                            timeout_s=30)
            alive = await view.exec("tmux wait done && tmux has-session -t t && cat /app/answer", timeout_s=60)
            server.cancel()
            with contextlib.suppress(BaseException):
                await server
            gone = await view.exec("tmux has-session -t t", timeout_s=30)
        finally:
            await sandbox.stop()
            await provider.close()
        return alive, gone

    alive, gone = asyncio.run(go())
    assert (alive.exit_code, alive.output.strip()) == (0, "42")
    assert gone.exit_code != 0
