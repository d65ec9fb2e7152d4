"""Configuration of the sandbox layer: which provider, what each sandbox reserves, how starts are admitted.

It is a recipe's `[sandbox]` table. Imports nothing heavy (the CLI loads recipes).
"""

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
    # Adaptive waves grow up to this size (or wave_size, if larger) while the median start latency stays
    # under the target and no start fails, and halve (down to 1) when a start fails or the median latency
    # exceeds twice the target.
    max_wave_size: int = 64
    target_start_latency_s: float = 2.0
    # Infra failures are retried (on another node where there is one) at most this many times.
    max_infra_retries: int = 1
    # Wait before retry k (k = 0, 1, ...): retry_backoff_s * 2**k.
    retry_backoff_s: float = 0.5
    # A node whose daemon stopped answering gets no new sandbox for this long.
    node_down_s: float = 30.0
    # Wall-clock limit of one agent command inside the sandbox.
    exec_timeout_s: float = 30.0
    # Limit of creating and starting one sandbox, after its image is on the node (pulls and builds have
    # their own: pull_timeout_s, and the task's build_timeout_sec).
    start_timeout_s: float = 60.0
    pull_timeout_s: float = 600.0
    # "task": a task that asks for a network (network_mode = "public") gets one; "none": no sandbox does.
    network: Literal["task", "none"] = "task"
    # Largest file a sandbox may write (RLIMIT_FSIZE / the fsize ulimit), capped by the task's storage_mb.
    max_file_mb: int = 1024
    max_open_files: int = 1024
    # An exec's output is kept up to this many characters (head and tail; the middle is cut).
    max_output_chars: int = 65536
    # Fault injection: this fraction of sandbox starts and execs fail with an infra cause.
    inject_failure_rate: float = 0.0
    # Which starts and execs fail is a function of (seed, attempt id, operation): reproducible.
    inject_seed: int = 0
    # Process provider: where sandbox folders live ("" = $TMPDIR/rl360-sandboxes), and the first of the
    # uids sandboxes run as when rl360 runs as root (one uid per live sandbox, so process limits are
    # per sandbox).
    process_root: str = ""
    process_uid_base: int = 200000

    def __post_init__(self) -> None:
        if self.cpus is not None and self.cpus <= 0:
            raise ValueError(f"cpus must be positive (got {self.cpus}); remove it to use the task's own")
        if self.memory_mb is not None and self.memory_mb < 16:
            raise ValueError(f"memory_mb must be at least 16 (got {self.memory_mb})")
        for name in ("pids_limit", "max_concurrent", "wave_size", "max_wave_size", "max_file_mb",
                     "max_open_files", "max_output_chars"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1 (got {getattr(self, name)})")
        if self.wave_interval_s < 0:
            raise ValueError(f"wave_interval_s must be >= 0 (got {self.wave_interval_s})")
        if self.max_infra_retries < 0:
            raise ValueError(f"max_infra_retries must be >= 0 (got {self.max_infra_retries})")
        for name in ("retry_backoff_s", "node_down_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0 (got {getattr(self, name)})")
        for name in ("exec_timeout_s", "start_timeout_s", "pull_timeout_s", "target_start_latency_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive (got {getattr(self, name)})")
        if not 0.0 <= self.inject_failure_rate < 1.0:
            raise ValueError(f"inject_failure_rate must be in [0, 1) (got {self.inject_failure_rate})")
        if self.process_uid_base < 1000:
            raise ValueError(f"process_uid_base must be at least 1000 (got {self.process_uid_base}); "
                             "sandboxes must not share a system user's uid")
