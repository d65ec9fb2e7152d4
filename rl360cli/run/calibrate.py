"""A calibration run's trainer component: every task of the run's set attempted k times on policy v0, each
task's figures written to the run folder's calibration.json (rl360cli/loop/calibration.py). Nothing is
trained: no trainer is built and the engines keep the weights they started with.

    python -m rl360cli.run.driver --state .rl360/state.json --run RUN_ID --calibrate 16

`rl360 tasks calibrate` starts such a run (its record says `calibrate: k`, so the train stage starts the
driver this way), waits for it, and picks the tasks in band from the table.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from rl360cli.config import load_profile, load_run_recipe, run_policy_dir
from rl360cli.inference.apikey import api_key_path, optional_api_key
from rl360cli.loop.calibration import CALIBRATION, task_figures, write_table
from rl360cli.run.session_actors import (close_actors, egress_route, engine_urls, launch_ray_and_actors, log,
                                         run_task_ids, wait_actors_ready)
from rl360cli.state import queries, transitions
from rl360cli.state.store import StateFile


def calibrate(state: StateFile, run_id: str, *, k: int, ray_address: str | None) -> dict:
    """Run the calibration; the run's end summary."""

    from rl360cli.rollout.rollouts import Rollouts

    doc = state.read()
    run_dir = Path(queries.run(doc, run_id)["run_dir"])
    recipe = load_run_recipe(run_dir)
    profile_path = queries.profile_path(doc)
    _, router = engine_urls(doc, run_id)
    api_key_file = str(api_key_path(run_dir)) if optional_api_key(run_dir) else None
    task_ids = run_task_ids(recipe.tasks.path, recipe.tasks.include)
    log(f"calibration {run_id}: {len(task_ids)} tasks x {k} samples through {router}")
    profile = load_profile(profile_path) if profile_path else None
    actors = launch_ray_and_actors(recipe, profile, run_id=run_id, policy_dir=run_policy_dir(run_dir), router=router,
                                   node_images=queries.image_digests(doc), ray_address=ray_address,
                                   api_key_file=api_key_file, egress=egress_route(doc, profile))
    try:
        wait_actors_ready(actors, recipe, in_cluster=ray_address is not None)
        transitions.mark_run_running(state, run_id, pid=os.getpid())
        started = time.time()
        # The held-out path of the loop's evaluation: one group of k sessions per task, nothing trained.
        rollouts = Rollouts(actors, task_ids, num_tasks_per_step=1, num_samples_per_task=k,
                            max_generation_rounds=1, seed=recipe.run.seed)
        trajectories = rollouts.collect_eval(rollouts.submit_eval(0, task_ids, k))
        rows = task_figures(trajectories, pass_threshold=recipe.grpo.pass_threshold)
        write_table(run_dir / CALIBRATION, rows, k=k, tasks_path=recipe.tasks.path, policy_version=0,
                    pass_threshold=recipe.grpo.pass_threshold, seconds=round(time.time() - started, 1))
        log(f"calibration {run_id}: {len(rows)} tasks in {time.time() - started:.1f}s -> {run_dir / CALIBRATION}")
    finally:
        close_actors(actors)
    return {"policy_version": 0}

