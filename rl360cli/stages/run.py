"""Runs: the record of one training run in the state file, and its folder.

The run folder holds the recipe as it was started (`recipe.toml`, plus
`overrides.json` for command-line overrides), the components' logs,
`metrics.jsonl`, checkpoints and W&B's offline files.
"""

from __future__ import annotations

from rl360cli.config import save_run_recipe
from rl360cli.errors import Rl360Error
from rl360cli.stages.base import Context, new_run_id
from rl360cli.state import RUN_ACTIVE, RunStatus, StateDoc, now_iso


def start_run(ctx: Context, *, resume: bool = False) -> str:
    """Create (or, with `resume`, reopen) the recipe's run; make it the current run."""
    recipe = ctx.need_recipe()
    doc = ctx.state.read()
    for run_id, run in doc["runs"].items():
        if run["status"] in RUN_ACTIVE and not (resume and run["name"] == recipe.run.name):
            raise Rl360Error(f"run {run_id} is still {run['status']}",
                             "follow it with `rl360 logs --follow`, or stop it with `rl360 down`")
    if resume:
        ctx.run_id = _last_run_of(doc, recipe.run.name)
    else:
        ctx.run_id = new_run_id(recipe)
    run_dir = ctx.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    save_run_recipe(run_dir, recipe, ctx.recipe_path, copy_recipe=not resume)
    with ctx.state.update() as doc:
        run = doc["runs"].setdefault(ctx.run_id, {
            "name": recipe.run.name, "recipe": str(ctx.recipe_path), "run_dir": str(run_dir),
            "metrics_path": str(run_dir / "metrics.jsonl"), "started_at": now_iso(), "step": 0,
            "policy_version": 0, "num_steps": recipe.loop.num_steps,
        })
        run.update(status=RunStatus.STARTING, resumed=resume)
        doc["current_run"] = ctx.run_id
    ctx.event("up", "start", f"run {ctx.run_id}", resume=resume)
    ctx.say(f"run {ctx.run_id}: {run_dir}")
    return ctx.run_id


def _last_run_of(doc: StateDoc, name: str) -> str:
    runs = [(r["started_at"], rid) for rid, r in doc["runs"].items() if r["name"] == name]
    if not runs:
        raise Rl360Error(f"there is no earlier run of recipe '{name}' to resume", "start one without --resume")
    return max(runs)[1]

