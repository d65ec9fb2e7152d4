"""`rl360 train`: start the current run's trainer (after `rl360 serve`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from rl360cli.commands.common import DryRunOpt, JsonFlag, ProfileOpt, RunOpt, context, print_action, print_json
from rl360cli.errors import Rl360Error
from rl360cli.stages import train as train_stage
from rl360cli.config import load_run_recipe


def train(
    run: RunOpt = None,
    profile: ProfileOpt = None,
    resume: Annotated[bool, typer.Option("--resume", help="Continue from the run's last checkpoint.")] = False,
    dry_run: DryRunOpt = False,
    json_out: JsonFlag = False,
) -> None:
    """Start the trainer of the current run on the training tier; the loop runs until the last step.

    Example: rl360 train --resume
    """
    ctx = context(profile=profile, run=run, quiet=json_out)
    record = ctx.state.read()["runs"].get(ctx.run_id or "")
    if record is None:
        raise Rl360Error("there is no run to train", "start one with `rl360 serve --recipe FILE` (or `rl360 up`)")
    ctx.recipe = load_run_recipe(Path(record["run_dir"]))
    if dry_run:
        for action in train_stage.plan(ctx):
            print_action(action)
        return
    rec = train_stage.apply(ctx, resume=resume)
    if json_out:
        print_json(rec)
