"""Harbor's sidecar services: a task's `environment/docker-compose.yaml`, read into `Sidecar` specs.

Harbor (its docs, "MCP Server Task"; examples/tasks/hello-mcp) defines a multi-container task with a
compose file beside the Dockerfile: the service `main` is the agent's sandbox (built from the task's
Dockerfile), every other service is a sidecar, reached from the sandbox by its service name. An
`[[environment.mcp_servers]]` entry with a URL names one of them as its host
(`http://mcp-server:8000/mcp`). rl360 reads the part of compose that a sidecar needs:

    services:
      main:
        depends_on:
          mcp-server: {condition: service_healthy}   # the agent starts once the sidecar is healthy
      mcp-server:
        build: ./mcp-server                           # or {context, dockerfile}; or `image: ...`
        command: ["python3", "server.py"]             # else the image's (the Dockerfile's) CMD
        environment: {SECRET: "..."}
        expose: ["8000"]
        healthcheck: {test: ["CMD-SHELL", "..."], interval: 1s, timeout: 5s, retries: 30, start_period: 0s}

Named volumes (`volumes: [logs:/var/log/app]` on any service, `main` included, declared under the
top-level `volumes:`) are per-sandbox volumes, as Harbor's per-trial compose project makes them: shared by
the services of one sandbox that name them, never by two sandboxes, removed with the sandbox (a service's
request log that the agent may read and cannot forge). An anonymous one (`- /data`) is the service's own.
Refused in one line rather than run wrongly: bind mounts (COPY the files into the image instead),
`external` volumes, published `ports` (a sidecar is private to its sandbox), other network settings,
privileges, and any key of `main` beyond `depends_on`, `environment`, `build`, `image` and `volumes`
(its image is the task's own). Keys that change nothing here (`restart`, `container_name`, `labels`,
`expose`, `hostname`, `init`, `stop_grace_period`) are accepted and ignored.

How the providers start them (docker: containers on a per-sandbox internal network under the
service's name; process: sandboxed processes in a network namespace shared with the sandbox's
commands): docs/sandboxes.md, "Sidecars". Test: tests/sandbox/test_sidecars.py.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from rl360cli.sandbox import dockerfile
from rl360cli.sandbox.taxonomy import Event, SandboxError

COMPOSE_FILES = ("docker-compose.yaml", "docker-compose.yml", "compose.yaml", "compose.yml")
MAIN = "main"
# A service name is a host name inside the sandbox, a container name part and an image tag part.
_SERVICE = re.compile(r"[a-z0-9][a-z0-9_-]{0,62}")
_IGNORED = frozenset({"restart", "container_name", "labels", "expose", "hostname", "init", "stop_grace_period",
                      "networks"})
_SIDECAR_KEYS = frozenset({"build", "image", "command", "entrypoint", "environment", "healthcheck", "depends_on",
                           "working_dir", "user", "volumes"}) | _IGNORED
_MAIN_KEYS = frozenset({"depends_on", "environment", "build", "image", "volumes"}) | _IGNORED
# What a top-level volume may say: a per-sandbox volume has no other driver, name or outside source.
_VOLUME_KEYS = frozenset({"driver", "labels", "name"})
_WHY_NOT = {
    "bind": "COPY the files into the image (its Dockerfile) instead, or use a named volume",
    "ports": "a sidecar is private to its sandbox: drop `ports` (the sandbox reaches it by name)",
    "network_mode": "every sidecar shares its sandbox's private network: drop it",
    "privileged": "sidecars run unprivileged: drop it",
    "cap_add": "sidecars run with a fixed capability set: drop it",
    "devices": "sidecars get no host devices: drop it",
    "env_file": "write the variables under `environment` instead",
}
# The variable every command of a sandbox with MCP servers sees: the servers, as JSON (name, transport, url).
MCP_ENV = "RL360_MCP_SERVERS"
# An MCP server's header value, one variable each (AUTH in the name: Harbor's logs redact such names).
MCP_HEADER_PREFIX = "RL360_MCP_AUTH_"
# Compose's interpolation of a value: $$, ${VAR}, ${VAR:-default}, ${VAR-default}, ${VAR:?err}, ${VAR?err}, $VAR.
_INTERPOLATE = re.compile(r"\$(?:(\$)|\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])([^}]*))?\}|([A-Za-z_][A-Za-z0-9_]*))")
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(h|ms|m|s|us)")


class ComposeRefused(Exception):
    """What of a compose file rl360 cannot run: one line, and the fix."""

    def __init__(self, problem: str, fix: str | None = None):
        super().__init__(problem)
        self.problem = problem
        self.fix = fix


@dataclass(frozen=True, kw_only=True, slots=True)
class SidecarHealthcheck:
    """A compose `healthcheck`: the sidecar is healthy once `argv` exits 0 (within `retries` failures
    after `start_period_s`)."""

    argv: tuple[str, ...]
    interval_s: float = 30.0
    timeout_s: float = 30.0
    start_period_s: float = 0.0
    retries: int = 3

    @property
    def deadline_s(self) -> float:
        """How long a sidecar may take to become healthy before its sandbox fails to start."""
        return self.start_period_s + self.retries * (self.interval_s + self.timeout_s)


@dataclass(frozen=True, kw_only=True, slots=True)
class VolumeMount:
    """A compose volume in one service: `volume` (the top-level name, or `anon-<service>-<n>` for an
    anonymous one) at `target`; one volume per sandbox, shared by the services that name it."""

    volume: str
    target: str
    read_only: bool = False


@dataclass(frozen=True, kw_only=True, slots=True)
class Sidecar:
    """One compose service beside the sandbox."""

    # The service name: the host name the sandbox reaches it at.
    name: str
    # `image:` (pulled), else the image built from `dockerfile` (its `build:` context).
    image: str | None = None
    dockerfile: Path | None = None
    env_hash: str = ""
    # What runs: compose's `entrypoint` / `command`, else the Dockerfile's ENTRYPOINT / CMD (the process
    # provider needs them spelled out; the docker provider leaves the image's own in place).
    entrypoint: tuple[str, ...] | None = None
    command: tuple[str, ...] | None = None
    image_entrypoint: tuple[str, ...] = ()
    image_command: tuple[str, ...] = ()
    workdir: str | None = None
    user: str | None = None
    environment: dict[str, str] = field(default_factory=dict, hash=False)
    healthcheck: SidecarHealthcheck | None = None
    # `main` waits for this one to be healthy (`depends_on: {NAME: {condition: service_healthy}}`),
    # else only for it to have started.
    wait_healthy: bool = False
    # Other sidecars started (and, where asked, healthy) before this one.
    depends_on: tuple[str, ...] = ()
    # Its compose volumes (per sandbox, shared with the other services that mount the same name).
    mounts: tuple[VolumeMount, ...] = ()

    def argv(self) -> tuple[str, ...]:
        """The process the sidecar runs: the entrypoint, then the command (compose's, else the image's)."""
        entrypoint = self.entrypoint if self.entrypoint is not None else self.image_entrypoint
        command = self.command if self.command is not None else (self.image_command if self.entrypoint is None
                                                                 else ())
        return (*entrypoint, *command)


def find_compose(env_dir: Path) -> Path | None:
    """The compose file Harbor reads in `environment/`, if there is one."""
    return next((env_dir / name for name in COMPOSE_FILES if (env_dir / name).is_file()), None)


def load_sidecars(compose: Path, *, task_root: Path
                  ) -> tuple[tuple[Sidecar, ...], dict[str, str], tuple[VolumeMount, ...]]:
    """(the sidecars in start order, `main`'s extra environment, `main`'s volumes) from a compose file;
    `ComposeRefused`."""
    try:
        import yaml
    except ImportError:  # pragma: no cover — a base dependency; only a broken install lacks it
        raise ComposeRefused("reading environment/docker-compose.yaml needs PyYAML", "pip install pyyaml") from None
    try:
        data = yaml.safe_load(compose.read_text())
    except (OSError, UnicodeDecodeError) as e:
        raise ComposeRefused(f"environment/{compose.name} cannot be read ({e})") from None
    except yaml.YAMLError as e:
        raise ComposeRefused(f"environment/{compose.name} is not valid YAML ({' '.join(str(e).split())[:160]})",
                             "fix the syntax at that line") from None
    where = f"environment/{compose.name}"
    if not isinstance(data, dict) or not isinstance(data.get("services"), dict) or not data["services"]:
        raise ComposeRefused(f"{where} needs a `services:` mapping")
    for key in data:
        if key in ("networks", "configs", "secrets"):
            raise ComposeRefused(f"{where}: top-level `{key}` is not supported",
                                 f"drop `{key}`: each sandbox gets one private network")
    declared = _declared_volumes(data.get("volumes"), where)
    services: dict[str, Any] = data["services"]
    main = services.get(MAIN) or {}
    if not isinstance(main, dict):
        raise ComposeRefused(f"{where}: service `main` must be a mapping")
    _check_keys(main, _MAIN_KEYS, f"{where} service main",
                "main is the task's own sandbox: set its image, resources and network in task.toml")
    healthy = _depends_on(main.get("depends_on"), f"{where} service main")
    main_env = _environment(main.get("environment"), f"{where} service main")
    main_mounts = _mounts(main.get("volumes"), declared, MAIN, f"{where} service main")
    sidecars = []
    for name, body in services.items():
        if name == MAIN:
            continue
        if not isinstance(name, str) or not _SERVICE.fullmatch(name):
            raise ComposeRefused(f"{where}: service name {name!r} must be lowercase letters, digits, '-' and '_' "
                                 "(it is the sidecar's host name)")
        if not isinstance(body, dict):
            raise ComposeRefused(f"{where}: service {name} must be a mapping")
        sidecars.append(_sidecar(name, body, compose.parent, task_root, f"{where} service {name}", healthy,
                                 declared))
    names = {s.name for s in sidecars}
    for missing in [n for n in healthy if n not in names]:
        raise ComposeRefused(f"{where}: main depends on {missing!r}, which is not a service of the file")
    for sidecar in sidecars:
        for dep in sidecar.depends_on:
            if dep not in names:
                raise ComposeRefused(f"{where} service {sidecar.name} depends on {dep!r}, which is not a sidecar")
    return _in_start_order(sidecars, where), main_env, main_mounts


def volume_names(task) -> tuple[str, ...]:
    """Every compose volume a sandbox of `task` needs, once each, in order of first use."""
    mounts = [*task.volume_mounts, *(m for s in task.sidecars for m in s.mounts)]
    return tuple(dict.fromkeys(m.volume for m in mounts))


def missing_mcp_host(servers, sidecars: tuple[Sidecar, ...]) -> str | None:
    """Why an MCP server cannot be reached (one line), or None. A URL whose host is a bare name (no dot)
    leads to a sidecar of that name or nowhere; a fully qualified host (`mcp.example.com`) is outside
    and needs the task's network. Checked at placement, not at load: Harbor's own hello-mcp fixture
    ships without its environment/ and must still load."""
    names = {s.name for s in sidecars}
    for server in servers:
        host = (urlsplit(server.url).hostname or "") if server.url else ""
        if host and "." not in host and host != "localhost" and host not in names:
            return (f"MCP server {server.name!r} is at {server.url}, but the task has no sidecar named {host!r}: "
                    f"add a service {host!r} to environment/docker-compose.yaml (Harbor's layout)")
    return None


def mcp_env(servers) -> dict[str, str]:
    """What tells the agent of the task's MCP servers: `RL360_MCP_SERVERS` (JSON), empty without any.

    A server's HTTP headers travel as Harbor's agents pass them (agents/mcp_headers.py): each value in a
    variable of its own (`RL360_MCP_AUTH_<server>_<header>`, filled from the orchestrator's `${VAR}` when the
    sandbox starts, like [environment.env]), the JSON naming the variable under `header_env`, so no
    credential is written into the list itself."""
    if not servers:
        return {}
    listed, values = [], {}
    for i, s in enumerate(servers):
        header_env = {}
        for j, (name, value) in enumerate(s.headers):
            header_env[name] = variable = f"{MCP_HEADER_PREFIX}{i}_{j}"
            values[variable] = value
        listed.append({"name": s.name, "transport": s.transport, **({"url": s.url} if s.url else {}),
                       **({"command": s.command, "args": list(s.args)} if s.command else {}),
                       **({"header_env": header_env} if header_env else {})})
    return {MCP_ENV: json.dumps(listed, separators=(",", ":")), **values}


def image_task(task, sidecar: Sidecar):
    """`task` as the providers' image code sees it, for the sidecar's image: its `image`, else its
    build (tagged `rl360-task/<task>.<service>:<hash>`), under the task's build timeout."""
    return replace(task, id=f"{task.id}.{sidecar.name}", name=f"{task.name} ({sidecar.name})",
                   docker_image=sidecar.image, dockerfile=sidecar.dockerfile, env_hash=sidecar.env_hash,
                   sidecars=(), volume_mounts=(), mcp_servers=(), steps=(), verifier_task=None, healthcheck=None)


