"""Installed agents (rl360cli/agent/installed.py): the presets and the image layer their install makes, then a real
one, mini-swe-agent from PyPI, installed in a docker sandbox's image through the egress proxy (once per node) and
run inside the sandbox against the session endpoint on rl360's CPU engine, through the session's door. Its turns
are in the session's record with the engine's tokens, and its own log and trajectory are kept with it."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from rl360cli.agent.config import INSTALLED_AGENTS, AgentConfig, RolloutConfig
from rl360cli.agent.installed import (BUILD_CA, INSTALL_TIMEOUT_S, PINNED, InstalledAgent, InstalledHarness,
                                      check_installed, installed_agent, layer_dockerfile, with_agent)
from rl360cli.agent.session import SessionSpec, run_session, session_options
from rl360cli.errors import Rl360Error
from rl360cli.outcome import Outcome
from rl360cli.ports import free_port
from rl360cli.sandbox.config import WarmPoolConfig
from rl360cli.sandbox.task_loader import load_task
from tests.agent.endpoint_standin import ServedEndpoint
from tests.conftest import REPO
from tests.egress.conftest import proxy_of  # noqa: F401 - the real egress proxy
from rl360cli.egress.config import EgressConfig
from tests.sandbox.conftest import docker_node_specs, docker_provider, run, write_task  # noqa: F401

PYTHON_SLIM = "127.0.0.1:5000/hub/library/python:3.11-slim"  # the dev registry's stand-in (images/standin/)


def test_each_preset_is_pinned_and_speaks_its_dialect():
    dialects = {"claude-code": "messages", "codex": "responses", "mini-swe-agent": "chat completions",
                "terminus-cli": "chat completions"}
    assert set(dialects) == set(PINNED) == set(INSTALLED_AGENTS)
    for name, dialect in dialects.items():
        agent = installed_agent(AgentConfig(harness=f"installed:{name}"))
        assert agent.dialect == dialect and agent.version == PINNED[name]
        assert any(f"{agent.package}=={agent.version}" in line or f"{agent.package}@{agent.version}" in line
                   for line in agent.install), agent.install
        assert "{flags}" not in agent.run and all(f.startswith("/logs/agent/") for f in agent.files)
    assert installed_agent(AgentConfig(harness="bash")) is None
    # Codex exits 1 before any request when its CODEX_HOME does not exist ("Error finding codex home"): the preset
    # makes it first (every session of codex-local was masked harness_error before, 2026-12-07).
    codex = installed_agent(AgentConfig(harness="installed:codex"))
    assert codex.env["CODEX_HOME"].startswith("/logs/agent/")
    assert codex.run.index('mkdir -p "$CODEX_HOME" &&') < codex.run.index("codex exec")


def test_the_recipe_sets_version_flags_and_env_as_the_agents_users_do():
    agent = installed_agent(AgentConfig(harness="installed:claude-code", harness_config={
        "version": "2.0.1", "flags": "--append-system-prompt 'Be brief.'", "env": {"MAX_THINKING_TOKENS": 0}}))
    assert any("@anthropic-ai/claude-code@2.0.1" in line for line in agent.install)
    assert "--append-system-prompt 'Be brief.' --print" in agent.run and agent.env["MAX_THINKING_TOKENS"] == "0"
    with pytest.raises(Rl360Error, match="no setting of an installed agent"):
        installed_agent(AgentConfig(harness="installed:codex", harness_config={"model": "x"}))
    with pytest.raises(ValueError, match="installed:<name>.*claude-code, codex, mini-swe-agent, terminus-cli"):
        AgentConfig(harness="installed:aider")


def test_the_install_is_one_layer_over_the_tasks_image_its_user_kept(tmp_path):
    agent = installed_agent(AgentConfig(harness="installed:mini-swe-agent"))
    task = load_task(write_task(tmp_path, "built", dockerfile="FROM busybox\nCOPY data.txt /data.txt\nUSER 1000\n",
                                files={"environment/data.txt": "x"}))
    text = layer_dockerfile(task, agent)
    assert text.startswith("FROM busybox\nCOPY data.txt /data.txt\nUSER 1000\n")
    assert text.rstrip().endswith("USER 1000") and "\nUSER root\nRUN set -e; mkdir -p /logs/agent; " in text
    layered = with_agent(task, agent, layers=tmp_path / "layers")
    assert (layered.dockerfile.parent / "data.txt").read_text() == "x"  # its COPY sources beside it
    assert layered.image_ref != task.image_ref and layered.tests_dir == task.tests_dir
    assert with_agent(task, agent, layers=tmp_path / "layers") == layered  # the same layer: the same image
    assert layered.build_timeout_s == task.build_timeout_s + INSTALL_TIMEOUT_S  # the install's time on top
    prebuilt = load_task(write_task(tmp_path, "prebuilt", image=PYTHON_SLIM))
    assert layer_dockerfile(prebuilt, agent).startswith(f"FROM {PYTHON_SLIM}\n")


# A CA bundle as `[egress] ca_bundle` names one (its text is not parsed: only the PEM markers are looked for).
FAKE_CA = "-----BEGIN CERTIFICATE-----\nrl360-test-way-out-ca\n-----END CERTIFICATE-----\n"


def test_the_profiles_ca_bundle_is_a_new_layer_and_is_refused_in_one_line_when_it_is_no_pem_file(tmp_path):
    agent = installed_agent(AgentConfig(harness="installed:codex"))
    task = load_task(write_task(tmp_path, "prebuilt", image=PYTHON_SLIM))
    bundle = tmp_path / "ca.pem"
    bundle.write_text(FAKE_CA)
    plain = with_agent(task, agent, layers=tmp_path / "layers")
    trusted = with_agent(task, agent, layers=tmp_path / "layers", ca_bundle=str(bundle))
    assert BUILD_CA not in plain.dockerfile.read_text() and not (plain.dockerfile.parent / BUILD_CA).exists()
    assert (trusted.dockerfile.parent / BUILD_CA).read_text() == FAKE_CA and trusted.image_ref != plain.image_ref
    bundle.write_text(FAKE_CA.replace("rl360", "other"))  # another CA: another layer, never the old one's image
    assert with_agent(task, agent, layers=tmp_path / "layers", ca_bundle=str(bundle)).image_ref != trusted.image_ref
    with pytest.raises(ValueError, match="ca_bundle: 'ca.pem' must be an absolute path"):
        EgressConfig(mode="allow", ca_bundle="ca.pem")
    with pytest.raises(Rl360Error, match="cannot be read on this node") as missing:
        check_installed(AgentConfig(harness="installed:codex"), provider="docker", egress_mode="allow",
                        ca_bundle=str(tmp_path / "none.pem"))
    assert "name a PEM file that exists on every node" in missing.value.fix
    (tmp_path / "empty.pem").write_text("not a certificate\n")
    with pytest.raises(Rl360Error, match="holds no PEM certificate"):
        with_agent(task, agent, layers=tmp_path / "layers", ca_bundle=str(tmp_path / "empty.pem"))


def test_npm_keeps_the_bundle_the_layer_trusts_and_takes_the_images_store_without_one():
    line = next(c for c in installed_agent(AgentConfig(harness="installed:claude-code")).install
                if "NODE_EXTRA_CA_CERTS" in c)
    script = f"{line.replace('/etc/ssl/certs/ca-certificates.crt', '/dev/null')}; echo \"$NODE_EXTRA_CA_CERTS\""
    kept = subprocess.run(["sh", "-c", script], env={"NODE_EXTRA_CA_CERTS": "/tmp/x.pem"}, capture_output=True,
                          text=True)
    store = subprocess.run(["sh", "-c", script.replace("[ -f /dev/null ]", "[ -e /dev/null ]")], env={},
                           capture_output=True, text=True)
    assert (kept.stdout, store.stdout) == ("/tmp/x.pem\n", "/dev/null\n"), (kept.stderr, store.stderr, script)


@pytest.mark.docker
@pytest.mark.timeout(300)
def test_the_install_step_trusts_the_ca_bundle_and_the_sandbox_keeps_the_images_store(docker_provider, tmp_path):
    """A layer over a task whose .dockerignore leaves everything out, built on a dev Docker node: its install step
    sees the image's store and the bundle in NODE_EXTRA_CA_CERTS, PIP_CERT, SSL_CERT_FILE and REQUESTS_CA_BUNDLE;
    the sandbox's image holds neither the bundle nor those variables."""
    bundle = tmp_path / "ca.pem"
    bundle.write_text(FAKE_CA)
    evidence = ('cp "$NODE_EXTRA_CA_CERTS" /installed-cas.pem', 'echo "$PIP_CERT $SSL_CERT_FILE $REQUESTS_CA_BUNDLE" '
                '> /installed-env', "ls /tmp > /installed-tmp")
    agent = InstalledAgent(name="probe", dialect="chat completions", registry="npm", package="probe", version="1",
                           install=evidence, run="true")
    folder = write_task(tmp_path, "ignored", dockerfile='FROM 127.0.0.1:5000/rl360/busybox:latest\nUSER 65534\n')
    (folder / "environment" / ".dockerignore").write_text("*\n")
    task = with_agent(load_task(folder), agent, layers=tmp_path / "layers", ca_bundle=str(bundle))

    async def go():
        sandbox = await docker_provider().start(task, attempt_id="ca-1", labels={})
        try:
            return (await sandbox.exec("cat /installed-cas.pem /installed-env /installed-tmp; echo now:; "
                                       "ls /tmp | grep -c rl360-build; env | grep -c _CERT; id -u",
                                       timeout_s=30)).output
        finally:
            await sandbox.stop()

    step, now = run(go()).split("now:\n")
    # The step: the bundle (busybox has no store of its own), in all four variables, copied in beside the merged one.
    assert step == FAKE_CA + "/tmp/rl360-build-cas.pem " * 2 + f"/tmp/rl360-build-cas.pem\n{BUILD_CA}\n" \
        "rl360-build-cas.pem\n", step
    # The sandbox: neither file in /tmp, no CA variable, the task's own user again.
    assert now.split() == ["0", "0", "65534"], now


