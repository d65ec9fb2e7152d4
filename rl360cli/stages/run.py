"""Runs: the record of one training run in the state file, and its folder.

The run folder holds the recipe as it was started (`recipe.toml`, plus
`overrides.json` for command-line overrides), the components' logs,
`metrics.jsonl`, checkpoints and W&B's offline files.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

from rl360cli.config import Recipe, load_recipe
from rl360cli.errors import Rl360Error
from rl360cli.stages.base import Context, new_run_id
from rl360cli.state import now_iso

ACTIVE = ("starting", "running")


def start_run(ctx: Context, *, resume: bool = False) -> str:
    """Create (or, with `resume`, reopen) the recipe's run; make it the current run."""
    recipe = ctx.need_recipe()
    doc = ctx.state.read()
    for run_id, run in doc["runs"].items():
        if run.get("status") in ACTIVE and not (resume and run.get("name") == recipe.run.name):
            raise Rl360Error(f"run {run_id} is still {run['status']}",
                             "follow it with `rl360 logs --follow`, or stop it with `rl360 down`")
    if resume:
        ctx.run_id = _last_run_of(doc, recipe.run.name)
    else:
        ctx.run_id = new_run_id(recipe)
    run_dir = ctx.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    if ctx.recipe_path and not resume:
        shutil.copyfile(ctx.recipe_path, run_dir / "recipe.toml")
    overrides = {"inject_failure_rate": recipe.sandbox.inject_failure_rate,
                 "base_dir": str(ctx.recipe_path.parent) if ctx.recipe_path else None}
    (run_dir / "overrides.json").write_text(json.dumps(overrides))
    with ctx.state.update() as doc:
        run = doc["runs"].setdefault(ctx.run_id, {
            "name": recipe.run.name, "recipe": str(ctx.recipe_path), "run_dir": str(run_dir),
            "metrics_path": str(run_dir / "metrics.jsonl"), "started_at": now_iso(), "step": 0,
            "policy_version": 0, "num_steps": recipe.loop.num_steps,
        })
        run.update(status="starting", resumed=resume)
        doc["current_run"] = ctx.run_id
    ctx.event("up", "start", f"run {ctx.run_id}", resume=resume)
    ctx.say(f"run {ctx.run_id}: {run_dir}")
    return ctx.run_id


def _last_run_of(doc: dict, name: str) -> str:
    runs = [(r.get("started_at", ""), rid) for rid, r in doc["runs"].items() if r.get("name") == name]
    if not runs:
        raise Rl360Error(f"there is no earlier run of recipe '{name}' to resume", "start one without --resume")
    return max(runs)[1]


def recipe_with_overrides(recipe: Recipe, overrides: dict) -> Recipe:
    """The recipe with the command line's overrides (`--inject-failures`) applied."""
    rate = overrides.get("inject_failure_rate")
    if rate is None or rate == recipe.sandbox.inject_failure_rate:
        return recipe
    try:
        sandbox = dataclasses.replace(recipe.sandbox, inject_failure_rate=rate)
    except ValueError as e:
        raise Rl360Error(f"--inject-failures {rate}: {e}") from None
    return dataclasses.replace(recipe, sandbox=sandbox)


def load_run_recipe(run_dir: Path) -> Recipe:
    """The recipe a run was started with, overrides applied."""
    overrides_path = run_dir / "overrides.json"
    overrides = json.loads(overrides_path.read_text()) if overrides_path.exists() else {}
    recipe = load_recipe(run_dir / "recipe.toml", base_dir=overrides.get("base_dir"))
    return recipe_with_overrides(recipe, overrides)
