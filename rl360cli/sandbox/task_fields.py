"""Reading three of Harbor's task.toml entries into task.py's model, with Harbor's own checks: `artifacts`
(strings or `{source, destination, exclude, service}` tables), `[[verifier.collect]]` hooks and
`[[environment.mcp_servers]]` (with their `headers`).

    artifacts = read_artifacts(data, "artifacts", services={"db"})
    hooks = read_collect_hooks(verifier_table, "[verifier]", services={"db"})
    servers = read_mcp_servers(environment_table)

Harbor's rules (models/task/config.py, `ArtifactConfig`, `VerifierCollectConfig`, `MCPServerConfig`): a
source never holds a `..` component, and one taken from a sidecar is absolute; a destination is a relative
path without `..`, never `manifest.json` (the collection's record); a service is a compose service name; a
hook needs a command; an MCP header has an HTTP token for a name, no newline in its value, and a header that
carries a credential (Authorization, a cookie, a name holding KEY, SECRET, TOKEN, PASSWORD, CREDENTIAL or
AUTH) names it only as `${VAR}` without a default (task folders are shared: they must never hold one).
rl360 adds one check where Harbor fails at run time: a service must be `main` or one of the task's
sidecars (environment/docker-compose.yaml).

Each problem raises `FieldRefused` (the problem and its fix); task_loader.py turns it into the task's one
line. Test: tests/sandbox/test_collect.py.
"""

from __future__ import annotations

import math
import re
from pathlib import PurePosixPath
from typing import Any

from rl360cli.sandbox.task import MAIN_SERVICE, Artifact, CollectHook, McpServer

_SERVICE_NAME = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9_.-]*")
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_TEMPLATE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
_SENSITIVE = re.compile(r"KEY|SECRET|TOKEN(?!S)|PASSWORD|CREDENTIAL|AUTH", re.IGNORECASE)
# A credential header's only accepted shape: `${VAR}` references (no default) after an optional auth
# scheme, joined by separators: "Bearer ${TOKEN}", "Token ${KEY_ID}:${SECRET}".
_NO_DEFAULT = r"\$\{[A-Za-z_][A-Za-z0-9_]*(?::-)?\}"
_TEMPLATED_CREDENTIAL = re.compile(rf"\s*(?:[A-Za-z]+\s+)?{_NO_DEFAULT}(?:[\s:-]*{_NO_DEFAULT})*\s*")
MCP_TRANSPORTS = ("stdio", "sse", "streamable-http")


class FieldRefused(Exception):
    """One entry that cannot be run as written: the problem and its fix."""

    def __init__(self, problem: str, fix: str | None = None):
        super().__init__(problem)
        self.problem = problem
        self.fix = fix


def read_artifacts(table: dict, where: str, *, services: set[str] | frozenset[str] = frozenset()) -> tuple[Artifact, ...]:
    """`table["artifacts"]`: each a path string or a `{source, destination, exclude, service}` table."""
    value = table.get("artifacts", [])
    if not isinstance(value, list):
        raise FieldRefused(f"{where} must be a list of paths or tables (got {type(value).__name__})",
                           'write artifacts = ["/app/out.txt", {source = "/data", exclude = ["*.tmp"]}]')
    return tuple(_artifact(item, where, services) for item in value)


