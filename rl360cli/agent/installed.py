"""Installed agents as Harbor defines them (`[agent] harness = "installed:<name>"`): a command-line agent installed
in the task's image and run inside the sandbox, where it reaches its model through its session's door.

    agent = installed_agent(recipe.agent, recipe.rollout)      # None unless harness = "installed:<name>"
    task = with_agent(task, agent, layers=layer_root())        # the task's image plus the agent's install layer
    harness = InstalledHarness(agent)                          # a session's harness (harness.py's contract)

Harbor's installed agents (harbor/agents/installed/<name>.py) have two parts: an install step, run in the
environment before the trial, and a run command that takes the instruction. rl360 keeps that shape and changes
when the install runs: as a `RUN` step of an image layer over the task's image (`with_agent`: the task's own
Dockerfile, or `FROM` its image, then the install as root), built by the docker provider once per node and kept
there as any task image is (its tag is the layer's content hash), so no session pays for it. The build's `RUN`
reaches PyPI or the npm registry through the node's egress proxy, as any task build does: the profile's
`[egress] allow` names their hosts (pypi.org and files.pythonhosted.org; registry.npmjs.org), or its mirrors map
them (docs/sandboxes.md, "Builds"). Where the cluster's own way out re-signs TLS with a CA the task's image does
not trust, the profile's `[egress] ca_bundle` is copied into the layer and trusted by its install step alone
(npm's NODE_EXTRA_CA_CERTS, pip's PIP_CERT), then removed: the sandbox's trust store stays the task image's (the
agent's door is plain HTTP on the sandbox's loopback, and its model calls need no TLS).

The run command is the preset's, on the instruction, with the session's door in its environment
(`OPENAI_BASE_URL`, `OPENAI_API_KEY`, `ANTHROPIC_BASE_URL`, `ANTHROPIC_API_KEY`: rl360cli/egress/door.py) and
the model's name, `[rollout] max_turns` and `max_new_tokens` as the agent's own flags take them. Its own log and
trajectory file (under /logs/agent, as Harbor keeps them) are read back after it ends and kept with the session's
record (`agent_files` in its trajectories' metadata, the last 64 KiB of each). What trains is what always trains:
the endpoint's record of the session, the engine's tokens.

The presets, with pinned versions (`[agent.harness_config] version` picks another; `flags` adds the agent's own
command-line flags, as its users pass them; `env` adds environment variables):

| name | package | speaks | run as |
|---|---|---|---|
| `claude-code` | npm `@anthropic-ai/claude-code` 2.1.328 | Messages | `claude --print --output-format=stream-json` |
| `codex` | npm `@openai/codex` 0.169.0 | Responses | `codex exec --json`, a model provider at the door |
| `mini-swe-agent` | PyPI `mini-swe-agent` 2.4.6 | chat completions | `mini-swe-agent --yolo --exit-immediately` |
| `terminus-cli` | PyPI `terminus-ai` 2.0.4 (Python >= 3.12, tmux) | chat completions | `terminus` |

A PyPI agent is installed into a virtual environment of its own (/installed-agent/<name>), so its dependencies
never shadow the task's; an npm agent with `npm install -g`. An image without Python (or pip, or Node and npm)
gets Debian's through apt (the stand-in bases' and Debian's images: deb.debian.org on the allow list).

An agent that exits non-zero is logged with its code and is not an infrastructure failure by itself: a session
whose agent made no request to the model is masked (`harness_error`, session.py), one that did trains. A sandbox
given no door (no egress proxy: `[egress] mode` other than "allow", a docker node over ssh://) fails the session
in one line. Test: tests/agent/test_installed_agent.py (the layers and commands; mini-swe-agent from PyPI in a
docker sandbox against rl360's CPU engine, through the door).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import shlex
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from rl360cli.agent.config import AgentConfig, RolloutConfig
from rl360cli.agent.harness import Session
from rl360cli.errors import Rl360Error
from rl360cli.outcome import InfraCause
from rl360cli.sandbox import dockerfile
from rl360cli.sandbox.attempt import InfraError
from rl360cli.sandbox.task import Task

PREFIX = "installed:"
# Where a PyPI agent's own virtual environment goes in the image, and where an agent's files are kept.
AGENT_ROOT = "/installed-agent"
LOGS = "/logs/agent"
# What of each of the agent's files is kept with the session's record: its end, where it stopped.
MAX_FILE_CHARS = 64 << 10
# The image's trust store, as Debian's ca-certificates keeps it.
SYSTEM_CAS = "/etc/ssl/certs/ca-certificates.crt"
# The profile's `[egress] ca_bundle` in a layer's build folder, copied into the image for the install step, and what
# that step trusts (the image's store, then the bundle); both removed by the step.
BUILD_CA = "rl360-build-ca.pem"
BUILD_CAS = "/tmp/rl360-build-cas.pem"
# What an install step may take, beyond the task's own build_timeout_sec (apt's Node and an npm package, or a
# PyPI agent's dependencies, on a cold node: mini-swe-agent's took ~270 s on the dev Docker nodes).
INSTALL_TIMEOUT_S = 900.0
# The run command's deadline when the task's agent budget does not cut it first (it always does: run_attempt).
RUN_TIMEOUT_S = 24 * 3600.0
APT = ("apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends {} "
       ">/dev/null")


@dataclass(frozen=True, kw_only=True, slots=True)
class InstalledAgent:
    """One installed agent: how it is installed in an image, and how a session runs it."""

    name: str
    # The dialect it speaks to the session endpoint.
    dialect: Literal["chat completions", "responses", "messages"]
    registry: Literal["pypi", "npm"]
    package: str
    version: str
    # Shell commands run once per image and node, as root, in the layer over the task's image (one RUN, `set -e`).
    install: tuple[str, ...]
    # The shell command that runs it: $RL360_INSTRUCTION, $RL360_MODEL, $RL360_MAX_TURNS, $RL360_MAX_NEW_TOKENS
    # and the door's variables are set.
    run: str
    # Its own environment beside the door's.
    env: Mapping[str, str] = field(default_factory=dict)
    # Its files kept with the session's record (paths in the sandbox).
    files: tuple[str, ...] = ()


def _pypi_install(name: str, requirement: str, entry: str) -> tuple[str, ...]:
    """A virtual environment of the agent's own, filled by the image's pip (Debian's where it has none)."""
    venv = f"{AGENT_ROOT}/{name}"
    return (f"if ! command -v python3 >/dev/null 2>&1; then {APT.format('python3 python3-venv python3-pip')}; fi",
            f"python3 -m venv --without-pip {venv} 2>/dev/null || {{ {APT.format('python3-venv')} && "
            f"python3 -m venv --without-pip {venv}; }}",
            f"python3 -m pip --version >/dev/null 2>&1 || {{ {APT.format('python3-pip')}; }}",
            f"python3 -m pip --python {venv}/bin/python install -q --no-cache-dir --disable-pip-version-check "
            f"{shlex.quote(requirement)}",
            f"ln -sf {venv}/bin/{entry} /usr/local/bin/{entry}",
            f"{entry} --help >/dev/null")


def _npm_install(package: str, entry: str) -> tuple[str, ...]:
    # Node trusts its own CA list, not the image's: an image whose store trusts a TLS-inspecting proxy on the way
    # out (the dev stand-ins', as pip there is told to) would fail npm with SELF_SIGNED_CERT_IN_CHAIN. The
    # profile's ca_bundle, when the layer has one (BUILD_CAS), is that store and the bundle together.
    return (f"if ! command -v npm >/dev/null 2>&1; then {APT.format('nodejs npm ca-certificates')}; fi",
            f'if [ -z "${{NODE_EXTRA_CA_CERTS:-}}" ] && [ -f {SYSTEM_CAS} ]; then '
            f"export NODE_EXTRA_CA_CERTS={SYSTEM_CAS}; fi",
            f"npm install -g --no-fund --no-audit --loglevel=error {shlex.quote(package)}",
            f"command -v {entry} >/dev/null")


def _preset(name: str, version: str, agent: AgentConfig) -> InstalledAgent:
    """Harbor's installed agent `name`, as rl360 runs it (the module docstring's table)."""
    tee = f"</dev/null 2>&1 | tee {LOGS}/{name}.txt"
    if name == "mini-swe-agent":
        # Its own configs: the tool-calling one, or the text-based one for `[agent] action_format = "fence"`.
        config = ("-c mini_textbased.yaml -c model.model_class=litellm_textbased" if agent.action_format == "fence"
                  else "-c mini.yaml")
        run = (f'mini-swe-agent --yolo --model "openai/$RL360_MODEL" --task "$RL360_INSTRUCTION" {config} '
               '-c "model.model_kwargs.api_base=$OPENAI_BASE_URL" '
               '-c "model.model_kwargs.max_tokens=$RL360_MAX_NEW_TOKENS" -c "agent.step_limit=$RL360_MAX_TURNS" '
               f'-c agent.cost_limit=0 --exit-immediately -o {LOGS}/mini-swe-agent.trajectory.json {{flags}} {tee}')
        return InstalledAgent(name=name, dialect="chat completions", registry="pypi", package="mini-swe-agent",
                              version=version, run=run,
                              install=_pypi_install(name, f"mini-swe-agent=={version}", "mini-swe-agent"),
                              env={"MSWEA_CONFIGURED": "true", "MSWEA_COST_TRACKING": "ignore_errors",
                                   "MSWEA_SILENT_STARTUP": "1", "LITELLM_LOCAL_MODEL_COST_MAP": "True",
                                   "MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT": "1"},
                              files=(f"{LOGS}/mini-swe-agent.txt", f"{LOGS}/mini-swe-agent.trajectory.json"))
    if name == "terminus-cli":
        run = ('terminus "$RL360_INSTRUCTION" --model "openai/$RL360_MODEL" --api-base "$OPENAI_BASE_URL" '
               f'--max-turns "$RL360_MAX_TURNS" --logs-dir {LOGS}/terminus --trajectory-path '
               f'{LOGS}/trajectory.json --working-dir "$PWD" {{flags}} {tee}')
        install = (f"if ! command -v tmux >/dev/null 2>&1; then {APT.format('tmux')}; fi",
                   *_pypi_install(name, f"terminus-ai=={version}", "terminus"))
        return InstalledAgent(name=name, dialect="chat completions", registry="pypi", package="terminus-ai",
                              version=version, install=install, run=run,
                              env={"LITELLM_LOCAL_MODEL_COST_MAP": "True"},
                              files=(f"{LOGS}/{name}.txt", f"{LOGS}/trajectory.json"))
    if name == "claude-code":
        # Harbor's run: the instruction on stdin to `claude --print`, its events as stream-json, permissions
        # bypassed inside the sandbox (IS_SANDBOX), no telemetry, its session files under /logs/agent.
        run = ('printf "%s" "$RL360_INSTRUCTION" | claude --verbose --output-format=stream-json '
               '--permission-mode=bypassPermissions --max-turns "$RL360_MAX_TURNS" --model "$RL360_MODEL" '
               f'{{flags}} --print 2>&1 | tee {LOGS}/{name}.txt')
        return InstalledAgent(name=name, dialect="messages", registry="npm", package="@anthropic-ai/claude-code",
                              version=version, install=_npm_install(f"@anthropic-ai/claude-code@{version}", "claude"),
                              run=run, env={"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "IS_SANDBOX": "1",
                                            "DISABLE_AUTOUPDATER": "1", "CLAUDE_CONFIG_DIR": f"{LOGS}/sessions",
                                            # Its background requests (titles, summaries) name a small model of
                                            # Anthropic's unless told: the session serves one model only.
                                            "ANTHROPIC_MODEL": "$RL360_MODEL",
                                            "ANTHROPIC_SMALL_FAST_MODEL": "$RL360_MODEL"},
                              files=(f"{LOGS}/{name}.txt",))
    if name == "codex":
        # The door as a Responses model provider of Codex's own config (`-c`), its key from OPENAI_API_KEY.
        provider = ('model_providers.rl360={name="rl360",base_url="\'"$OPENAI_BASE_URL"\'",env_key="OPENAI_API_KEY",'
                    'wire_api="responses"}')
        # Codex refuses a CODEX_HOME that does not exist ("Error finding codex home", exit 1 before any request).
        run = ('mkdir -p "$CODEX_HOME" && codex exec --dangerously-bypass-approvals-and-sandbox --skip-git-repo-check '
               f"--json -c model_provider=rl360 -c '{provider}' -m \"$RL360_MODEL\" {{flags}} -- \"$RL360_INSTRUCTION\" "
               f"{tee}")
        return InstalledAgent(name=name, dialect="responses", registry="npm", package="@openai/codex",
                              version=version, install=_npm_install(f"@openai/codex@{version}", "codex"), run=run,
                              env={"CODEX_HOME": f"{LOGS}/codex-home"}, files=(f"{LOGS}/{name}.txt",))
    raise Rl360Error(f"[agent] harness {PREFIX}{name!r} is no installed agent rl360 knows",
                     f"use one of {', '.join(PINNED)}")


# The presets' pinned versions.
PINNED = {"claude-code": "2.1.328", "codex": "0.169.0", "mini-swe-agent": "2.4.6", "terminus-cli": "2.0.4"}


def is_installed(harness: str) -> bool:
    return harness.startswith(PREFIX)


def installed_agent(agent: AgentConfig) -> InstalledAgent | None:
    """The installed agent `[agent] harness` names (None for another kind of harness), with the recipe's
    `[agent.harness_config]` (`version`, `flags`, `env`); `Rl360Error` for an unknown name or a bad setting."""
    if not is_installed(agent.harness):
        return None
    name = agent.harness.removeprefix(PREFIX)
    config = dict(agent.harness_config)
    unknown = sorted(set(config) - {"version", "flags", "env"})
    if unknown:
        raise Rl360Error(f"[agent.harness_config] {unknown[0]} is no setting of an installed agent",
                         "set version, flags (the agent's own command-line flags) or env (a table)")
    version = str(config.get("version") or PINNED.get(name, ""))
    flags, env = config.get("flags", ""), config.get("env", {})
    if not isinstance(flags, str) or not isinstance(env, Mapping):
        raise Rl360Error("[agent.harness_config] flags must be a string and env a table",
                         'e.g. flags = "--append-system-prompt \'Be brief.\'", env = { MAX_THINKING_TOKENS = "0" }')
    preset = _preset(name, version, agent)
    return dataclasses.replace(preset, run=preset.run.replace("{flags}", flags),
                               env={**preset.env, **{str(k): str(v) for k, v in env.items()}})


def check_installed(agent: AgentConfig, *, provider: str, egress_mode: str, ca_bundle: str = "") -> None:
    """Refuse in one line an installed agent the run could not start (`rl360 plan`, `up --dry-run` and `up`, before
    anything starts): its settings, a provider that builds no image layer, a profile with no egress proxy (no
    door), an `[egress] ca_bundle` that is no readable PEM file."""
    if installed_agent(agent) is None:
        return
    if provider != "docker":
        raise Rl360Error(f"[agent] harness {agent.harness!r} is installed in a layer over the task's image, which "
                         f"[sandbox] provider \"{provider}\" does not build", 'set [sandbox] provider = "docker"')
    if egress_mode != "allow":
        raise Rl360Error(f"[agent] harness {agent.harness!r} reaches its model through its session's door on the "
                         f"node's egress proxy, which [egress] mode = \"{egress_mode}\" does not start",
                         'set [egress] mode = "allow" in the profile, its allow list naming the agent\'s registry')
    if ca_bundle:
        read_ca_bundle(ca_bundle)


def read_ca_bundle(path: str) -> str:
    """The certificates (PEM) of `[egress] ca_bundle` at `path`; `Rl360Error` when it is unreadable or holds none."""
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise Rl360Error(f"[egress] ca_bundle {path!r} cannot be read on this node ({getattr(e, 'strerror', None) or e})",
                         "name a PEM file that exists on every node (e.g. /etc/ssl/certs/ca-certificates.crt), "
                         "or remove ca_bundle") from None
    if "-----BEGIN CERTIFICATE-----" not in text:
        raise Rl360Error(f"[egress] ca_bundle {path!r} holds no PEM certificate",
                         "name the CA bundle file (-----BEGIN CERTIFICATE----- blocks) that the way out's TLS is "
                         "signed with, or remove ca_bundle")
    return text if text.endswith("\n") else text + "\n"


def layer_root() -> Path:
    """Where the image layers' build folders are written on this machine (a cache: the same layer, the same
    folder)."""
    return Path(os.environ.get("RL360_AGENT_LAYERS") or Path(tempfile.gettempdir()) / "rl360-agent-layers")


def layer_dockerfile(task: Task, agent: InstalledAgent, *, build_ca: bool = False) -> str:
    """The task's image with the agent's install step as one more layer, its user as the task's image left it.
    `build_ca`: the build folder holds BUILD_CA (the profile's `[egress] ca_bundle`), which the install step trusts
    beside the image's own store (NODE_EXTRA_CA_CERTS for npm, PIP_CERT, SSL_CERT_FILE, REQUESTS_CA_BUNDLE, in that
    step's shell only) and then removes: the sandbox's trust store is the task image's, as before."""
    if task.dockerfile is not None:
        base = task.dockerfile.read_text().rstrip("\n")
        users = [i.args for i in dockerfile.parse(base) if i.keyword == "USER"]
    else:
        base, users = f"FROM {task.docker_image}", []
    install = "; ".join(agent.install)
    lines = [base, "", f"# rl360: the installed agent {agent.name} ({agent.registry} {agent.package} "
             f"{agent.version}), a layer of its own, built once per node", "USER root"]
    if build_ca:
        copied = f"/tmp/{BUILD_CA}"
        lines.append(f"COPY {BUILD_CA} {copied}")
        install = (f"{{ cat {SYSTEM_CAS} 2>/dev/null && echo || true; cat {copied}; }} > {BUILD_CAS}; "
                   f"export NODE_EXTRA_CA_CERTS={BUILD_CAS} PIP_CERT={BUILD_CAS} SSL_CERT_FILE={BUILD_CAS} "
                   f"REQUESTS_CA_BUNDLE={BUILD_CAS}; {install}; rm -f {copied} {BUILD_CAS}")
    lines.append(f"RUN set -e; mkdir -p {LOGS}; {install}")
    if users:  # the task's own user again, for its agent and verifier
        lines.append(f"USER {users[-1]}")
    return "\n".join(lines) + "\n"


def with_agent(task: Task, agent: InstalledAgent, *, layers: Path, ca_bundle: str = "") -> Task:
    """`task` whose image is its own plus the agent's install layer: a build folder under `layers` (the task's
    environment/ files and the layered Dockerfile), tagged by its content, so each node builds it once and keeps
    it. The task's tests, solution, workdir and everything else are unchanged. `ca_bundle`: the profile's
    `[egress] ca_bundle`, which the install step trusts (`layer_dockerfile`); a new bundle is a new layer."""
    if task.dockerfile is None and task.docker_image is None:
        raise Rl360Error(f"task {task.id} names no image", "give it an [environment] docker_image or a Dockerfile")
    pem = read_ca_bundle(ca_bundle) if ca_bundle else ""
    text = layer_dockerfile(task, agent, build_ca=bool(pem))
    digest = hashlib.sha256((text + pem).encode()).hexdigest()[:16]
    folder = layers / f"{task.id}-{agent.name}-{digest}"
    if not (folder / "Dockerfile").is_file():
        staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=_made(layers)))
        if task.dockerfile is not None:  # its COPY and ADD sources, beside the layered Dockerfile
            shutil.copytree(task.dockerfile.parent, staging, dirs_exist_ok=True, symlinks=True)
        if pem:
            (staging / BUILD_CA).write_text(pem)
            ignore = staging / ".dockerignore"
            if ignore.is_file():  # the task's own rules must not leave the bundle out of the build's context
                ignore.write_text(ignore.read_text().rstrip("\n") + f"\n!{BUILD_CA}\n")
        (staging / "Dockerfile").write_text(text)
        try:
            staging.rename(folder)
        except OSError:  # another actor of this machine wrote the same layer first
            shutil.rmtree(staging, ignore_errors=True)
    # The layer sets no WORKDIR: a task run in its image's WORKDIR runs in the layered image's, the same one.
    # Its build is the task's and the install's: the task's build_timeout_sec is timed for the task's own image
    # (60 s for one it pulls), the install gets its own allowance on top, as Harbor's agent setup has its own.
    return dataclasses.replace(task, docker_image=None, dockerfile=folder / "Dockerfile",
                               env_hash=dockerfile.context_hash(folder),
                               build_timeout_s=task.build_timeout_s + INSTALL_TIMEOUT_S)