async def wait_healthy(sidecar: Sidecar, probe: Callable[[float], Awaitable[bool]],
                       running: Callable[[], Awaitable[str | None]], *, node: str | None = None) -> None:
    """Return once the sidecar's healthcheck passes, compose's way: probes `interval_s` apart, each within
    `timeout_s`; failures count after `start_period_s`, and `retries` of them fail the sandbox's start.
    `probe(timeout_s)` runs the check once; `running()` is None while the sidecar runs, else why it stopped."""
    check = sidecar.healthcheck
    assert check is not None
    began = time.monotonic()
    failures = 0
    while True:
        if await probe(check.timeout_s):
            return
        stopped = await running()
        if stopped is not None:
            raise SandboxError(Event.START_FAILED, f"sidecar {sidecar.name} stopped before it was healthy: {stopped}",
                               node=node)
        if time.monotonic() - began >= check.start_period_s:
            failures += 1
        if failures >= check.retries:
            raise SandboxError(Event.START_FAILED, f"sidecar {sidecar.name} was not healthy after {failures} "
                               f"checks ({' '.join(check.argv)[:120]})", node=node)
        await asyncio.sleep(check.interval_s)


def hosts_file(addresses: dict[str, str]) -> str:
    """/etc/hosts of a process sandbox whose sidecars listen at `addresses` (name -> 127.0.0.N)."""
    lines = ["127.0.0.1\tlocalhost sandbox", "::1\tlocalhost ip6-localhost ip6-loopback"]
    lines += [f"{address}\t{name}" for name, address in addresses.items()]
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- one service


