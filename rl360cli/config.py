"""Recipes and cluster profiles: TOML files loaded into frozen dataclasses, validated at load time.

A *cluster profile* (`cluster/*.toml`) says where things run: the backend
(local or slurm), the three tiers and their resources, the nodes' Docker
daemons and the registry. A *recipe* (`recipes/*.toml`) says what runs: the
model, the tasks, the engines, the sandboxes, the trainer, GRPO and the loop.
Each section's dataclass lives beside the component it configures, in that
package's `config.py`; this module composes them and owns only the recipe's
own tables (`[run]`, `[tasks]`, `[metrics]`).

    recipe = load_recipe(Path("recipes/local-smoke.toml"))
    profile = load_profile(recipe.run.profile)

A run folder keeps the recipe it was started with (`save_run_recipe`), so the
processes of the run (the driver, the trainer's ranks) read it back with
`load_run_recipe(run_dir)`, the command line's overrides applied.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from rl360cli.agent.config import RolloutConfig
from rl360cli.backends.config import TIERS, SlurmOptions, TierSpec
from rl360cli.configload import NAME, ConfigError, load_toml
from rl360cli.images.config import RegistrySpec
from rl360cli.inference.config import EngineConfig
from rl360cli.loop.config import LoopConfig
from rl360cli.nodes.config import NodeSpec
from rl360cli.rl.config import GRPOConfig
from rl360cli.sandbox.config import SandboxConfig
from rl360cli.trainer.config import ModelConfig, TrainerConfig

# The files of a run folder that hold the recipe it was started with.
RUN_RECIPE = "recipe.toml"
RUN_OVERRIDES = "overrides.json"


def run_policy_dir(run_dir: Path) -> Path:
    """Where a run's policy version 0 is prepared (`rl360 serve`), which its engines and trainer load."""
    return run_dir / "policy" / "v0"


# ----------------------------------------------------------------------------- cluster profile


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
        if not NAME.match(self.name):
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
        if not NAME.match(self.name):
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


def save_run_recipe(run_dir: Path, recipe: Recipe, recipe_path: Path | None, *, copy_recipe: bool) -> None:
    """Keep in `run_dir` what `load_run_recipe` reads back: the recipe file (when `copy_recipe`) and
    the command line's overrides, with the folder relative paths in the recipe are taken from."""
    if recipe_path and copy_recipe:
        shutil.copyfile(recipe_path, run_dir / RUN_RECIPE)
    overrides = {"inject_failure_rate": recipe.sandbox.inject_failure_rate,
                 "base_dir": str(recipe_path.parent) if recipe_path else None}
    (run_dir / RUN_OVERRIDES).write_text(json.dumps(overrides))


def recipe_with_overrides(recipe: Recipe, overrides: dict) -> Recipe:
    """The recipe with the command line's overrides (`--inject-failures`) applied."""
    rate = overrides.get("inject_failure_rate")
    if rate is None or rate == recipe.sandbox.inject_failure_rate:
        return recipe
    try:
        sandbox = dataclasses.replace(recipe.sandbox, inject_failure_rate=rate)
    except ValueError as e:
        raise ConfigError(f"--inject-failures {rate}: {e}") from None
    return dataclasses.replace(recipe, sandbox=sandbox)


def load_run_recipe(run_dir: Path) -> Recipe:
    """The recipe a run was started with, overrides applied."""
    overrides_path = run_dir / RUN_OVERRIDES
    overrides = json.loads(overrides_path.read_text()) if overrides_path.exists() else {}
    recipe = load_recipe(run_dir / RUN_RECIPE, base_dir=overrides.get("base_dir"))
    return recipe_with_overrides(recipe, overrides)
