"""What every backend shares: the description of a component to start, and what is observed of one."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Protocol

Status = Literal["starting", "running", "exited", "failed", "stopped", "unknown"]
# Statuses after which a component will never run again.
FINAL: frozenset[str] = frozenset({"exited", "failed", "stopped"})


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
    status: Status
    exit_code: int | None = None
    reason: str | None = None


class Backend(Protocol):
    name: str

    def launch(self, spec: ComponentSpec, log_path: str) -> dict:
        """Start the component; return its state record (pid or job step, ports, log path, ...)."""

    def observe(self, records: dict[str, dict]) -> dict[str, Observation]:
        """What each recorded component is doing now, found with as few calls as possible."""

    def stop(self, records: dict[str, dict], *, grace_s: float) -> None:
        """Stop the components (TERM, then KILL after `grace_s`); already stopped ones are fine."""