def _sidecar(name: str, body: dict, base: Path, task_root: Path, where: str, healthy: dict[str, bool],
             declared: frozenset[str]) -> Sidecar:
    _check_keys(body, _SIDECAR_KEYS, where, "a sidecar is an image, a command, an environment and a healthcheck")
    image = body.get("image")
    if image is not None and (not isinstance(image, str) or not image.strip() or "$" in image):
        raise ComposeRefused(f"{where}: image must be an image reference (got {image!r})")
    dockerfile_path = None
    env_hash = ""
    image_entrypoint: tuple[str, ...] = ()
    image_command: tuple[str, ...] = ()
    workdir = None
    build = body.get("build")
    if build is not None:
        context, name_of_dockerfile = _build(build, where)
        folder = (base / context).resolve()
        if not folder.is_relative_to(task_root.resolve()) or not folder.is_dir():
            raise ComposeRefused(f"{where}: build context {context!r} is not a folder inside the task",
                                 "put the sidecar's Dockerfile in a folder under environment/")
        dockerfile_path = folder / name_of_dockerfile
        if not dockerfile_path.resolve().is_relative_to(folder) or not dockerfile_path.is_file():
            raise ComposeRefused(f"{where}: no Dockerfile {name_of_dockerfile!r} in its build context {context!r}")
        try:
            instructions = dockerfile.parse(dockerfile_path.read_text())
        except (OSError, UnicodeDecodeError) as e:
            raise ComposeRefused(f"{where}: its Dockerfile cannot be read ({e})") from None
        image_entrypoint, image_command = _image_process(instructions)
        workdir = dockerfile.last_workdir(instructions)
        env_hash = dockerfile.context_hash(folder)
        image = None  # a build wins: compose's `image` then only names the result, which rl360 tags itself
    elif image is None:
        raise ComposeRefused(f"{where} needs `build:` or `image:`")
    working_dir = body.get("working_dir")
    if working_dir is not None and (not isinstance(working_dir, str) or not working_dir.startswith("/")):
        raise ComposeRefused(f"{where}: working_dir must be an absolute path (got {working_dir!r})")
    user = body.get("user")
    if user is not None and (isinstance(user, bool) or not isinstance(user, str | int)):
        raise ComposeRefused(f"{where}: user must be a user name or uid (got {user!r})")
    health = body.get("healthcheck")
    check = _healthcheck(health, where) if health is not None else None
    if healthy.get(name) and check is None:
        raise ComposeRefused(f"{where}: main waits for it to be healthy, but it has no healthcheck",
                             "add a healthcheck, or use condition: service_started")
    return Sidecar(name=name, image=image.strip() if image else None, dockerfile=dockerfile_path, env_hash=env_hash,
                   entrypoint=_words(body.get("entrypoint"), f"{where}: entrypoint"),
                   command=_words(body.get("command"), f"{where}: command"),
                   image_entrypoint=image_entrypoint, image_command=image_command,
                   workdir=working_dir or workdir, user=str(user) if user is not None else None,
                   environment=_environment(body.get("environment"), where), healthcheck=check,
                   wait_healthy=bool(healthy.get(name)),
                   depends_on=tuple(_depends_on(body.get("depends_on"), where)),
                   mounts=_mounts(body.get("volumes"), declared, name, where))


