"""Harbor's collection pass: after the agent, its collect hooks run and its artifacts are taken out of the
sandbox and its sidecars into a folder on the orchestrator; a separate verifier gets them back at their
sources.

    collected = await collect_pass(sandbox, task.artifacts, task.collect, folder, end_main=True)
    await deliver(verifier_sandbox, collected)

As Harbor's trial does it (trial/trial.py `_collect_artifacts_phased`, trial/artifact_handler.py,
models/task/artifacts.py), in this order: the hooks of `main` (the sandbox itself), then `main`'s artifacts;
then, when the verifier is separate, the agent's processes end (Harbor stops the main container there); then
the sidecars' hooks and artifacts. A hook is best effort: its exit code is recorded and never fails the
attempt. `/logs/artifacts` is always taken (unless an entry names it). Each artifact lands in `folder` at its
`destination`, else at its source's path without the leading / (`/var/log/x` -> `var/log/x`); an entry
whose place overlaps one taken earlier in the pass is skipped, the first kept (Harbor's collision rule). A
folder with `exclude` patterns is packed by the sandbox's own `tar --exclude` (Harbor's way: the image's tar
decides what a pattern matches) and unpacked here with tarfile's `data` filter. A source that is not there
is `failed` in the manifest (`manifest.json` in `folder`, one entry per artifact: source, destination, type,
status, service), and the verifier judges its absence.

`deliver` uploads each kept copy to its source path in the verifier's sandbox (a folder there is emptied
first), never to its destination: Harbor's "no translation".

Test: tests/sandbox/test_collect.py (process provider; sidecars on the dev Docker nodes).
"""

from __future__ import annotations

import json
import math
import shlex
import tarfile
import uuid
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from rl360cli.sandbox.provider import ExecResult, Sandbox
from rl360cli.sandbox.task import MAIN_SERVICE, Artifact, CollectHook
from rl360cli.sandbox.taxonomy import Event, SandboxError

# Always taken, as Harbor does: the conventional folder an agent writes its outputs to.
ARTIFACTS_DIR = "/logs/artifacts"
MANIFEST = "manifest.json"
_PACKED = "rl360-packed"
# A `main` hook's own timeout ends it; the exec around it has this much longer (`_run_hook` says why).
_HOOK_GRACE_S = 5.0


@dataclass(frozen=True, kw_only=True, slots=True)
class Collected:
    """What one collection pass took: each artifact with its copy (in the pass's folder), the manifest, the
    hooks' ends."""

    taken: tuple[tuple[Artifact, Path], ...] = ()
    # One entry per artifact: source, destination (under the folder), type, status (ok, failed, skipped), service.
    manifest: tuple[dict[str, Any], ...] = field(default=(), compare=False)
    # One entry per hook: service, command, exit_code (None: timed out).
    hooks: tuple[dict[str, Any], ...] = field(default=(), compare=False)


def with_convention(artifacts: Iterable[Artifact]) -> tuple[Artifact, ...]:
    """The pass's entries: /logs/artifacts first unless an entry of `main` names it, each entry once."""
    entries = tuple(dict.fromkeys(artifacts))
    if any(a.source == ARTIFACTS_DIR and a.service == MAIN_SERVICE for a in entries):
        return entries
    return (Artifact(source=ARTIFACTS_DIR), *entries)


def host_path(folder: Path, artifact: Artifact) -> Path:
    """Where an artifact's copy goes: its destination, else its source's path, below `folder`."""
    parts = [p for p in PurePosixPath(artifact.destination or artifact.source).parts if p not in ("/", "..")]
    return folder.joinpath(*parts)


async def collect_pass(sandbox: Sandbox, artifacts: Iterable[Artifact], hooks: Iterable[CollectHook], folder: Path,
                       *, end_main: bool = False, download: bool = True) -> Collected:
    """Run the hooks and take the artifacts, `main` first, then the sidecars; with `end_main` (a separate
    verifier: the agent is done with the sandbox) the agent's processes end between the two. `download=False`
    runs the hooks only (nothing would read the copies)."""
    hooks, entries = tuple(hooks), with_convention(artifacts)
    sidecars = {h.service for h in hooks} | {a.service for a in entries}
    sidecars.discard(MAIN_SERVICE)
    ran: list[dict[str, Any]] = []
    taken: list[tuple[Artifact, Path]] = []
    manifest: list[dict[str, Any]] = []
    claimed: list[Path] = []

    async def one_service(service: str) -> None:
        for hook in (h for h in hooks if h.service == service):
            ran.append({"service": service, "command": hook.command,
                        "exit_code": await _run_hook(sandbox, hook)})
        for artifact in (a for a in entries if a.service == service and download):
            target = host_path(folder, artifact)
            entry = {"source": artifact.source, "destination": target.relative_to(folder).as_posix(),
                     "type": "file" if PurePosixPath(artifact.source).suffix else "directory", "status": "skipped",
                     "service": artifact.service}
            if not any(target == c or c in target.parents or target in c.parents for c in claimed):
                claimed.append(target)
                kind = await _take(sandbox, artifact, target)
                entry.update(type=kind or entry["type"], status="ok" if kind else "failed")
                if kind:
                    taken.append((artifact, target))
            manifest.append(entry)

    await one_service(MAIN_SERVICE)
    if end_main:  # Harbor stops `main` here: nothing the agent left can touch what the sidecars hand over
        await sandbox.end_agent_processes()
    for service in sorted(sidecars):
        await one_service(service)
    if manifest:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / MANIFEST).write_text(json.dumps(manifest, indent=2))
    return Collected(taken=tuple(taken), manifest=tuple(manifest), hooks=tuple(ran))