def _artifact(item: Any, where: str, services: set[str] | frozenset[str]) -> Artifact:
    if isinstance(item, str):
        item = {"source": item}
    if not isinstance(item, dict):
        raise FieldRefused(f"{where} entries must be paths or tables (got {item!r:.60})",
                           'write "/app/out.txt" or {source = "/app/out.txt"}')
    source = item.get("source")
    if not isinstance(source, str) or not source.strip():
        raise FieldRefused(f"{where} entries need a source path (got {source!r:.60})",
                           'write {source = "/path/in/the/sandbox"}')
    if ".." in PurePosixPath(source).parts:
        raise FieldRefused(f"{where}: source {source!r:.80} must not contain '..'", "name the path itself")
    service = _service(item.get("service"), f"{where} {source!r}", services, optional=True)
    if service != MAIN_SERVICE and not source.startswith("/"):
        raise FieldRefused(f"{where}: source {source!r:.80} taken from service {service!r} must be an absolute path",
                           "write the path in the sidecar from / (source = \"/var/lib/db/dump.sql\")")
    exclude = item.get("exclude", [])
    if not isinstance(exclude, list) or not all(isinstance(p, str) for p in exclude):
        raise FieldRefused(f"{where} {source!r}: exclude must be a list of patterns (got {exclude!r:.60})",
                           'write exclude = ["*.pyc", "node_modules"]')
    return Artifact(source=_rooted(source), destination=_destination(item.get("destination"), where),
                    exclude=tuple(exclude), service=service)


def _rooted(source: str) -> str:
    """A relative source as `docker cp` (Harbor's docker environment) reads it: below /."""
    path = source if source.startswith("/") else f"/{source}"
    return path.rstrip("/") or "/"


def _destination(value: Any, where: str) -> str | None:
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise FieldRefused(f"{where}: destination must be a relative path (got {value!r:.60})",
                           'write destination = "logs/app.log" (it is placed under the artifacts folder)')
    path = PurePosixPath(value)
    if "\\" in value or path.is_absolute() or not path.parts or ".." in path.parts:
        raise FieldRefused(f"{where}: destination {value!r:.80} must be a relative path with '/' separators and "
                           "no '..'", 'write destination = "logs/app.log" (it is placed under the artifacts folder)')
    if value.rstrip("/") == "manifest.json":
        raise FieldRefused(f"{where}: destination 'manifest.json' is the collection's own record",
                           "choose another name")
    return value


def _service(value: Any, where: str, services: set[str] | frozenset[str], *, optional: bool = False) -> str:
    if value is None and optional:
        return MAIN_SERVICE
    name = value.strip() if isinstance(value, str) else value
    if not isinstance(name, str) or not _SERVICE_NAME.fullmatch(name):
        raise FieldRefused(f"{where}: service {value!r:.60} is not a compose service name",
                           "name `main` or a service of environment/docker-compose.yaml")
    if name != MAIN_SERVICE and name not in services:
        known = ", ".join(sorted(services)) or "none"
        raise FieldRefused(f"{where}: service {name!r} is not one of the task's sidecars ({known})",
                           f"add a service {name!r} to environment/docker-compose.yaml, or name `main`")
    return name


def read_collect_hooks(verifier: dict, where: str, *,
                       services: set[str] | frozenset[str] = frozenset()) -> tuple[CollectHook, ...]:
    """`[[verifier.collect]]` (or a step's `[[steps.verifier.collect]]`) of the verifier table `verifier`;
    `where` names it in a refusal."""
    value = verifier.get("collect", [])
    if not isinstance(value, list) or not all(isinstance(h, dict) for h in value):
        raise FieldRefused(f"{where} must be an array of tables", 'write each hook as a table with command = "..."')
    hooks = []
    for hook in value:
        command = hook.get("command")
        if not isinstance(command, str) or not command.strip():
            raise FieldRefused(f"{where} entries need a command (got {command!r:.60})",
                               'write command = "pg_dump app > /dumps/app.sql"')
        timeout = hook.get("timeout_sec", 60.0)
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not math.isfinite(timeout) \
                or timeout <= 0:
            raise FieldRefused(f"{where} timeout_sec must be a positive number of seconds (got {timeout!r:.60})",
                               "write timeout_sec = 60 (Harbor's default)")
        user = hook.get("user")
        if user is not None and (isinstance(user, bool) or not isinstance(user, str | int)):
            raise FieldRefused(f"{where} user must be a user name or uid (got {user!r:.60})",
                               'write user = "postgres" or user = 999, or drop it (the service\'s own user)')
        hooks.append(CollectHook(command=command, service=_service(hook.get("service", MAIN_SERVICE), f"{where}",
                                                                    services),
                                 timeout_s=float(timeout), user=None if user is None else str(user)))
    return tuple(hooks)