def _declared_volumes(value: Any, where: str) -> frozenset[str]:
    """The top-level `volumes:` names; what would make one more than a per-sandbox volume is refused."""
    if value is None:
        return frozenset()
    if not isinstance(value, dict):
        raise ComposeRefused(f"{where}: top-level `volumes` must be a mapping of names")
    for name, body in value.items():
        if not isinstance(name, str) or not _SERVICE.fullmatch(name):
            raise ComposeRefused(f"{where}: volume name {name!r} must be lowercase letters, digits, '-' and '_'")
        if body is None:
            continue
        if not isinstance(body, dict):
            raise ComposeRefused(f"{where}: volume {name} must be a mapping (or empty)")
        if body.get("external"):
            raise ComposeRefused(f"{where}: volume {name} is external: it would outlive the sandbox and be "
                                 "shared by every sandbox", "drop `external`: each sandbox gets its own volume")
        unknown = sorted(set(body) - _VOLUME_KEYS - {"external"})
        if unknown or body.get("driver", "local") != "local":
            what = f"`{unknown[0]}`" if unknown else f"driver {body.get('driver')!r}"
            raise ComposeRefused(f"{where}: volume {name}: {what} is not supported",
                                 "drop it: a sandbox's volume is the node's own (driver local)")
    return frozenset(value)


