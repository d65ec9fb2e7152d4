"""DaytonaStandIn: a stand-in for Daytona's cloud, for tests only. Daytona's service cannot be reached from here.

It serves, on 127.0.0.1, the HTTP endpoints that the official `daytona` SDK (0.226) calls for what
rl360's Daytona provider does, with the bodies the SDK sends and the shapes it parses:

    API (the SDK's api_url is http://127.0.0.1:PORT/api)
      POST   /api/sandbox                       create (from `snapshot`, or `buildInfo.dockerfileContent`)
      GET    /api/sandbox?labels={json}         list, filtered by labels (one page)
      GET    /api/sandbox/{id}                  get
      DELETE /api/sandbox/{id}                  delete
      GET    /api/sandbox/{id}/toolbox-proxy-url
      POST   /api/snapshots, GET /api/snapshots/{name}, GET /api/snapshots, DELETE /api/snapshots/{id}
    toolbox (each sandbox's toolboxProxyUrl is http://127.0.0.1:PORT/toolbox, the SDK appends /{id})
      POST   /toolbox/{id}/process/execute      {command, cwd, timeout, envs} -> {exitCode, result}; 408 at timeout
      POST   /toolbox/{id}/files/bulk-upload    multipart files[i].path / files[i].file
      POST   /toolbox/{id}/files/bulk-download  {paths} -> multipart parts `file` or `error` per path
      POST   /toolbox/{id}/files/folder?path=&mode=
    control (tests only, no Daytona equivalent)
      POST   /_standin/fail  {method, path, status, message, times}: the next `times` matching requests fail

Each sandbox is a real process sandbox of rl360's `process` provider (bubblewrap, rlimits) on this
machine, with the requested CPU, memory (GiB) and disk (GiB) as its reservation. A command string is
split the way Daytona's daemon splits it (spaces, single or double quotes, no shell), then run.

What it does not do: authenticate (any bearer token is accepted), organisations, regions, quotas
(except the failures `/_standin/fail` injects), auto-stop / auto-delete timers, sandbox states other
than started (no stop, start, archive, pause), build contexts (a Dockerfile with COPY or ADD of a
context; a Dockerfile is built as the process provider builds one), object storage, volumes, the
Socket.IO event stream (the SDK falls back to polling), sessions, PTYs, previews, git, LSP, metrics.
Sandboxes live as long as the server: killing it leaves their folders under --root.

    python -m rl360cli.sandbox.daytona.standin --root DIR --port-file FILE
Test: tests/sandbox/test_daytona_provider.py starts it as a subprocess.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import hashlib
import json
import os
import posixpath
import shlex
import signal
import tempfile
import time
import urllib.parse
import uuid
from pathlib import Path
from typing import Any

from aiohttp import web

from rl360cli.sandbox.config import SandboxConfig
from rl360cli.sandbox.process.isolation import RESERVED
from rl360cli.sandbox.process.provider import ProcessProvider
from rl360cli.sandbox.process.sandbox import ProcessSandbox
from rl360cli.sandbox.task import Task
from rl360cli.sandbox.taxonomy import Event, SandboxError

# Where commands start when the request names no cwd: a Daytona sandbox's user home.
HOME = "/home/daytona"


def parse_command(command: str) -> list[str]:
    """Split a command as Daytona's daemon does (process/execute): on spaces, quotes group, no escapes."""
    args: list[str] = []
    current: list[str] = []
    quote = ""
    for ch in command:
        if ch in "\"'":
            if not quote:
                quote = ch
            elif quote == ch:
                quote = ""
            else:
                current.append(ch)
        elif ch == " " and not quote:
            if current:
                args.append("".join(current))
                current = []
        else:
            current.append(ch)
    if current:
        args.append("".join(current))
    return args


@dataclasses.dataclass
class Entry:
    """One sandbox the stand-in holds: its DTO and the process sandbox behind it."""

    dto: dict[str, Any]
    sandbox: ProcessSandbox
    env: dict[str, str]


