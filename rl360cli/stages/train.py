"""Stage `train`: start the run's trainer on the training tier.

The trainer component (`python -m rl360cli.run.driver`) sets up Ray and the
session actors, the trainer and the weight broadcast, and runs the loop. It
finds the run's engines and router in the state file, so `serve` comes first.
Idempotent: a trainer of this run that is already running is left alone.
"""

from __future__ import annotations

import dataclasses
import shutil
import sys

from rl360cli.agent.harnesses import check_python_harness
from rl360cli.agent.installed import check_installed
from rl360cli.agent.terminus_2 import harbor_python
from rl360cli.backends.base import ComponentSpec
from rl360cli.ports import free_port
from rl360cli.stages.base import Action, Context, python_argv, start_component
from rl360cli.state import queries
from rl360cli.state.schema import ComponentRecord
from rl360cli.trainer.megatron_launch import TrainerLayout, cluster_trainer_argv, trainer_argv

NAME = "train"


def applies(ctx: Context) -> bool:
    return ctx.recipe is not None


# The trainer is the run's Ray driver: the session actors' output reaches the run's log through it. Ray folds
# lines of several actors that differ only in their numbers ("[session g3-1] ..." and "[session g4-0] ..." are
# one line, "repeated 2x"); a harness's `session.log` lines must reach the log whole (16 sessions gave 13 lines).
DRIVER_ENV = {"RAY_DEDUP_LOGS": "0"}
# The first training node's address, before the tier is provisioned (a plan shows it like this).
FIRST_TRAINING_NODE = "<training[0]>"


def trainer_spec(ctx: Context, *, resume: bool = False, calibrate: int | None = None) -> ComponentSpec:
    driver_args = ("--state", str(ctx.state.path.absolute()), "--run", ctx.run_id or "")
    if resume:
        driver_args += ("--resume",)
    trainer = ctx.need_recipe().trainer
    node = None
    # A synchronous loop updates while generation waits: on this machine the update has every core
    # (on 2 cores, 2 threads train local-smoke's batch in 2.2 s instead of 4).
    alone = not ctx.need_recipe().loop.overlap
    if calibrate:  # no trainer is built: one process, whatever the trainer's kind
        argv = python_argv(ctx, "rl360cli.run.driver", *driver_args, "--calibrate", str(calibrate))
        env = thread_env(ctx, "training")
    elif trainer.kind == "megatron" and not ctx.backend.on_this_machine:

        # One torchrun per training node (one Slurm task each, on every node of the tier), meeting at
        # the first node by torchrun's c10d rendezvous: world = TP x PP x DP over the tier's GPUs.
        layout = megatron_layout(ctx)
        nodes = queries.tier_nodes(ctx.state.read(), "training") or [FIRST_TRAINING_NODE]
        # One node: its ranks meet on loopback (no name to resolve).
        host = nodes[0] if layout.nodes > 1 else "127.0.0.1"
        argv = cluster_trainer_argv(driver_args, layout, rendezvous_host=host,
                                    port=ctx.profile.base_port + 91, run_id=ctx.run_id or "",
                                    python=ctx.backend.python)
        env, node = thread_env(ctx, "training"), "*"
    elif trainer.kind == "megatron":

        # One rank per tensor x pipeline shard on this machine; rank 0 runs the loop, the others follow.
        ranks = trainer.tensor_parallel * trainer.pipeline_parallel
        argv = trainer_argv(driver_args, nproc_per_node=ranks, master_addr="127.0.0.1", master_port=free_port(),
                            rdzv_id=f"rl360-{ctx.run_id}", python=ctx.backend.python)
        env = {**thread_env(ctx, "training", sharing=ranks, alone=alone), "GLOO_SOCKET_IFNAME": "lo"}
    else:
        argv, env = python_argv(ctx, "rl360cli.run.driver", *driver_args), thread_env(ctx, "training", alone=alone)
    return ComponentSpec(name="trainer", tier="training", stage=NAME, kind="trainer", argv=argv, run=ctx.run_id,
                         env={**env, **DRIVER_ENV}, node=node)