def _mounts(value: Any, declared: frozenset[str], service: str, where: str) -> tuple[VolumeMount, ...]:
    """A service's `volumes`, short (`name:/path[:ro]`, `/path`) or long (`{type: volume, source, target,
    read_only}`) syntax; a bind mount is refused."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise ComposeRefused(f"{where}: volumes must be a list")
    mounts = []
    for index, item in enumerate(value):
        if isinstance(item, str):
            parts = item.split(":")
            source, target, mode = (None, parts[0], "") if len(parts) == 1 else (parts[0], parts[1],
                                                                                 ",".join(parts[2:]))
            kind, read_only = "volume", "ro" in mode.split(",")
            if source is not None and source.startswith(("/", ".", "~", "$")):
                kind = "bind"
        elif isinstance(item, dict):
            kind, source, target = item.get("type", "volume"), item.get("source"), item.get("target")
            read_only = bool(item.get("read_only", False))
        else:
            raise ComposeRefused(f"{where}: volumes entries must be strings or mappings (got {item!r})")
        if kind == "bind":
            raise ComposeRefused(f"{where}: bind mount {item!r} is not supported (a host path)", _WHY_NOT["bind"])
        if kind != "volume":
            raise ComposeRefused(f"{where}: a {kind!r} mount is not supported", "use a named volume")
        if not isinstance(target, str) or not target.startswith("/") or ".." in target.split("/"):
            raise ComposeRefused(f"{where}: volume target must be an absolute path (got {target!r})")
        if source is None:
            source = f"anon-{service}-{index}"
        elif source not in declared:
            raise ComposeRefused(f"{where}: volume {source!r} is not declared under the top-level `volumes:`",
                                 f"add `volumes: {{{source}: {{}}}}` at the top of the file, as compose needs")
        mounts.append(VolumeMount(volume=source, target=target.rstrip("/") or "/", read_only=read_only))
    return tuple(mounts)


def _check_keys(body: dict, allowed: frozenset[str], where: str, fix: str) -> None:
    for key in body:
        if key not in allowed:
            raise ComposeRefused(f"{where}: `{key}` is not supported", _WHY_NOT.get(key, fix))


def _build(build: Any, where: str) -> tuple[str, str]:
    if isinstance(build, str):
        return build, "Dockerfile"
    if isinstance(build, dict):
        unknown = set(build) - {"context", "dockerfile"}
        if unknown:
            raise ComposeRefused(f"{where}: build.{sorted(unknown)[0]} is not supported", "use context and dockerfile")
        context, name = build.get("context", "."), build.get("dockerfile", "Dockerfile")
        if isinstance(context, str) and isinstance(name, str):
            return context, name
    raise ComposeRefused(f"{where}: build must be a folder or {{context, dockerfile}} (got {build!r})")


def _image_process(instructions) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The Dockerfile's last ENTRYPOINT and CMD, each as argv (the shell form runs under /bin/sh -c)."""
    entrypoint: tuple[str, ...] = ()
    command: tuple[str, ...] = ()
    for ins in instructions:
        if ins.keyword in ("ENTRYPOINT", "CMD"):
            argv = tuple(ins.words()) if ins.is_json_form() else ("/bin/sh", "-c", ins.args)
            if ins.keyword == "ENTRYPOINT":
                entrypoint, command = argv, ()  # Docker resets CMD when ENTRYPOINT is set after it
            else:
                command = argv
    return entrypoint, command


