"""What every backend shares: the description of a component to start, and what is observed of one.

A backend also says how a component's Python starts on its node (`Backend.python`): the stages render
every component's command with it, so that a command rendered on one machine runs on another.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from rl360cli.outcome import InfraCause
from rl360cli.state.schema import ComponentRecord, ComponentStatus, NodeRecord, StateDoc, TierRecord

if TYPE_CHECKING:
    from rl360cli.backends.slurm_placement import PlacedRecipe


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
    # Or, for one that serves no HTTP (the egress proxy: a node-local unix socket), a file it writes once ready,
    # in a folder this machine sees (the run root); removed before each launch, so an old one never counts.
    ready_file: str | None = None

    @property
    def id(self) -> str:
        return f"{self.tier}/{self.name}"


@dataclass(frozen=True, slots=True)
class Observation:
    """What a backend sees a component doing now (the statuses and `COMPONENT_FINAL` are the state's)."""

    status: ComponentStatus
    exit_code: int | None = None
    reason: str | None = None  # for people
    # What rl360 acts on (the component's `cause` in the state file): `node_lost` when its node was lost.
    cause: InfraCause | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class Allocation:
    """One submission `rl360 plan` shows before anything is allocated: the tiers it holds and what it asks for."""

    tiers: str
    detail: str
    command: tuple[str, ...] = ()
    # The exact script submitted (Slurm: the sbatch script); empty where nothing is submitted.
    script: str = ""


@dataclass(frozen=True, kw_only=True, slots=True)
class RayCluster:
    """The Ray processes a run's trainer joins (head and one worker per node), and the head's address; none
    where the trainer starts a private Ray instance on its own machine."""

    components: tuple[ComponentSpec, ...] = ()
    address: str | None = None
    env: dict[str, str] = field(default_factory=dict)


class Backend(Protocol):
    name: str
    # Every component runs on this machine: the tiers share its CPUs, its ports and its limits, and it has no
    # GPU (the local backend). Otherwise each runs on a node of its tier (Slurm).
    on_this_machine: bool

    @property
    def python(self) -> str:
        """The interpreter that runs a component's Python on its node: the first word of the engines', the
        router's and the trainer's commands (locally this one; on Slurm the profile's `[slurm] python`)."""

    def provision_plan(self) -> list[Allocation]:
        """What `provision` would ask for, one row per submission; touches neither the scheduler nor the disk."""

    def python_note(self) -> str | None:
        """What `rl360 plan` says about the nodes' interpreter when the profile leaves it to rl360, else None."""

    def provision(self) -> tuple[dict[str, TierRecord], dict[str, NodeRecord]]:
        """Allocate the tiers; return them and their nodes as the state records them."""

    def tiers_alive(self, tiers: Mapping[str, TierRecord]) -> dict[str, bool]:
        """Per recorded tier: whether its allocation still holds (a cancelled or ended job does not)."""

    def release(self, tiers: Mapping[str, TierRecord]) -> None:
        """Give the tiers' allocations back; tiers already given back are fine."""

    def launch(self, spec: ComponentSpec, log_path: str) -> dict:
        """Start the component; return the backend's part of its state record (pid or job step, log path, ...),
        which `start_component` completes into a `ComponentRecord`."""

    def observe(self, records: Mapping[str, ComponentRecord]) -> dict[str, Observation]:
        """What each recorded component is doing now, found with as few calls as possible."""

    def stop(self, records: Mapping[str, ComponentRecord], *, grace_s: float) -> None:
        """Stop the components (TERM, then KILL after `grace_s`); already stopped ones are fine."""

    def check_engine(self, kind: str) -> None:
        """Refuse, in one line, an engine kind these machines cannot run."""

    def ray_cluster(self, doc: StateDoc, *, run: str | None, token_path: Path, port: int) -> RayCluster:
        """The Ray cluster across the tiers that a run's trainer joins (see `RayCluster`)."""

    def docker_steps(self, doc: StateDoc, node_names: list[str]) -> dict[str, tuple[str, int | None] | None]:
        """Per node whose Docker daemon is reached through a job step of the allocation holding it: that job
        (and het group); None for such a node no allocation holds. Empty where daemons are reached directly."""

    def placement_plan(self, recipe: PlacedRecipe) -> list[tuple[str, str]]:
        """Where the recipe's parts go on the tiers, as (subject, detail) rows for `rl360 plan`; `Rl360Error` for a
        recipe that does not fit the profile (`rl360 up` asks before it allocates anything)."""

    def heal(self) -> list[str]:
        """Take the next step of recovering tiers that lost a node (Slurm: a bounded requeue); one line for people
        per step taken (`rl360 status` says them)."""
