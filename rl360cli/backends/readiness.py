"""Waiting for a launched component to become ready: the one loop that the stages (a first start,
stages/base.py) and the restarts (run/restarts.py) share, and what it records on the way.

    end = wait_until_ready(backend, state, "rollout/engine-0", ready=answers(health_url=url), timeout_s=120)
    if end.how is not WaitEnd.READY: raise ...   # each caller says it in its own words

Until `ready()` says yes, it looks at the component's record and asks its backend what the process does: a
component ready is marked `running` (`transitions.mark_ready`), one that ended first `failed` with the
backend's reason (`mark_failed`), one still not ready after `timeout_s` `unknown` (`mark_unknown`: its fate
is not known, the next observation looks again). One that `rl360 down` stopped (or whose record it dropped)
meanwhile is left as down wrote it.

    python -m pytest tests/cli/test_readiness.py
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Protocol

from rl360cli.backends.base import Observation
from rl360cli.state import queries, transitions
from rl360cli.state.queries import Generation
from rl360cli.state.schema import COMPONENT_FINAL, ComponentRecord, ComponentStatus
from rl360cli.state.store import StateFile


class Observer(Protocol):
    """The part of a backend (backends/base.py `Backend`) the wait needs."""

    def observe(self, records: Mapping[str, ComponentRecord]) -> dict[str, Observation]: ...


class WaitEnd(StrEnum):
    """How a wait for a component ended."""

    READY = "ready"
    """`ready()` said yes; the component is marked `running`."""
    STOPPED = "stopped"
    """`rl360 down` stopped it (or dropped its record) before it was ready; its record is down's."""
    ENDED = "ended"
    """Its process ended first; marked `failed` with the backend's reason."""
    TIMED_OUT = "timed_out"
    """Not ready within the time given; marked `unknown`."""
    SUPERSEDED = "superseded"
    """Started again by someone else meanwhile (a tier's requeue); the record is theirs, left as it is."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Waited:
    how: WaitEnd
    # Why it ended (ENDED: the backend's reason).
    reason: str | None = None
    # Its log, where the record names one.
    log_path: str | None = None


def answers(*, health_url: str | None = None, ready_file: str | None = None) -> Callable[[], bool]:
    """A readiness check: the ready file is there, or else the health URL answers 200 within 2 s."""
    def ready() -> bool:
        if ready_file:
            return Path(ready_file).exists()
        try:
            with urllib.request.urlopen(health_url, timeout=2) as reply:
                return reply.status == 200
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError, ValueError):
            return False

    return ready


def wait_until_ready(backend: Observer, state: StateFile, cid: str, *, ready: Callable[[], bool], timeout_s: float,
                     after_restart: bool = False, generation: Generation | None = None,
                     poll_s: float = 0.2) -> Waited:
    """Wait for component `cid` (see the module docstring); `after_restart` words what it records for a
    component that was started again. Given `generation` (`queries.generation` of the start it waits for), a
    record started again by someone else meanwhile ends the wait, SUPERSEDED, and is left as it is."""
    deadline = time.monotonic() + timeout_s
    while True:
        rec = queries.component(state.read(), cid)
        if rec is None or rec["status"] == ComponentStatus.STOPPED:
            return Waited(how=WaitEnd.STOPPED)
        if generation is not None and queries.generation(rec) != generation:
            return Waited(how=WaitEnd.SUPERSEDED)
        # Each mark below records only while the record is still this start's; when it is not, the next pass
        # says why (stopped or superseded).
        if ready():
            if transitions.mark_ready(state, cid, of_generation=generation):
                return Waited(how=WaitEnd.READY)
            continue
        seen = backend.observe({cid: rec})[cid]
        if seen.status in COMPONENT_FINAL:
            if transitions.mark_failed(state, cid, exit_code=seen.exit_code, of_generation=generation,
                                       reason=f"restart failed: {seen.reason}" if after_restart else seen.reason):
                return Waited(how=WaitEnd.ENDED, reason=seen.reason, log_path=rec["log_path"])
            continue
        if time.monotonic() > deadline:
            if transitions.mark_unknown(state, cid, of_generation=generation,
                                        reason=f"not healthy {timeout_s:g}s after a restart" if after_restart
                                        else f"not ready after {timeout_s:g}s"):
                return Waited(how=WaitEnd.TIMED_OUT, log_path=rec["log_path"])
            continue
        time.sleep(poll_s)
