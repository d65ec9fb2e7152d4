"""What every backend shares: the description of a component to start, and what is observed of one.

A backend also says how a component's Python starts on its node (`Backend.python`): the stages render
every component's command with it, so that a command rendered on one machine runs on another.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from rl360cli.state.schema import ComponentRecord, ComponentStatus


@dataclass(frozen=True, kw_only=True, slots=True)
class ComponentSpec:
    """One long-running process of a stage: an engine, the router, the trainer, ..."""

    name: str
    tier: str
    stage: str
    kind: str
    argv: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    ports: dict[str, int] = field(default_factory=dict)
    run: str | None = None
    # The node to run on; None lets the backend choose within the tier.
    node: str | None = None
    # Where clients reach the component (an engine's or the router's base URL), if it serves.
    url: str | None = None
    # An HTTP URL that answers 200 once the component is ready.
    health_url: str | None = None

    @property
    def id(self) -> str:
        return f"{self.tier}/{self.name}"


@dataclass(frozen=True, slots=True)
class Observation:
    """What a backend sees a component doing now (the statuses and `COMPONENT_FINAL` are the state's)."""

    status: ComponentStatus
    exit_code: int | None = None
    reason: str | None = None


class Backend(Protocol):
    name: str

    @property
    def python(self) -> str:
        """The interpreter that runs a component's Python on its node: the first word of the engines', the
        router's and the trainer's commands (locally this one; on Slurm the profile's `[slurm] python`)."""

    def launch(self, spec: ComponentSpec, log_path: str) -> dict:
        """Start the component; return the backend's part of its state record (pid or job step, log path, ...),
        which `start_component` completes into a `ComponentRecord`."""

    def observe(self, records: Mapping[str, ComponentRecord]) -> dict[str, Observation]:
        """What each recorded component is doing now, found with as few calls as possible."""

    def stop(self, records: Mapping[str, ComponentRecord], *, grace_s: float) -> None:
        """Stop the components (TERM, then KILL after `grace_s`); already stopped ones are fine."""