class DaytonaStandIn:
    def __init__(self, root: Path):
        self.root = root
        self.provider = ProcessProvider(SandboxConfig(provider="process"), run_id="daytona-standin", root=root)
        self.sandboxes: dict[str, Entry] = {}
        self.snapshots: dict[str, dict[str, Any]] = {}
        self.failures: list[dict[str, Any]] = []
        self.port = 0

    # ------------------------------------------------------------------ plumbing

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._inject, _answer_http_errors], client_max_size=1 << 30)
        r = app.router
        r.add_post("/api/sandbox", self.create_sandbox)
        r.add_get("/api/sandbox", self.list_sandboxes)
        r.add_get("/api/sandbox/{id}", self.get_sandbox)
        r.add_delete("/api/sandbox/{id}", self.delete_sandbox)
        r.add_get("/api/sandbox/{id}/toolbox-proxy-url", self.toolbox_url)
        r.add_post("/api/snapshots", self.create_snapshot)
        r.add_get("/api/snapshots", self.list_snapshots)
        r.add_get("/api/snapshots/{name}", self.get_snapshot)
        r.add_delete("/api/snapshots/{name}", self.delete_snapshot)
        r.add_post("/toolbox/{id}/process/execute", self.execute)
        r.add_post("/toolbox/{id}/files/bulk-upload", self.upload)
        r.add_post("/toolbox/{id}/files/bulk-download", self.download)
        r.add_post("/toolbox/{id}/files/folder", self.create_folder)
        r.add_post("/_standin/fail", self.add_failure)
        app.on_cleanup.append(self._cleanup)
        return app

    @web.middleware
    async def _inject(self, request: web.Request, handler):
        for failure in self.failures:
            if failure["method"] == request.method and request.path.startswith(failure["path"]):
                failure["times"] -= 1
                if failure["times"] <= 0:
                    self.failures.remove(failure)
                return _error(failure["status"], failure["message"])
        return await handler(request)

    async def _cleanup(self, _app) -> None:
        for entry in list(self.sandboxes.values()):
            await entry.sandbox.stop()
        await self.provider.close()

    async def add_failure(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.failures.append({"method": body["method"], "path": body["path"], "status": int(body["status"]),
                              "message": body.get("message", "injected"), "times": int(body.get("times", 1))})
        return web.json_response({"ok": True})

    def _entry(self, request: web.Request) -> Entry:
        """The sandbox the path names; a 404 (`_HttpError`, answered by `_answer_http_errors`) when there is none."""
        entry = self.sandboxes.get(request.match_info["id"])
        if entry is None:
            raise _HttpError(404, f"Sandbox with ID or name {request.match_info['id']} not found")
        return entry

    # ------------------------------------------------------------------ sandboxes

    async def create_sandbox(self, request: web.Request) -> web.Response:
        body = await request.json()
        labels = body.get("labels") or {}
        if body.get("snapshot"):
            snap = self.snapshots.get(body["snapshot"])
            if snap is None:
                return _error(404, f"Snapshot {body['snapshot']} not found")
            dockerfile, cpu, memory, disk = snap["_dockerfile"], snap["cpu"], snap["mem"], snap["disk"]
        else:
            dockerfile = ((body.get("buildInfo") or {}).get("dockerfileContent")) or "FROM daytonaio/sandbox\n"
            cpu, memory, disk = body.get("cpu") or 1, body.get("memory") or 1, body.get("disk") or 3
        sid = str(uuid.uuid4())
        task = self._task(labels.get("rl360.task", "sandbox"), dockerfile, cpu=cpu, memory=memory, disk=disk,
                          network=not body.get("networkBlockAll", False))
        try:
            sandbox = await self.provider.start(task, attempt_id=labels.get("rl360.attempt", sid), labels={})
        except SandboxError as e:
            return _error(400, f"build failed: {e.detail}" if "build" in e.event.value else e.detail)
        assert isinstance(sandbox, ProcessSandbox)
        dto = {"id": sid, "organizationId": "standin", "name": body.get("name") or sid, "user": body.get("user")
               or "daytona", "env": body.get("env") or {}, "labels": labels, "public": False,
               "networkBlockAll": bool(body.get("networkBlockAll")), "kvm": False, "target": body.get("target")
               or "standin", "cpu": cpu, "gpu": 0, "memory": memory, "disk": disk, "state": "started",
               "snapshot": body.get("snapshot"), "toolboxProxyUrl": f"http://127.0.0.1:{self.port}/toolbox",
               "createdAt": _now(), "updatedAt": _now()}
        self.sandboxes[sid] = Entry(dto=dto, sandbox=sandbox, env=dict(body.get("env") or {}))
        return web.json_response(dto)

    def _task(self, name: str, dockerfile: str, *, cpu: int, memory: int, disk: int, network: bool) -> Task:
        """The process sandbox's task: the reservation asked for, and the Dockerfile when it does more than FROM."""
        steps = [line for line in dockerfile.splitlines() if line.strip() and not line.lstrip().startswith("#")]
        path = self.root / ".tasks" / hashlib.sha256(dockerfile.encode()).hexdigest()[:16]
        built = None
        if len(steps) > 1:
            (path / "environment").mkdir(parents=True, exist_ok=True)
            built = path / "environment" / "Dockerfile"
            built.write_text(dockerfile)
        path.mkdir(parents=True, exist_ok=True)
        return Task(id=name, name=name, path=path, instruction="", dockerfile=built, cpus=float(cpu),
                    memory_mb=int(memory) * 1024, storage_mb=int(disk) * 1024, network=network, workdir=HOME,
                    env_hash=hashlib.sha256(dockerfile.encode()).hexdigest())

    async def list_sandboxes(self, request: web.Request) -> web.Response:
        wanted = json.loads(request.query.get("labels") or "{}")
        items = [e.dto for e in self.sandboxes.values()
                 if all(e.dto["labels"].get(k) == v for k, v in wanted.items())]
        return web.json_response({"items": items, "nextCursor": None})

    async def get_sandbox(self, request: web.Request) -> web.Response:
        return web.json_response(self._entry(request).dto)

    async def delete_sandbox(self, request: web.Request) -> web.Response:
        entry = self._entry(request)
        del self.sandboxes[entry.dto["id"]]
        await entry.sandbox.stop()
        return web.json_response({**entry.dto, "state": "destroyed"})

    async def toolbox_url(self, request: web.Request) -> web.Response:
        return web.json_response({"url": f"http://127.0.0.1:{self.port}/toolbox"})

    # ------------------------------------------------------------------ snapshots

    async def create_snapshot(self, request: web.Request) -> web.Response:
        body = await request.json()
        name = body["name"]
        if name in self.snapshots:
            return _error(409, f"Snapshot with name {name} already exists")
        dockerfile = ((body.get("buildInfo") or {}).get("dockerfileContent")) or f"FROM {body.get('imageName')}\n"
        snap = {"id": str(uuid.uuid4()), "organizationId": "standin", "general": False, "name": name,
                "imageName": body.get("imageName"), "state": "active", "size": 0.0, "entrypoint": None,
                "cpu": body.get("cpu") or 1, "gpu": 0, "mem": body.get("memory") or 1, "disk": body.get("disk") or 3,
                "errorReason": None, "createdAt": _now(), "updatedAt": _now(), "lastUsedAt": None,
                "sourceSandboxId": None, "_dockerfile": dockerfile}
        # Building it now, as Daytona does, so that a start from the snapshot is a copy of a built tree.
        task = self._task(name, dockerfile, cpu=snap["cpu"], memory=snap["mem"], disk=snap["disk"], network=False)
        try:
            await self.provider.images.ensure(task)
        except SandboxError as e:
            snap.update(state="build_failed", errorReason=e.detail)
        self.snapshots[name] = snap
        return web.json_response(_public(snap))

    async def get_snapshot(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        snap = self.snapshots.get(name) or next((s for s in self.snapshots.values() if s["id"] == name), None)
        if snap is None:
            return _error(404, f"Snapshot {name} not found")
        return web.json_response(_public(snap))

    async def list_snapshots(self, request: web.Request) -> web.Response:
        items = [_public(s) for s in self.snapshots.values()]
        return web.json_response({"items": items, "total": len(items), "page": 1, "totalPages": 1})

    async def delete_snapshot(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        for key, snap in list(self.snapshots.items()):
            if name in (key, snap["id"]):
                del self.snapshots[key]
                return web.Response(status=200)
        return _error(404, f"Snapshot {name} not found")

    # ------------------------------------------------------------------ toolbox

    async def execute(self, request: web.Request) -> web.Response:
        entry = self._entry(request)
        body = await request.json()
        argv = parse_command(body.get("command") or "")
        if not argv:
            return _error(400, "empty command")
        timeout = body.get("timeout") or 360
        cwd = body.get("cwd") or HOME
        try:
            self._make_dir(entry.sandbox, cwd)
            result = await entry.sandbox.exec(f"cd {shlex.quote(cwd)} && exec {shlex.join(argv)}", timeout_s=timeout,
                                              env={**entry.env, **(body.get("envs") or {})})
        except SandboxError as e:
            if entry.dto["id"] not in self.sandboxes:
                return _error(502, "sandbox is no longer running")
            return _error(500, e.detail)
        if entry.dto["id"] not in self.sandboxes:  # deleted while the command ran
            return _error(502, "sandbox is no longer running")
        if result.timed_out:
            return _error(408, f"Command execution timed out after {timeout}s.", code="PROCESS_EXECUTION_TIMEOUT")
        return web.json_response({"exitCode": -1 if result.exit_code is None else result.exit_code,
                                  "result": result.output})

    def _make_dir(self, sandbox: ProcessSandbox, path: str) -> None:
        """A folder anywhere but the host's own paths, as a Daytona sandbox's writable root allows."""
        parts = [p for p in posixpath.normpath(path).split("/") if p]
        if not path.startswith("/") or not parts or parts[0] in RESERVED or ".." in parts:
            raise SandboxError(Event.PROVIDER_FAILED, f"{path}: not a folder a process sandbox can hold")
        host = sandbox.fs.joinpath(*parts)
        real = os.path.realpath(sandbox.fs)
        for depth in range(1, len(parts) + 1):
            folder = sandbox.fs.joinpath(*parts[:depth])
            if not os.path.realpath(folder).startswith(real + os.sep):
                raise SandboxError(Event.PROVIDER_FAILED, f"{path}: a symbolic link leads out of the sandbox")
            if not folder.is_dir():
                folder.mkdir()
                if sandbox.uid is not None:
                    os.chown(folder, sandbox.uid, sandbox.uid)
        assert host.is_dir()

    async def create_folder(self, request: web.Request) -> web.Response:
        entry = self._entry(request)
        try:
            self._make_dir(entry.sandbox, request.query["path"])
        except SandboxError as e:
            return _error(400, e.detail)
        return web.Response(status=200)

    async def upload(self, request: web.Request) -> web.Response:
        entry = self._entry(request)
        reader = await request.multipart()
        with tempfile.TemporaryDirectory(prefix="daytona-standin-") as tmp:
            destinations: dict[str, str] = {}
            while (part := await reader.next()) is not None:
                field = part.name or ""
                if field.endswith(".path"):  # files[i].path comes before files[i].file
                    destinations[field[:-len(".path")]] = await part.text()
                    continue
                if not field.endswith(".file"):
                    await part.release()
                    continue
                local = Path(tmp) / str(len(destinations))
                local.write_bytes(await part.read())
                remote = destinations.get(field[:-len(".file")]) or urllib.parse.unquote(part.filename or "")
                try:
                    await entry.sandbox.upload(local, remote)
                except SandboxError as e:
                    return _error(400, e.detail)
        return web.Response(status=200)

    async def download(self, request: web.Request) -> web.Response:
        entry = self._entry(request)
        paths = (await request.json()).get("paths") or []
        boundary = uuid.uuid4().hex
        chunks: list[bytes] = []
        for path in paths:
            try:
                data = await entry.sandbox.read_file(path, max_bytes=1 << 30)
            except SandboxError as e:
                data, message = None, e.detail
            else:
                message = "file not found"
            disposition = f'form-data; name="{{}}"; filename="{path}"'
            if data is None:
                error = json.dumps({"message": message, "statusCode": 404, "code": "FILE_NOT_FOUND"}).encode()
                chunks.append(_part(boundary, disposition.format("error"), "application/json", error))
            else:
                chunks.append(_part(boundary, disposition.format("file"), "application/octet-stream", data))
        chunks.append(f"--{boundary}--\r\n".encode())
        return web.Response(body=b"".join(chunks),
                            headers={"Content-Type": f"multipart/form-data; boundary={boundary}"})


class _HttpError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status, self.message = status, message

    def response(self) -> web.Response:
        return _error(self.status, self.message)


@web.middleware
async def _answer_http_errors(request: web.Request, handler):
    """A handler's `_HttpError` as the error response Daytona gives."""
    try:
        return await handler(request)
    except _HttpError as e:
        return e.response()


def _error(status: int, message: str, *, code: str | None = None) -> web.Response:
    body: dict[str, Any] = {"statusCode": status, "message": message, "error": message}
    if code:
        body.update(code=code, source="DAYTONA_DAEMON")
    return web.json_response(body, status=status)


def _part(boundary: str, disposition: str, content_type: str, data: bytes) -> bytes:
    head = f"--{boundary}\r\nContent-Disposition: {disposition}\r\nContent-Type: {content_type}\r\n\r\n"
    return head.encode() + data + b"\r\n"


def _public(snap: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in snap.items() if not k.startswith("_")}


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime())


async def serve(root: Path, port_file: Path) -> None:
    standin = DaytonaStandIn(root)
    runner = web.AppRunner(standin.app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    standin.port = site._server.sockets[0].getsockname()[1]  # noqa: SLF001 — aiohttp has no public getter
    tmp = port_file.with_suffix(".tmp")
    tmp.write_text(str(standin.port))
    os.replace(tmp, port_file)  # written whole: the test polls for it
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    with contextlib.suppress(Exception):
        await runner.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser(description="A stand-in for Daytona's cloud (tests only).")
    parser.add_argument("--root", required=True, type=Path, help="where its process sandboxes live")
    parser.add_argument("--port-file", required=True, type=Path, help="written with the port once it listens")
    args = parser.parse_args()
    args.root.mkdir(parents=True, exist_ok=True)
    asyncio.run(serve(args.root, args.port_file))


if __name__ == "__main__":
    main()
