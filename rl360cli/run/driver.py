"""The trainer component of a run: sets up Ray, the session actors, the trainer and the weight
broadcast, runs the loop, and keeps the run's record in the state file current.

    python -m rl360cli.run.driver --state .rl360/state.json --run RUN_ID [--resume]

`rl360 train` (and `rl360 up`) start it on the training tier; it finds the
engines and the router of its run in the state file, and the recipe in the
run folder. Under torchrun (the megatron trainer) rank 0 runs the loop and
ranks > 0 follow it (`follow_run`).

An engine that dies is the run's control plane's to start again (run/control.py, a component of its own);
the trainer leaves it out of the weight syncs meanwhile and takes it back into the weight-update group at
its version when the control plane asks (run/rejoin.py). The run's parts are put together in
run/parts.py (`read_setup`, `build_training`), where the loop and the rejoins take turns on the trainer's
weights: a rejoin never sends weights that a train step is halfway through changing.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
import traceback
from pathlib import Path

from rl360cli.config import RUN_RECIPE, load_run_recipe, run_policy_dir
from rl360cli.inference.client import EngineClient, EngineError
from rl360cli.loop.samples import SAMPLES, TRAJECTORIES, SampleKeeper
from rl360cli.metrics import MetricsLogger
from rl360cli.progress import GenerationProgress
from rl360cli.run.calibrate import calibrate
from rl360cli.run.parts import build_training, read_setup, start_actors
from rl360cli.run.session_actors import close_actors, log, route_table, run_task_ids, wait_actors_ready
from rl360cli.run.tier_watch import RolloutTierWatch
from rl360cli.state import queries, transitions
from rl360cli.state.schema import RunStatus, StateDoc, StateError
from rl360cli.state.store import StateFile

# How long the run's end waits for a state file a stuck command holds locked (one lock timeout each try).
FINAL_RECORD_PATIENCE_S = 600.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rl360cli.run.driver")
    parser.add_argument("--state", required=True)
    parser.add_argument("--run", required=True)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--ray-address", default=None, help="join this Ray cluster instead of starting one")
    parser.add_argument("--calibrate", type=int, default=None, metavar="K",
                        help="attempt each task K times on policy v0 and train nothing (run/calibrate.py)")
    args = parser.parse_args(argv)
    if int(os.environ.get("RANK", "0")) > 0:
        return follow_run(args.state, args.run)
    state = StateFile(args.state)
    try:
        if args.calibrate:
            summary = calibrate(state, args.run, k=args.calibrate, ray_address=args.ray_address)
        else:
            summary = run(state, args.run, resume=args.resume, ray_address=args.ray_address)
    except Exception as e:  # noqa: BLE001 — whatever ends the run is recorded, then the component fails
        if queries.run_was_stopped(state.read(), args.run):
            # `rl360 down` stopped the run and is stopping its engines: what that breaks here is no failure.
            log(f"run {args.run} was stopped ({type(e).__name__} as its components went)")
            return 0
        traceback.print_exc()
        end_run_patiently(state, args.run, RunStatus.FAILED, reason=f"{type(e).__name__}: {e}"[:300])
        return 3
    end_run_patiently(state, args.run, RunStatus.FINISHED, **summary)
    return 0


def run(state: StateFile, run_id: str, *, resume: bool, ray_address: str | None) -> dict:
    import ray

    from rl360cli.loop.eval import Evaluation
    from rl360cli.loop.train_loop import LoopParts, train_loop
    from rl360cli.rollout.rollouts import Rollouts

    doc = state.read()
    setup = read_setup(doc, run_id)
    recipe, run_dir = setup.recipe, setup.run_dir
    log(f"run {run_id}: {len(setup.engines)} engines behind {setup.router}, policy {setup.policy_dir}")

    # Ray and the session actors start first and get ready in their own processes while the trainer loads
    # its policy and joins the engines (a tiny run's Ray and actor take ~7 s, its trainer ~3 s). On this
    # thread: started from another one, Ray's driver took ~16 s longer to shut down (measured).
    actors = start_actors(setup, doc, ray_address=ray_address)
    try:
        training = build_training(state, setup, resume=resume)
        wait_actors_ready(actors, recipe, in_cluster=ray_address is not None)
    except BaseException:
        ray.shutdown()
        raise
    task_ids = run_task_ids(recipe.tasks.path, recipe.tasks.include)
    rollouts = Rollouts(actors, task_ids, num_tasks_per_step=recipe.loop.num_tasks_per_step,
                        num_samples_per_task=recipe.loop.num_samples_per_task,
                        max_generation_rounds=recipe.loop.max_generation_rounds, seed=recipe.run.seed,
                        over_sample=recipe.loop.over_sample, resample_below=recipe.loop.resample_below,
                        resample_from_step=recipe.loop.resample_from_step,
                        max_staleness=recipe.grpo.max_staleness,
                        recovery_timeout_s=recipe.rollout.recovery_timeout_s)
    table = route_table(doc, recipe, setup.profile, actors, in_cluster=ray_address is not None)
    # After a lost node no new group goes out before the requeued tier serves again (run/tier_watch.py).
    rollouts.use_tier_watch(RolloutTierWatch(
        state=state, run_id=run_id, api_key=setup.api_key, log=log,
        route=lambda now: route_table(state.read(), recipe, setup.profile, now, in_cluster=ray_address is not None)))
    if table is not None:
        rollouts.use_routing(table)
        log(f"groups go to the actors of nodes that hold their task's image ({len(table.task_images)} tasks with "
            f"one; actors on {', '.join(sorted(set(table.actor_nodes)))})")
    metrics = MetricsLogger(run_dir, run_name=run_id, project=recipe.metrics.wandb_project,
                            config={"recipe": str(run_dir / RUN_RECIPE)}, use_wandb=recipe.metrics.wandb)

    def on_step(step: int, version: int, values: dict) -> None:
        record_progress(state, run_id, step=step, policy_version=version, reward_mean=values.get("reward_mean"))
        log(f"step {step}/{recipe.loop.num_steps}: reward {_fmt(values.get('reward_mean'))} "
            f"pass {_fmt(values.get('pass_rate'))} infra {values['infra_failures']} "
            f"train {values['train_s']:.2f}s sync {_fmt(values.get('weight_sync_s'))}s "
            f"overlap {_fmt(values.get('overlap_ratio'))} step {values['step_s']:.1f}s")

    transitions.mark_run_running(state, run_id, pid=os.getpid())
    try:
        if queries.run_was_stopped(state.read(), run_id):  # `rl360 down` came while this trainer was setting up
            raise RuntimeError("the run was stopped before its loop began")
        parts = LoopParts(rollouts=rollouts, trainer=training.trainer, weight_sync=training.weight_sync,
                          loop=recipe.loop, grpo=recipe.grpo, checkpoint_every=recipe.trainer.checkpoint_every,
                          checkpoint_dir=run_dir / "checkpoints", log=metrics.log, on_step=on_step,
                          keep_samples=SampleKeeper(run_dir / SAMPLES, setup.policy_dir,
                                                    trajectories_path=run_dir / TRAJECTORIES, seed=recipe.run.seed),
                          evaluation=Evaluation.from_config(recipe.eval, pass_threshold=recipe.grpo.pass_threshold),
                          progress=GenerationProgress(run_dir), task_pool=recipe.tasks.adaptive_pool)
        ended = train_loop(parts, start_step=training.start_step)
        # Megatron: release the follower ranks (on failure torchrun ends them when rank 0 exits).
        training.trainer.close()
        # Every engine of the run where it is now (one its backend moved has a new URL; a dead one says None).
        versions = engine_versions(run_engine_urls(state.read(), run_id), api_key=setup.api_key)
    finally:
        training.rejoins.stop(timeout_s=5)
        metrics.close()
        close_actors(actors)
        training.weight_sync.close()
    if "ended_early" in ended:
        log(f"run {run_id} ended early: {ended['ended_early']}")
    return {"policy_version": training.trainer.version, "engine_versions": versions,
            **({"reason": f"ended early: {ended['ended_early']}"} if "ended_early" in ended else {})}


def follow_run(state_path: str, run_id: str) -> int:
    """Ranks > 0 of the megatron trainer under torchrun: build this rank's shard of the run's trainer
    and run rank 0's commands on it until rank 0 closes it. Never touches the state file's records
    (rank 0 keeps them)."""
    from rl360cli.trainer.megatron_trainer import MegatronTrainer, default_device

    run_dir = Path(queries.run(StateFile(state_path).read(), run_id)["run_dir"])
    recipe = load_run_recipe(run_dir)
    MegatronTrainer(run_policy_dir(run_dir), recipe.trainer, recipe.grpo, seed=recipe.run.seed,
                    temperature=recipe.rollout.temperature,
                    device=default_device()).serve()
    return 0


def run_engine_urls(doc: StateDoc, run_id: str) -> list[str]:
    """The URLs of every engine of the run, live or not."""
    return sorted(rec["url"] for rec in queries.run_components(doc, run_id).values()
                  if rec["kind"].startswith("engine") and rec.get("url"))


def engine_versions(urls: list[str], *, api_key: str | None = None) -> dict[str, int | None]:
    """The policy version each engine serves now (None for one that does not answer)."""


    async def ask(url: str) -> int | None:
        async with EngineClient(url, api_key=api_key) as client:
            try:
                return await client.weight_version()
            except EngineError:
                return None

    async def ask_all() -> list[int | None]:
        return await asyncio.gather(*(ask(url) for url in urls))

    return dict(zip(urls, asyncio.run(ask_all())))


def record_progress(state: StateFile, run_id: str, *, step: int, policy_version: int,
                    reward_mean: float | None) -> bool:
    """A step's progress, which the next step records again: a state file locked past its timeout (a stuck
    command holds it) is said in the log and does not end the run. True if recorded."""
    try:
        transitions.record_run_progress(state, run_id, step=step, policy_version=policy_version,
                                        reward_mean=reward_mean)
        return True
    except StateError as e:
        log(f"progress not recorded in the state file ({e.problem}); the run goes on")
        return False


def end_run_patiently(state: StateFile, run_id: str, status: RunStatus, *, reason: str | None = None,
                      patience_s: float = FINAL_RECORD_PATIENCE_S, **summary) -> None:
    """The run's end, which nothing records later: a locked state file is waited for (`patience_s`, one lock
    timeout after the other) before it fails. A run `rl360 down` stopped stays stopped."""
    deadline = time.monotonic() + patience_s
    while True:
        try:
            transitions.end_run(state, run_id, status, reason=reason, **summary)
            return
        except StateError as e:
            if time.monotonic() >= deadline:
                raise
            log(f"the run's end is not recorded yet ({e.problem}); trying again")


def _fmt(value) -> str:
    return "-" if value is None else f"{value:.3f}"


if __name__ == "__main__":
    sys.exit(main())