def _made(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    return folder


class InstalledHarness:
    """A session's harness for an installed agent: open the door, run the agent on the instruction, keep its
    files (an async harness: harness.py)."""

    def __init__(self, agent: InstalledAgent):
        self.agent = agent

    async def __call__(self, session: Session) -> None:
        sandbox = session.async_sandbox
        door = await sandbox.open_door(session.base_url.removesuffix("/v1"), session.api_key)
        if door is None:
            raise InfraError(InfraCause.HARNESS_ERROR,
                             f"{PREFIX}{self.agent.name} reaches its model through its session's door, which this "
                             "sandbox was not given: run it on the docker provider with [egress] mode = \"allow\" "
                             "in the profile (a node of this machine, where the egress proxy runs)")
        limits = session.limits
        env = {**door, "RL360_INSTRUCTION": session.task.instruction, "RL360_MODEL": session.model,
               "RL360_MAX_TURNS": str(limits.max_turns or 1_000_000),
               "RL360_MAX_NEW_TOKENS": str(limits.max_new_tokens)}
        env.update({k: v.replace("$RL360_MODEL", session.model) for k, v in self.agent.env.items()})
        result = await sandbox.exec(f"mkdir -p {LOGS}; set -o pipefail; {self.agent.run}", timeout_s=RUN_TIMEOUT_S,
                                    env=env)
        session.log(f"{PREFIX}{self.agent.name} exited {result.exit_code}"
                    + (" (timed out)" if result.timed_out else ""))
        for path in self.agent.files:
            text = await self._tail(sandbox, path)
            if text is not None:
                session.keep_file(Path(path).name, text)

    @staticmethod
    async def _tail(sandbox: Any, path: str) -> str | None:
        """The end of the agent's file `path` (None when it wrote none)."""
        with tempfile.TemporaryDirectory(prefix="rl360-agent-file-") as tmp:
            local = Path(tmp) / "file"
            try:
                await sandbox.download(path, local)
            except Exception:  # noqa: BLE001 - a file the agent did not write is kept as missing, not an error
                return None
            if not local.is_file():
                return None
            data = local.read_bytes()
        return data[-MAX_FILE_CHARS:].decode(errors="replace")