def megatron_layout(ctx: Context):
    """TP x PP x DP of the megatron trainer over the training tier's GPUs (one rank per GPU)."""
    trainer, tier = ctx.need_recipe().trainer, ctx.profile.tiers["training"]
    return TrainerLayout.of(tensor_parallel=trainer.tensor_parallel, pipeline_parallel=trainer.pipeline_parallel,
                            nodes=tier.num_nodes, ranks_per_node=max(1, tier.gpus_per_node))


def check_harness(ctx: Context) -> None:
    """A user's `[agent] harness = "python:module:function"` imported as the session actors will import it (the
    components' interpreter, this environment and working folder, which the trainer and its actors inherit);
    `Rl360Error` in one line if it does not, so `plan`, `--dry-run` and `up` refuse it before anything starts.
    "terminus-2" needs harbor's interpreter (.venv-harbor/): refused the same way when it is missing; an installed
    agent, the docker provider and an egress proxy (installed.py's `check_installed`)."""
    harness = ctx.need_recipe().agent.harness
    if harness.startswith("python:"):
        check_python_harness(harness, python=shutil.which(ctx.backend.python) or sys.executable)
    if harness == "terminus-2":  # harbor's own interpreter, which the actors start Terminus-2 with
        harbor_python(ctx.need_recipe().agent)
    # An installed agent: its settings, a provider that builds its image layer, the egress proxy for its door.
    check_installed(ctx.need_recipe().agent, provider=ctx.need_recipe().sandbox.provider,
                    egress_mode=ctx.profile.egress.mode, ca_bundle=ctx.profile.egress.ca_bundle)


def plan(ctx: Context) -> list[Action]:
    recipe = ctx.need_recipe()
    check_harness(ctx)
    spec = trainer_spec(ctx)
    detail = (f"{recipe.trainer.kind} trainer, {recipe.loop.num_steps} steps of {recipe.loop.num_tasks_per_step} "
              f"tasks x {recipe.loop.num_samples_per_task} samples, overlap {'on' if recipe.loop.overlap else 'off'}, "
              f"{recipe.rollout.num_session_actors} Ray session actors")
    if recipe.trainer.kind == "megatron" and not ctx.backend.on_this_machine:
        detail += f"; {megatron_layout(ctx).describe()}, one torchrun per training node"
    return [Action(stage=NAME, verb="start", subject=spec.id, detail=detail, command=spec.argv)]


def apply(ctx: Context, *, resume: bool = False) -> ComponentRecord:
    run = queries.run(ctx.state.read(), ctx.run_id)
    resume = resume or bool(run and run["resumed"])
    spec = trainer_spec(ctx, resume=resume, calibrate=run.get("calibrate") if run else None)
    ray = ctx.backend.ray_cluster(ctx.state.read(), run=ctx.run_id, token_path=ctx.run_dir / "ray" / "auth_token",
                                  port=ray_port(ctx))
    for ray_spec in ray.components:
        start_component(ctx, ray_spec)
    if ray.address:  # the trainer joins it as the driver; else it starts a private Ray instance
        spec = dataclasses.replace(spec, argv=(*spec.argv, "--ray-address", ray.address), env={**spec.env, **ray.env})
    return start_component(ctx, spec)


def ray_port(ctx: Context) -> int:
    """The Ray head's port: the profile's ports, so two clusters on one machine do not meet."""
    return ctx.profile.base_port + 90


def thread_env(ctx: Context, tier: str, *, sharing: int = 1, alone: bool = False) -> dict[str, str]:
    """Math-library threads for a component: its tier's CPUs shared among `sharing` components.
    `alone`: the component computes only while the other tiers on its nodes wait (the trainer of a
    synchronous loop), so it takes their CPUs too."""
    tiers = queries.tiers(ctx.state.read())
    own = tiers.get(tier)
    cpus = _cpus(own)
    if alone and own:
        cpus += sum(_cpus(other) for name, other in tiers.items()
                    if name != tier and set(other.get("nodes") or ()) == set(own.get("nodes") or ()))
    # 0.4 + 0.8 + 0.8 CPUs are 2 CPUs, not 1.9999...
    threads = str(max(1, int(cpus / sharing + 1e-6)))
    # Idle OpenMP threads that spin steal the cores other components need (decode steps 15x slower).
    return {"OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads, "OMP_WAIT_POLICY": "PASSIVE"}


def _cpus(tier_record: dict | None) -> float:
    return (tier_record["resources"]["cpus"] if tier_record else None) or 1