async def deliver(target: Sandbox, collected: Collected) -> None:
    """Upload each copy to its source path in `target` (a folder emptied first, as Harbor's upload does)."""
    for artifact, local in collected.taken:
        if local.is_dir():
            await target.reset_dir(artifact.source)
        await target.upload(local, artifact.source)


# ----------------------------------------------------------------------------- one artifact


async def _run_hook(sandbox: Sandbox, hook: CollectHook) -> int | None:
    """Run one hook; its exit code, None when it ran past its `timeout_sec`.

    In `main`, the hook itself is bounded by the image's `timeout` (exit 124) inside a longer exec: a sandbox's
    exec past its limit ends every process of the sandbox (docker), and Harbor's hook timeout ends only the
    hook: a server the agent left for a shared verifier must outlive a slow hook."""
    if hook.service != MAIN_SERVICE:
        result = await sandbox.service_exec(hook.service, hook.command, timeout_s=hook.timeout_s, user=hook.user)
        return None if result.timed_out else result.exit_code
    quoted, limit = shlex.quote(hook.command), math.ceil(hook.timeout_s)
    shell = '"$(command -v bash || echo sh)"'
    bounded = (f"if command -v timeout >/dev/null 2>&1; then exec timeout -k 1 {limit} {shell} -c {quoted}; "
               f"else exec {shell} -c {quoted}; fi")
    result = await sandbox.exec(bounded, timeout_s=hook.timeout_s + _HOOK_GRACE_S, user=hook.user)
    # GNU timeout exits 124, busybox's 143 (TERM), either 137 once -k kills it.
    if result.timed_out or (result.exit_code in (124, 137, 143) and result.duration_s >= hook.timeout_s):
        return None
    return result.exit_code


async def _exec(sandbox: Sandbox, service: str, command: str, *, timeout_s: float, user: str | None) -> ExecResult:
    if service == MAIN_SERVICE:
        return await sandbox.exec(command, timeout_s=timeout_s, user=user)
    return await sandbox.service_exec(service, command, timeout_s=timeout_s, user=user)


async def _fetch(sandbox: Sandbox, service: str, remote: str, local: Path) -> bool:
    """Download `remote` from the service to `local`; False when it is not there."""
    fetch: Callable[[], Awaitable[None]] = (
        (lambda: sandbox.download(remote, local)) if service == MAIN_SERVICE
        else (lambda: sandbox.service_download(service, remote, local)))
    try:
        await fetch()
    except SandboxError as e:
        if e.event == Event.PROVIDER_FAILED and "no such" in e.detail:
            return False  # the agent did not make it: the verifier judges its absence
        raise
    return local.exists()


async def _take(sandbox: Sandbox, artifact: Artifact, target: Path) -> str | None:
    """Copy one artifact to `target`: "file" or "directory", or None when it could not be taken."""
    if not artifact.exclude:
        if not await _fetch(sandbox, artifact.service, artifact.source, target):
            return None
        return "directory" if target.is_dir() else "file"
    packed = f"/tmp/{_PACKED}-{uuid.uuid4().hex}.tar"
    source = shlex.quote(artifact.source)
    excludes = " ".join(f"--exclude={shlex.quote(p)}" for p in artifact.exclude)
    # A file is taken whole (Harbor's exclusions are for folders); a folder is packed without what is excluded.
    result = await _exec(sandbox, artifact.service,
                         f"if [ -d {source} ]; then tar cf {packed} {excludes} -C {source} . && echo {_PACKED}; "
                         f"elif [ -e {source} ]; then echo file; else echo none; fi",
                         timeout_s=120, user="root")
    lines = result.output.split()
    if result.exit_code != 0 or not lines or lines[-1] == "none":
        return None
    if lines[-1] == "file":
        return "file" if await _fetch(sandbox, artifact.service, artifact.source, target) else None
    local = target.parent / f".{target.name}.{_PACKED}.tar"
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        if not await _fetch(sandbox, artifact.service, packed, local):
            return None
        target.mkdir(parents=True, exist_ok=True)
        with tarfile.open(local) as tar:
            tar.extractall(target, filter="data")
    finally:
        local.unlink(missing_ok=True)
        await _exec(sandbox, artifact.service, f"rm -f {packed}", timeout_s=30, user="root")
    return "directory"