def _words(value: Any, where: str) -> tuple[str, ...] | None:
    if value is None:
        return None
    if isinstance(value, str):
        return ("/bin/sh", "-c", value)
    if isinstance(value, list) and all(isinstance(v, str | int | float) for v in value):
        return tuple(str(v) for v in value)
    raise ComposeRefused(f"{where} must be a string or a list of strings (got {value!r})")


def _environment(value: Any, where: str) -> dict[str, str]:
    """A service's environment. A name with no value (`- NAME`, or `NAME:` in a mapping) passes the variable of
    the process that loads the task (a session actor, `rl360 tasks check`), as compose passes its shell's;
    one that is not set there is left out, as compose leaves it out."""
    if value is None:
        return {}
    if isinstance(value, list):
        if not all(isinstance(item, str) for item in value):
            raise ComposeRefused(f"{where}: environment entries must be NAME=value or NAME (got {value!r})")
        pairs = [item.partition("=") for item in value]
        value = {key: val if sep else None for key, sep, val in pairs}
    if isinstance(value, dict):
        out = {}
        for key, val in value.items():
            if val is not None:
                out[str(key)] = interpolate(str(val), where=f"{where}: environment {key}")
            elif str(key) in os.environ:
                out[str(key)] = os.environ[str(key)]
        return out
    raise ComposeRefused(f"{where}: environment must be a list or a mapping")


