"""Configuration of the inference tier: which engine, how many, how they batch, the router in front."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal


@dataclass(frozen=True, kw_only=True, slots=True)
class EngineConfig:
    # `local`: rl360's own CPU engine speaking SGLang's HTTP API; `sglang`: the real SGLang server (GPUs).
    kind: Literal["local", "sglang"] = "local"
    num_engines: int = 1
    # Requests that arrive within `max_wait_ms` of each other are decoded together, up to `max_batch_size`.
    max_batch_size: int = 32
    max_wait_ms: float = 5.0
    # sglang only: tensor parallel size per engine and GPUs each engine takes.
    tp_size: int = 1
    mem_fraction_static: float | None = None
    # Extra `--flag value` pairs for the sglang server, for what this file does not name.
    extra_args: dict[str, str] = field(default_factory=dict)
    # The real sglang-router in front of the engines; rollouts talk only to it.
    router_policy: Literal["cache_aware", "round_robin", "random", "power_of_two"] = "cache_aware"
    # How often the router probes each engine's /health; one failed probe takes an engine out of rotation.
    router_health_check_interval_s: int = 2
    # Attempts per request, the first included: 1 hands a request lost with its engine back to the
    # rollout (an engine_error infra failure) instead of running it again on another engine.
    router_max_retries: int = 1
    router_request_timeout_s: int = 1800
    # local only: torch CPU threads per engine (0: torch's default).
    num_threads: int = 0
    # How long an engine waits for the trainer inside a weight-update group before giving up.
    weight_sync_timeout_s: float = 120.0

    def __post_init__(self) -> None:
        if self.num_engines < 1:
            raise ValueError(f"num_engines must be at least 1 (got {self.num_engines})")
        if self.max_batch_size < 1:
            raise ValueError(f"max_batch_size must be at least 1 (got {self.max_batch_size})")
        if self.max_wait_ms < 0:
            raise ValueError(f"max_wait_ms must be >= 0 (got {self.max_wait_ms})")
        if self.tp_size < 1:
            raise ValueError(f"tp_size must be at least 1 (got {self.tp_size})")
        for name in ("router_health_check_interval_s", "router_max_retries", "router_request_timeout_s"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1 (got {getattr(self, name)})")
        if self.num_threads < 0:
            raise ValueError(f"num_threads must be >= 0, 0 for torch's default (got {self.num_threads})")
        if not self.weight_sync_timeout_s > 0:
            raise ValueError(f"weight_sync_timeout_s must be positive (got {self.weight_sync_timeout_s})")
        if self.mem_fraction_static is not None and not 0 < self.mem_fraction_static < 1:
            raise ValueError(f"mem_fraction_static must be in (0, 1) (got {self.mem_fraction_static})")
