"""Configuration of the sandbox layer: which provider, what each sandbox reserves, how starts are admitted."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True, kw_only=True, slots=True)
class SandboxConfig:
    provider: Literal["process", "docker"] = "process"
    # Per-sandbox reservation; None takes the task's own [environment] cpus / memory_mb.
    cpus: float | None = None
    memory_mb: int | None = None
    pids_limit: int = 256
    # Admission waves: at most `max_concurrent` live sandboxes, `wave_size` starts every `wave_interval_s`.
    max_concurrent: int = 64
    wave_size: int = 16
    wave_interval_s: float = 0.5
    adaptive_waves: bool = False
    # Infra failures are retried (on another node where there is one) at most this many times.
    max_infra_retries: int = 1
    # Wall-clock limit of one agent command inside the sandbox.
    exec_timeout_s: float = 30.0
    # Fault injection: this fraction of sandbox starts and execs fail with an infra cause.
    inject_failure_rate: float = 0.0

    def __post_init__(self) -> None:
        if self.cpus is not None and self.cpus <= 0:
            raise ValueError(f"cpus must be positive (got {self.cpus}); remove it to use the task's own")
        if self.memory_mb is not None and self.memory_mb < 16:
            raise ValueError(f"memory_mb must be at least 16 (got {self.memory_mb})")
        for name in ("pids_limit", "max_concurrent", "wave_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1 (got {getattr(self, name)})")
        if self.wave_interval_s < 0:
            raise ValueError(f"wave_interval_s must be >= 0 (got {self.wave_interval_s})")
        if self.max_infra_retries < 0:
            raise ValueError(f"max_infra_retries must be >= 0 (got {self.max_infra_retries})")
        if self.exec_timeout_s <= 0:
            raise ValueError(f"exec_timeout_s must be positive (got {self.exec_timeout_s})")
        if not 0.0 <= self.inject_failure_rate < 1.0:
            raise ValueError(f"inject_failure_rate must be in [0, 1) (got {self.inject_failure_rate})")
