"""Configuration of a node whose Docker daemon rl360 reaches directly: a cluster profile's `[[nodes]]`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from rl360cli.configload import check_name, check_non_negative, check_positive
from rl360cli.errors import Rl360Error


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
        check_name(self, "name")
        if not self.docker_host.startswith(("unix://", "ssh://", "tcp://")):
            raise ValueError(f"docker_host must start with unix://, ssh:// or tcp:// (got {self.docker_host!r})")
        check_positive(self, "cpus", "memory_mb", "disk_budget_gb")
        check_non_negative(self, "gpus", fix="0 for a node without GPUs")


def need_docker_nodes(nodes: Sequence[NodeSpec]) -> None:
    """The docker provider starts its containers on these nodes' daemons: one line naming the fix when the profile
    lists none (said by `rl360 up` before it allocates anything, and by the provider)."""
    if not nodes:
        raise Rl360Error("the docker provider needs nodes, and the cluster profile lists none",
                         "add [[nodes]] to the profile, e.g. --profile cluster/dev-docker.toml")