def interpolate(value: str, *, where: str, environ: Any = None) -> str:
    """`value` with compose's variables filled from the loader's environment, as compose fills them from its
    shell's: an unset one is empty (`${ANTHROPIC_API_KEY}` in harbor-cookbook's simulated-user), `:-` / `-`
    give a default, `:?` / `?` refuse (ComposeRefused, with the message), `$$` is a `$`."""
    environ = os.environ if environ is None else environ

    def fill(match: re.Match) -> str:
        dollar, name, op, arg, bare = match.groups()
        if dollar:
            return "$"
        name = name or bare
        found = environ.get(name)
        if op in (":-", ":?") and not found:
            found = None
        if found is not None:
            return found
        if op in (":-", "-"):
            return arg
        if op in (":?", "?"):
            raise ComposeRefused(f"{where}: ${{{name}}} is not set ({arg or 'compose requires it'})",
                                 f"set {name} in the environment rl360 runs in")
        return ""

    return _INTERPOLATE.sub(fill, value)


def _depends_on(value: Any, where: str) -> dict[str, bool]:
    """{service: whether it must be healthy}."""
    if value is None:
        return {}
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return dict.fromkeys(value, False)
    if isinstance(value, dict):
        out = {}
        for name, rule in value.items():
            condition = (rule or {}).get("condition", "service_started") if isinstance(rule, dict | None) else None
            if condition not in ("service_started", "service_healthy"):
                raise ComposeRefused(f"{where}: depends_on {name}: condition must be service_started or "
                                     f"service_healthy (got {condition!r})")
            out[str(name)] = condition == "service_healthy"
        return out
    raise ComposeRefused(f"{where}: depends_on must be a list or a mapping")


def _healthcheck(value: Any, where: str) -> SidecarHealthcheck | None:
    if not isinstance(value, dict):
        raise ComposeRefused(f"{where}: healthcheck must be a mapping")
    if value.get("disable"):
        return None
    test = value.get("test")
    if isinstance(test, str):
        argv: tuple[str, ...] = ("/bin/sh", "-c", test)
    elif isinstance(test, list) and test and all(isinstance(t, str) for t in test) and test[0] in ("CMD", "CMD-SHELL"):
        argv = tuple(test[1:]) if test[0] == "CMD" else ("/bin/sh", "-c", " ".join(test[1:]))
    elif isinstance(test, list) and test == ["NONE"]:
        return None
    else:
        raise ComposeRefused(f"{where}: healthcheck test must be a string, [\"CMD\", ...] or [\"CMD-SHELL\", \"...\"]")
    if not argv:
        raise ComposeRefused(f"{where}: healthcheck test is empty")
    retries = value.get("retries", 3)
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 1:
        raise ComposeRefused(f"{where}: healthcheck retries must be a positive integer (got {retries!r})")
    return SidecarHealthcheck(argv=argv, interval_s=_seconds(value.get("interval", "30s"), where),
                              timeout_s=_seconds(value.get("timeout", "30s"), where),
                              start_period_s=_seconds(value.get("start_period", "0s"), where), retries=retries)


def _seconds(value: Any, where: str) -> float:
    """A compose duration ("1m30s", "500ms", "5s") in seconds."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    text = str(value).strip()
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ComposeRefused(f"{where}: healthcheck duration {value!r} is not like \"5s\", \"500ms\" or \"1m30s\"")
    scale = {"h": 3600, "m": 60, "s": 1, "ms": 1e-3, "us": 1e-6}
    return sum(float(n) * scale[u] for n, u in parts)


def _in_start_order(sidecars: list[Sidecar], where: str) -> tuple[Sidecar, ...]:
    """Dependencies first; a cycle is refused."""
    by_name = {s.name: s for s in sidecars}
    done: dict[str, Sidecar] = {}
    visiting: set[str] = set()

    def visit(s: Sidecar) -> None:
        if s.name in done:
            return
        if s.name in visiting:
            raise ComposeRefused(f"{where}: the services' depends_on go in a circle through {s.name}")
        visiting.add(s.name)
        for dep in s.depends_on:
            visit(by_name[dep])
        visiting.discard(s.name)
        done[s.name] = s

    for sidecar in sidecars:
        visit(sidecar)
    return tuple(done.values())
