"""Configuration of a node whose Docker daemon rl360 reaches directly: a cluster profile's `[[nodes]]`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from rl360cli.configload import NAME


@dataclass(frozen=True, kw_only=True, slots=True)
class NodeSpec:
    """A node whose Docker daemon rl360 reaches directly (sandboxes, image prewarming)."""

    name: str
    tier: Literal["service", "training", "rollout"] = "rollout"
    # `unix:///path/docker.sock`, or `ssh://user@host:port` (then key_path is used through paramiko).
    docker_host: str = "unix:///var/run/docker.sock"
    key_path: str | None = None
    # ssh:// only: the known_hosts file holding the node's host key (None: ~/.ssh/known_hosts); unknown keys are refused.
    known_hosts: str | None = None
    cpus: float = 2.0
    memory_mb: int = 4096
    # GPUs sandboxes on this node may reserve (a task's `gpus`; docker: `--gpus` device requests), and
    # their model ("h100"; empty: unknown, any task's gpu_types fit), matched against a task's gpu_types.
    gpus: int = 0
    gpu_type: str = ""
    # Disk the image cache may use on this node.
    disk_budget_gb: float = 50.0

    def __post_init__(self) -> None:
        if not NAME.match(self.name):
            raise ValueError(f"node name {self.name!r} must be lowercase letters, digits, '.', '_' or '-'")
        if not self.docker_host.startswith(("unix://", "ssh://", "tcp://")):
            raise ValueError(f"docker_host must start with unix://, ssh:// or tcp:// (got {self.docker_host!r})")
        if self.cpus <= 0 or self.memory_mb <= 0 or self.disk_budget_gb <= 0:
            raise ValueError("cpus, memory_mb and disk_budget_gb must be positive")
        if self.gpus < 0:
            raise ValueError(f"gpus must be >= 0 (got {self.gpus}); 0 for a node without GPUs")