def read_mcp_servers(environment: dict) -> tuple[McpServer, ...]:
    """`[[environment.mcp_servers]]`: name, transport (Harbor's default "sse"; "http" is "streamable-http"),
    url or command and args, headers."""
    value = environment.get("mcp_servers") or []
    if not isinstance(value, list) or not all(isinstance(s, dict) for s in value):
        raise FieldRefused("[[environment.mcp_servers]] must be an array of tables",
                           'write [[environment.mcp_servers]] with name = "..." and url = "..." per server')
    return tuple(_mcp_server(server) for server in value)


def _mcp_server(server: dict) -> McpServer:
    name = server.get("name")
    if not isinstance(name, str) or not name.strip():
        raise FieldRefused("[[environment.mcp_servers]] entries need a name", 'add name = "tools"')
    where = f"MCP server {name!r:.60}"
    transport = server.get("transport", "sse")
    transport = "streamable-http" if transport == "http" else transport
    if transport not in MCP_TRANSPORTS:
        raise FieldRefused(f"{where}: transport {transport!r:.40} is not one of {', '.join(MCP_TRANSPORTS)}",
                           'write transport = "streamable-http" (or "http", "sse", "stdio")')
    url, command = server.get("url"), server.get("command")
    if transport != "stdio" and not (isinstance(url, str) and url):
        raise FieldRefused(f"{where}: transport {transport!r} needs a url", 'add url = "http://<service>:<port>/mcp"')
    if transport == "stdio" and not (isinstance(command, str) and command):
        raise FieldRefused(f"{where}: transport 'stdio' needs a command", 'add command = "the-server" (and args)')
    args = server.get("args") or []
    headers = _headers(server.get("headers") or {}, where)
    if transport == "stdio" and headers:
        raise FieldRefused(f"{where}: headers are only for the sse and streamable-http transports",
                           "drop headers, or serve it over HTTP")
    return McpServer(name=name, transport=transport, url=url if isinstance(url, str) else None,
                     command=command if isinstance(command, str) else None,
                     args=tuple(str(a) for a in args) if isinstance(args, list) else (), headers=headers)


def _headers(value: Any, where: str) -> tuple[tuple[str, str], ...]:
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise FieldRefused(f"{where}: headers must be a table of strings", 'write headers = {Authorization = '
                                                                            '"Bearer ${TOKEN}"}')
    for header, text in value.items():
        if not _HEADER_NAME.fullmatch(header):
            raise FieldRefused(f"{where}: {header!r:.60} is not an HTTP header name",
                               "use letters, digits and - (X-Api-Key)")
        if "\r" in text or "\n" in text:
            raise FieldRefused(f"{where}: header {header!r} must not hold a newline", "write it on one line")
        if "${" in _TEMPLATE.sub(" ", text) or any("${" in (m.group(2) or "") for m in _TEMPLATE.finditer(text)):
            raise FieldRefused(f"{where}: header {header!r} holds a malformed ${{VAR}} reference",
                               "write ${NAME} or ${NAME:-default}")
        if _literal_credential(header, text):
            raise FieldRefused(f"{where}: header {header!r} holds a credential written out",
                               f"name the variable that holds it without a default: {header} = \"Bearer ${{TOKEN}}\"")
    return tuple(value.items())


def _literal_credential(header: str, text: str) -> bool:
    """Harbor's `has_literal_header_credential`: a default on a sensitive name, or a credential header whose
    value is not made of `${VAR}` references alone."""
    sensitive = bool(_SENSITIVE.search(header)) or header.lower() in ("cookie", "set-cookie")
    if any(m.group(2) and (sensitive or _SENSITIVE.search(m.group(1))) for m in _TEMPLATE.finditer(text)):
        return True
    return sensitive and bool(text.strip()) and not _TEMPLATED_CREDENTIAL.fullmatch(text)
