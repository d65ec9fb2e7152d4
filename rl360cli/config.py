"""Recipes and cluster profiles: TOML files loaded into frozen dataclasses, validated at load time.

A *cluster profile* (`cluster/*.toml`) says where things run: the backend
(local or slurm), the three tiers and their resources, the nodes' Docker
daemons and the registry. A *recipe* (`recipes/*.toml`) says what runs: the
model, the tasks, the engines, the sandboxes, the trainer, GRPO and the loop.
Each section's dataclass lives beside the component it configures.

    recipe = load_recipe(Path("recipes/local-smoke.toml"))
    profile = load_profile(recipe.run.profile)
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from rl360cli.backends.slurm_options import SlurmOptions, check_time_limit
from rl360cli.configload import ConfigError, load_toml
from rl360cli.inference.config import EngineConfig
from rl360cli.rl.config import GRPOConfig
from rl360cli.rl.loop_config import LoopConfig, RolloutConfig
from rl360cli.sandbox.config import SandboxConfig
from rl360cli.trainer.config import ModelConfig, TrainerConfig

TIERS = ("service", "training", "rollout")
_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")


# ----------------------------------------------------------------------------- cluster profile


@dataclass(frozen=True, kw_only=True, slots=True)
class TierSpec:
    num_nodes: int = 1
    gpus_per_node: int = 0
    # Slurm: CPUs and memory asked per node (None: the partition's default / the whole node if exclusive).
    cpus_per_node: int | None = None
    memory_gb_per_node: float | None = None
    # Local backend: the fraction of this machine's CPUs and memory the tier reserves, and
    # optionally the CPUs its components are pinned to (so tiers do not compete for cores).
    share: float = 1 / 3
    cpu_list: tuple[int, ...] = ()
    # Slurm: per-tier overrides of the profile's [slurm] options.
    partition: str | None = None
    constraint: str | None = None
    time_limit: str | None = None

    def __post_init__(self) -> None:
        if self.num_nodes < 1:
            raise ValueError(f"num_nodes must be at least 1 (got {self.num_nodes})")
        if self.gpus_per_node < 0:
            raise ValueError(f"gpus_per_node must be >= 0 (got {self.gpus_per_node})")
        if self.cpus_per_node is not None and self.cpus_per_node < 1:
            raise ValueError(f"cpus_per_node must be at least 1 (got {self.cpus_per_node})")
        if not 0 < self.share <= 1:
            raise ValueError(f"share must be in (0, 1] (got {self.share})")
        if any(c < 0 for c in self.cpu_list):
            raise ValueError(f"cpu_list holds CPU numbers >= 0 (got {list(self.cpu_list)})")
        if self.time_limit is not None:
            check_time_limit(self.time_limit)


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
    # Disk the image cache may use on this node.
    disk_budget_gb: float = 50.0

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise ValueError(f"node name {self.name!r} must be lowercase letters, digits, '.', '_' or '-'")
        if not self.docker_host.startswith(("unix://", "ssh://", "tcp://")):
            raise ValueError(f"docker_host must start with unix://, ssh:// or tcp:// (got {self.docker_host!r})")
        if self.cpus <= 0 or self.memory_mb <= 0 or self.disk_budget_gb <= 0:
            raise ValueError("cpus, memory_mb and disk_budget_gb must be positive")


@dataclass(frozen=True, kw_only=True, slots=True)
class RegistrySpec:
    address: str = "127.0.0.1:5000"
    # Image pulls in flight at once across all nodes, to stay within the registry's capacity.
    max_concurrent_pulls: int = 8
    insecure: bool = True

    def __post_init__(self) -> None:
        if self.max_concurrent_pulls < 1:
            raise ValueError(f"max_concurrent_pulls must be at least 1 (got {self.max_concurrent_pulls})")


@dataclass(frozen=True, kw_only=True, slots=True)
class ClusterProfile:
    name: str
    backend: Literal["local", "slurm"] = "local"
    # Where run folders (logs, metrics, checkpoints) go; on Slurm a folder every node sees.
    # Empty: `runs/` beside the state file.
    run_root: str = ""
    # Services bind here; local engines and the router take ports from base_port up.
    bind_host: str = "127.0.0.1"
    base_port: int = 31000
    # Gloo/NCCL rendezvous port for the weight broadcast.
    sync_port: int = 29600
    tiers: dict[str, TierSpec] = field(default_factory=lambda: {t: TierSpec() for t in TIERS})
    slurm: SlurmOptions | None = None
    nodes: tuple[NodeSpec, ...] = ()
    registry: RegistrySpec = field(default_factory=RegistrySpec)
    # The image list for `rl360 prewarm-images` (images/images.toml).
    images: str = "images/images.toml"

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise ValueError(f"name {self.name!r} must be lowercase letters, digits, '.', '_' or '-'")
        missing = [t for t in TIERS if t not in self.tiers]
        unknown = [t for t in self.tiers if t not in TIERS]
        if missing or unknown:
            raise ValueError(f"tiers must be exactly {', '.join(TIERS)} (missing {missing}, unknown {unknown})")
        if self.backend == "slurm" and self.slurm is None:
            raise ValueError("backend 'slurm' needs a [slurm] table (at least partition)")
        if self.backend == "local":
            total = sum(t.share for t in self.tiers.values())
            if total > 1.0001:
                raise ValueError(f"the tiers' shares add up to {total:.2f}; they must not exceed 1")
        if not 1024 <= self.base_port <= 65000 or not 1024 <= self.sync_port <= 65535:
            raise ValueError("base_port and sync_port must be between 1024 and 65000")
        names = [n.name for n in self.nodes]
        if len(set(names)) != len(names):
            raise ValueError(f"node names must be unique (got {names})")

    def node(self, name: str) -> NodeSpec:
        for node in self.nodes:
            if node.name == name:
                return node
        raise ConfigError(
            f"node '{name}' is not in profile '{self.name}'",
            f"use one of: {', '.join(n.name for n in self.nodes) or '(the profile lists no nodes)'}",
        )


# ----------------------------------------------------------------------------- recipe


@dataclass(frozen=True, kw_only=True, slots=True)
class RunSpec:
    name: str
    seed: int = 0
    # The cluster profile this recipe runs on unless `--profile` says otherwise (relative to the recipe).
    profile: str = "../cluster/local.toml"

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise ValueError(f"name {self.name!r} must be lowercase letters, digits, '.', '_' or '-'")


@dataclass(frozen=True, kw_only=True, slots=True)
class TasksConfig:
    # A Harbor dataset: a folder of task folders (task.toml, instruction.md, tests/test.sh, ...).
    path: str
    # Only these task folder names (all when empty).
    include: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True, slots=True)
class MetricsConfig:
    # W&B: offline unless WANDB_API_KEY is set; the offline files stay in the run folder.
    wandb: bool = True
    wandb_project: str = "rl360"


@dataclass(frozen=True, kw_only=True, slots=True)
class Recipe:
    run: RunSpec
    tasks: TasksConfig
    model: ModelConfig = field(default_factory=ModelConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    grpo: GRPOConfig = field(default_factory=GRPOConfig)
    loop: LoopConfig = field(default_factory=LoopConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)

    def __post_init__(self) -> None:
        if self.rollout.max_new_tokens >= self.rollout.max_total_tokens:
            raise ValueError("rollout.max_new_tokens must be smaller than rollout.max_total_tokens")


def load_recipe(path: Path | str, *, base_dir: Path | str | None = None) -> Recipe:
    """Load a recipe; relative paths in it (tasks, model) are relative to `base_dir`, by default
    the recipe file's own folder, so a recipe means the same thing from any working folder."""
    path = Path(path)
    recipe = load_toml(Recipe, path)
    base = Path(base_dir) if base_dir else path.parent
    tasks = dataclasses.replace(recipe.tasks, path=str((base / recipe.tasks.path).absolute()))
    run = dataclasses.replace(recipe.run, profile=str((base / recipe.run.profile).absolute()))
    model = recipe.model
    if model.kind == "huggingface" and model.path and not Path(model.path).is_absolute():
        model = dataclasses.replace(model, path=str((base / model.path).absolute()))
    return dataclasses.replace(recipe, run=run, tasks=tasks, model=model)


def load_profile(path: Path | str) -> ClusterProfile:
    return load_toml(ClusterProfile, Path(path))
