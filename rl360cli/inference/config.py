"""Configuration of the inference tier: which engine, how many, how they batch, the router in front."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

from rl360cli.configload import check_at_least, check_non_negative, check_positive, check_range

# The local engine's prefix cache, in MB (rl360cli/inference/prefix_cache.py).
DEFAULT_PREFIX_CACHE_MB = 256.0


@dataclass(frozen=True, kw_only=True, slots=True)
class SimulatedEngineConfig:
    """`[engine.simulated]`: the stand-in engines of `kind = "simulated"` (rl360cli/inference/sim_engine.py).

    Each engine takes at most `max_batch_size` requests at once (the others wait) and answers a request
    after `prefill_ms_per_1k_tokens` per thousand prompt tokens plus `per_token_ms` per token it returns.
    """

    per_token_ms: float = 20.0
    prefill_ms_per_1k_tokens: float = 5.0
    # The chance that a reply submits (no bash block) instead of acting; 0 acts until max_turns.
    submit_probability: float = 0.0
    # What one weight update (a bucket of /update_weights_from_distributed, or from disk) takes.
    weight_update_ms: float = 100.0
    # Engines one process serves (each on its own port); more engines start more processes.
    engines_per_process: int = 96

    def __post_init__(self) -> None:
        check_non_negative(self, "per_token_ms", "prefill_ms_per_1k_tokens", "weight_update_ms")
        check_range(self, 0, 1, "submit_probability")
        check_at_least(self, 1, "engines_per_process")


@dataclass(frozen=True, kw_only=True, slots=True)
class EngineConfig:
    # `local`: rl360's own CPU engine speaking SGLang's HTTP API; `sglang`: the real SGLang server (GPUs);
    # `simulated`: stand-in engines, many per process, that answer after set latencies ([engine.simulated]).
    kind: Literal["local", "sglang", "simulated"] = "local"
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
    # local only: memory of each engine's prefix cache (keys and values of prompts computed before, reused
    # by the agent's next turn and a group's other samples); 0 turns it off.
    prefix_cache_mb: float = DEFAULT_PREFIX_CACHE_MB
    # local only: where each engine's model, KV cache and sampling run: "cpu", "cuda" or "cuda:N".
    device: str = "cpu"
    # local only: decode over a static KV cache with one shape per batch bucket (1, 2, 4, ..., max_batch_size),
    # each bucket's step captured once as a CUDA graph and replayed on a GPU (on the CPU it runs uncaptured);
    # false: the dynamic cache, grown and trimmed every step (rl360cli/inference/static_kv.py).
    static_kv: bool = False
    # How long an engine waits for the trainer inside a weight-update group before giving up.
    weight_sync_timeout_s: float = 120.0
    # Restarts of one dead or hung engine (or the router) in a run by the trainer's health watcher
    # (rl360cli/run/control.py); 0 leaves a dead engine dead and the run goes on with the others.
    max_restarts: int = 5
    simulated: SimulatedEngineConfig = field(default_factory=SimulatedEngineConfig)

    def __post_init__(self) -> None:
        if not re.fullmatch(r"cpu|cuda(:\d+)?", self.device):
            raise ValueError(f"device must be cpu, cuda or cuda:N (got {self.device!r})")
        # The bound keeps a typo (1e8 engines) from a plan that builds every engine's command for minutes.
        check_range(self, 1, 4096, "num_engines")
        check_at_least(self, 1, "max_batch_size", "tp_size", "router_health_check_interval_s", "router_max_retries",
                       "router_request_timeout_s")
        check_non_negative(self, "max_wait_ms", "max_restarts")
        check_non_negative(self, "prefix_cache_mb", fix="0 for no prefix cache")
        check_non_negative(self, "num_threads", fix="0 for torch's default")
        check_positive(self, "weight_sync_timeout_s")
        check_range(self, 0, 1, "mem_fraction_static", low_open=True, high_open=True)