# ----------------------------------------------------------------------------- a real one, in a docker sandbox


@pytest.fixture(scope="module")
def long_engine(tmp_path_factory):
    """rl360's CPU engine on a random tiny Llama whose context holds mini-swe-agent's own prompts."""
    from rl360cli.inference.testing import build_tiny_test_model

    model = build_tiny_test_model(tmp_path_factory.mktemp("models") / "tiny", max_positions=16384)
    port = free_port()
    log = tmp_path_factory.mktemp("logs") / "engine.log"
    proc = subprocess.Popen([sys.executable, "-m", "rl360cli.inference.server", "--model", str(model), "--port",
                             str(port), "--num-threads", "1"], stdout=open(log, "wb"), stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"the engine did not start:\n{log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                    break
            except (urllib.error.URLError, OSError):
                time.sleep(0.2)
        yield f"http://127.0.0.1:{port}", model
    finally:
        proc.terminate()
        proc.wait(timeout=15)


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_mini_swe_agent_installed_in_the_image_runs_inside_the_sandbox_through_the_door(
        long_engine, proxy_of, docker_provider, docker_node_specs, tmp_path):  # noqa: F811
    from transformers import AutoTokenizer

    url, model = long_engine
    tokenizer = AutoTokenizer.from_pretrained(model)
    # PyPI for the install layer's RUN step, through the proxy; the sandbox itself wants no network.
    proxy = proxy_of('allow = ["pypi.org", "files.pythonhosted.org", "deb.debian.org"]\n')
    # One node: the second session finds the layer the first built there.
    provider = docker_provider(nodes=docker_node_specs[:1], egress=dataclasses.replace(proxy.route, door=True),
                               warm_pool=WarmPoolConfig(size=0))
    agent_config = AgentConfig(harness="installed:mini-swe-agent", action_format="fence", tool_parser="")
    rollout = RolloutConfig(max_turns=2, max_new_tokens=12, max_total_tokens=16384)
    agent = installed_agent(agent_config)
    task = load_task(write_task(tmp_path, "hello", dockerfile=f"FROM {PYTHON_SLIM}\nWORKDIR /app\n",
                                toml='[environment]\ncpus = 1\nmemory_mb = 2048\nnetwork_mode = "no-network"\n'
                                     "[agent]\ntimeout_sec = 600\n",
                                test_sh="mkdir -p /logs/verifier; echo 0 > /logs/verifier/reward.txt\n"))
    layered = with_agent(task, agent, layers=tmp_path / "layers")
    served = ServedEndpoint(tokenizer, engine_url=url)
    options = session_options(agent_config, rollout, model="policy")
    runs = []
    try:
        for i in range(2):  # the second session finds the layer built on its node
            spec = SessionSpec(task_id=task.id, group_id="g", sample_index=i, attempt_id=f"installed-{i}")
            runs.append(served.call(run_session(
                spec, layered, endpoint=served.endpoint, harness=InstalledHarness(agent), options=options,
                agent=agent_config, rollout=rollout, provider=provider, exec_timeout_s=60.0,
                labels={"rl360.run": provider.run_id}), timeout_s=1200))
            built = provider.builds if i == 0 else built
    finally:
        served.close()
    # The install ran at most once on the node (none where an earlier run left the layer), never per session.
    assert provider.builds == built <= 1, provider.builds
    for trajectories in runs:
        first = trajectories[0]
        assert first.outcome is not Outcome.INFRA_FAILURE, (first.cause, first.metadata.get("detail"),
                                                            first.metadata.get("agent_files"))
        files = first.metadata["agent_files"]
        assert set(files) == {"mini-swe-agent.txt", "mini-swe-agent.trajectory.json"}
        # mini-swe-agent's own trajectory: each of its model calls is a turn of the record, the engine's tokens
        # spelling what it got back (a reply it could not parse, as a random model's are, it keeps in the format
        # error's message, and drops from its history: a new segment of the record).
        own = json.loads(files["mini-swe-agent.trajectory.json"])
        replies = [m["content"] if m.get("role") == "assistant" else m["extra"]["model_response"]
                   for m in own["messages"] if m.get("role") == "assistant"
                   or (m.get("extra") or {}).get("interrupt_type") == "FormatError"]
        assert len(replies) == 2 == len(first.metadata["turns"]), files["mini-swe-agent.txt"][-2000:]
        generated = [run for t in trajectories for run in _generated_runs(t.token_ids, t.loss_mask)]
        assert [tokenizer.decode(ids, skip_special_tokens=True) for ids in generated] == replies
        assert first.metadata["session"]["tito_breaks"] == len(trajectories) - 1


def _generated_runs(token_ids: list[int], loss_mask: list[int]) -> list[list[int]]:
    """The token runs the engine generated (loss mask 1), in order."""
    runs: list[list[int]] = []
    previous = 0
    for token, mask in zip(token_ids, loss_mask):
        if mask and not previous:
            runs.append([])
        if mask:
            runs[-1].append(token)
        previous = mask
    return runs


SMOKE = REPO / "recipes" / "local-smoke.toml"


@pytest.mark.parametrize(("sets", "line"), [
    ((), "error: [agent] harness 'installed:mini-swe-agent' is installed in a layer over the task's image, which "
         "[sandbox] provider \"process\" does not build; set [sandbox] provider = \"docker\""),
    (("sandbox.provider=docker",), "error: [agent] harness 'installed:mini-swe-agent' reaches its model through its "
     "session's door on the node's egress proxy, which [egress] mode = \"none\" does not start; set [egress] mode = "
     "\"allow\" in the profile, its allow list naming the agent's registry"),
])
def test_plan_refuses_an_installed_agent_the_run_could_not_start(cli, state_path, tmp_path, sets, line):
    sets = [a for s in ("agent.harness=installed:mini-swe-agent", *sets) for a in ("--set", s)]
    proc = cli("plan", "--recipe", str(SMOKE), *sets, cwd=tmp_path)
    assert (proc.returncode, proc.stdout, proc.stderr.splitlines()) == (1, "", [line])
    assert not state_path.parent.exists()


def test_plan_takes_an_installed_agent_on_docker_behind_the_egress_proxy(cli, state_path, tmp_path):
    # From the checkout, whose images/ the dev profile's image list is (plan writes nothing there).
    proc = cli("plan", "--recipe", str(SMOKE), "--profile", str(REPO / "cluster" / "dev-docker.toml"), "--set",
               "sandbox.provider=docker", "--set", "agent.harness=installed:mini-swe-agent", cwd=REPO)
    assert proc.returncode == 0 and "train: start training/trainer" in proc.stdout, proc.stderr
