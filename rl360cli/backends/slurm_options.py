"""Slurm options of a cluster profile: where and how each tier is allocated."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True, kw_only=True, slots=True)
class SlurmOptions:
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    time_limit: str = "01:00:00"
    # `per-tier`: one job per tier; `hetjob`: one heterogeneous job, one het group per tier.
    mode: Literal["per-tier", "hetjob"] = "per-tier"
    exclusive: bool = False
    constraint: str | None = None
    # pyxis/enroot container image for every job step, if the cluster uses containers.
    container_image: str | None = None
    # Requeues allowed after node failures before a tier is given up.
    max_requeues: int = 3
    # Seconds between scheduler polls (one batched sacct + squeue per poll).
    poll_interval_s: float = 5.0

    def __post_init__(self) -> None:
        if self.max_requeues < 0:
            raise ValueError(f"max_requeues must be >= 0 (got {self.max_requeues})")
        if self.poll_interval_s <= 0:
            raise ValueError(f"poll_interval_s must be positive (got {self.poll_interval_s})")
