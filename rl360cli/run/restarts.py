"""Start a component of a run again from its record: same argv, env, ports and node, through its backend.

    record = relaunch_component(backend, state, "rollout/engine-0", reason="SIGKILL")

The run's control plane (control.py) does it for an engine or router that died; `rl360 serve --restart`
(stages/serve.py) does it by hand. The backend's `launch` starts it (a supervised subprocess locally, a job
step on Slurm) from the process that calls it: on Slurm that process must outlive the restarted component,
which is why the control plane, not the trainer, restarts what the run needs to the end.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from rl360cli import events
from rl360cli.backends.base import ComponentSpec, Observation
from rl360cli.backends.readiness import WaitEnd, answers, wait_until_ready
from rl360cli.errors import Rl360Error
from rl360cli.state import queries, transitions
from rl360cli.state.schema import ComponentRecord, ComponentStatus
from rl360cli.state.store import StateFile


class Launcher(Protocol):
    """The part of a backend (backends/base.py `Backend`) a restart needs."""

    def launch(self, spec: ComponentSpec, log_path: str) -> dict: ...

    def observe(self, records: Mapping[str, ComponentRecord]) -> dict[str, Observation]: ...

    def stop(self, records: Mapping[str, ComponentRecord], *, grace_s: float) -> None: ...


def restart_spec(rec: ComponentRecord, *, argv: Sequence[str] | None = None) -> ComponentSpec:
    """The component as it was started (its recorded argv, env, ports and node), optionally with another argv."""
    return ComponentSpec(name=rec["name"], tier=rec["tier"], stage=rec.get("stage") or "serve",
                         kind=rec.get("kind") or "service", argv=tuple(argv or rec.get("command") or ()),
                         env=dict(rec.get("env") or {}), ports=dict(rec.get("ports") or {}), run=rec.get("run"),
                         node=rec.get("requested_node") or (rec.get("node") if rec.get("backend") == "slurm" else None),
                         url=rec.get("url"), health_url=rec.get("health_url"))


class RestartedElsewhere(Rl360Error):
    """Someone else (the tier's requeue after a node loss) started the component again while this restart
    ran: theirs stands, this one's process was stopped, and its caller watches theirs."""


def relaunch_component(backend: Launcher, state: StateFile, cid: str, *, reason: str,
                       argv: Sequence[str] | None = None, ready_timeout_s: float = 120.0,
                       stage: str = "serve", while_run_active: bool = False) -> ComponentRecord:
    """Start component `cid` again from its record, on the same node with the same ports (`start_again`),
    and wait until its health URL answers (`wait_restarted`); returns its record then."""
    record = start_again(backend, state, cid, reason=reason, argv=argv, stage=stage,
                         while_run_active=while_run_active)
    wait_restarted(backend, state, cid, record, timeout_s=ready_timeout_s)
    return queries.component(state.read(), cid)


def start_again(backend: Launcher, state: StateFile, cid: str, *, reason: str, argv: Sequence[str] | None = None,
                stage: str = "serve", while_run_active: bool = False) -> ComponentRecord:
    """Stop what is left of component `cid`'s process (a hung one is killed), start it again from its record
    and record the restart (its record keeps its place and counts it); returns the new record. Raises
    Rl360Error when the component is gone from the state or was stopped (`rl360 down`), or — `while_run_active`
    — when its run is no longer under way (`rl360 down` marks the runs stopped before it stops anything, so a
    death it caused never leaves a restarted process behind); RestartedElsewhere when another start overtook it.

    Its writes, and `wait_restarted`'s, are compare-and-set on the record's generation (`queries.generation`):
    a restart that read the record before a tier's requeue wrote its own never writes over it, nor marks the
    requeue's start failed when its own (on the lost node) fails."""
    old = queries.component(state.read(), cid)
    if old is None or old["status"] == ComponentStatus.STOPPED:
        raise Rl360Error(f"{cid} was stopped; it is not restarted", "start the run's engines with `rl360 serve`")
    backend.stop({cid: old}, grace_s=2.0)
    spec = restart_spec(old, argv=argv)
    launched = backend.launch(spec, old["log_path"])
    record = transitions.record_restart(state, cid, launched, command=spec.argv, env=spec.env, url=spec.url,
                                        health_url=spec.health_url, reason=reason, while_run_active=while_run_active,
                                        of_generation=queries.generation(old))
    if record is None:  # `rl360 down` came meanwhile, or another start did: what was just started goes
        backend.stop({cid: {**old, **launched}}, grace_s=2.0)
        current = queries.component(state.read(), cid)
        if current is not None and current["status"] != ComponentStatus.STOPPED \
                and queries.generation(current) != queries.generation(old):
            raise RestartedElsewhere(f"{cid} was started again by its backend while this restart ran",
                                     "nothing to do: its backend's start is the one watched")
        raise Rl360Error(f"{cid} was stopped while it restarted", "start the run's engines with `rl360 serve`")
    events.record(state, stage=stage, action="restart", subject=cid, reason=reason, pid=launched.get("pid"),
                  job=launched.get("job_id"), node=launched.get("node"))
    return record


def wait_restarted(backend: Launcher, state: StateFile, cid: str, record: ComponentRecord, *,
                   timeout_s: float) -> None:
    """Wait until component `cid`'s restart `record` (`start_again`'s) answers its health URL (the record is then
    `running`). Raises Rl360Error when it was stopped, ended or did not answer in time; RestartedElsewhere
    (after stopping this start's process) when another start overtook it meanwhile."""
    url = record.get("health_url")
    if not url:
        return
    end = wait_until_ready(backend, state, cid, ready=answers(health_url=url), timeout_s=timeout_s, after_restart=True,
                           generation=queries.generation(record))
    if end.how is WaitEnd.STOPPED:
        raise Rl360Error(f"{cid} was stopped while it restarted", "start the run's engines with `rl360 serve`")
    if end.how is WaitEnd.SUPERSEDED:
        backend.stop({cid: record}, grace_s=2.0)
        raise RestartedElsewhere(f"{cid} was started again by its backend while this restart waited for it",
                                 "nothing to do: its backend's start is the one watched")
    if end.how is WaitEnd.ENDED:
        raise Rl360Error(f"{cid} ended as it restarted ({end.reason})", f"see its log {end.log_path}")
    if end.how is WaitEnd.TIMED_OUT:
        raise Rl360Error(f"{cid} did not answer {url} within {timeout_s:g}s of its restart",
                         f"see its log {end.log_path}")
