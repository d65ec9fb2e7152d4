"""Runs: the record of one training run in the state file, and its folder.

The run folder holds the recipe as it was started (`recipe.toml`, plus
`overrides.json`: the `--set` overrides as typed), the components' logs,
`metrics.jsonl`, checkpoints and W&B's offline files. The run's record lists
the overrides too (`rl360 status` shows them).
"""

from __future__ import annotations

from collections.abc import Sequence

from rl360cli.config import Override, load_run_recipe, record_run_overrides, run_overrides, save_run_recipe
from rl360cli.errors import Rl360Error
from rl360cli.stages.base import Context, new_run_id
from rl360cli.state import RUN_ACTIVE, RunStatus, StateDoc, now_iso


def start_run(ctx: Context, *, resume: bool = False, overrides: Sequence[Override] = ()) -> str:
    """Create (or, with `resume`, reopen) the recipe's run; make it the current run. `ctx.recipe` is the
    recipe with `overrides` applied; a resumed run keeps its recipe file and the overrides it had, and
    `overrides` add to them (then `ctx.recipe` becomes that recipe, which its trainer reads too)."""
    recipe = ctx.need_recipe()
    doc = ctx.state.read()
    for run_id, run in doc["runs"].items():
        if run["status"] in RUN_ACTIVE and not (resume and run["name"] == recipe.run.name):
            raise Rl360Error(f"run {run_id} is still {run['status']}",
                             "follow it with `rl360 logs --follow`, or stop it with `rl360 down`")
    if resume:
        ctx.run_id = _last_run_of(doc, recipe.run.name)
        # Checked before anything is written: a bad override leaves the run as it was.
        recipe = ctx.recipe = load_run_recipe(ctx.run_dir, extra=overrides)
        overrides = [*run_overrides(ctx.run_dir), *overrides]
        record_run_overrides(ctx.run_dir, overrides)
    else:
        ctx.run_id = new_run_id(recipe)
        ctx.run_dir.mkdir(parents=True, exist_ok=True)
        save_run_recipe(ctx.run_dir, ctx.recipe_path, overrides, copy_recipe=True)
    run_dir = ctx.run_dir
    with ctx.state.update() as doc:
        run = doc["runs"].setdefault(ctx.run_id, {
            "name": recipe.run.name, "recipe": str(ctx.recipe_path), "run_dir": str(run_dir),
            "metrics_path": str(run_dir / "metrics.jsonl"), "started_at": now_iso(), "step": 0,
            "policy_version": 0, "num_steps": recipe.loop.num_steps,
        })
        run.update(status=RunStatus.STARTING, resumed=resume, num_steps=recipe.loop.num_steps,
                   overrides=[o.text for o in overrides])
        doc["current_run"] = ctx.run_id
    ctx.event("up", "start", f"run {ctx.run_id}", resume=resume, overrides=[o.text for o in overrides])
    ctx.say(f"run {ctx.run_id}: {run_dir}")
    return ctx.run_id


def _last_run_of(doc: StateDoc, name: str) -> str:
    runs = [(r["started_at"], rid) for rid, r in doc["runs"].items() if r["name"] == name]
    if not runs:
        raise Rl360Error(f"there is no earlier run of recipe '{name}' to resume", "start one without --resume")
    return max(runs)[1]



def add_run_overrides(ctx: Context, overrides: Sequence[Override]) -> None:
    """Add `overrides` to the current run's (`rl360 train --set`, `rl360 serve --set` joining a run): checked
    first, so a bad one changes nothing; then `ctx.recipe` is the run's recipe with them."""
    if not overrides:
        return
    ctx.recipe = load_run_recipe(ctx.run_dir, extra=overrides)
    everything = [*run_overrides(ctx.run_dir), *overrides]
    record_run_overrides(ctx.run_dir, everything)
    with ctx.state.update() as doc:
        doc["runs"][ctx.run_id or ""].update(overrides=[o.text for o in everything],
                                             num_steps=ctx.recipe.loop.num_steps)
    ctx.event("train", "override", f"run {ctx.run_id}", overrides=[o.text for o in overrides])
