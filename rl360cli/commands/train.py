"""`rl360 train`: start the current run's trainer (after `rl360 serve`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from rl360cli.commands.common import (DryRunOpt, JsonFlag, ProfileOpt, RunOpt, SetOpt, context, overrides_of,
                                      print_action, print_json)
from rl360cli.config import load_run_recipe
from rl360cli.errors import Rl360Error
from rl360cli.stages import train as train_stage
from rl360cli.stages.lifecycle import add_run_overrides
from rl360cli.state import queries


def train(
    run: RunOpt = None,
    profile: ProfileOpt = None,
    resume: Annotated[bool, typer.Option("--resume", help="Continue from the run's last checkpoint.")] = False,
    set_values: SetOpt = None,
    dry_run: DryRunOpt = False,
    json_out: JsonFlag = False,
) -> None:
    """Start the trainer of the current run on the training tier; the loop runs until the last step.

    `--set` adds to the run's overrides (its engines, already serving, keep theirs).

    Example: rl360 train --resume --set trainer.lr=5e-4
    """
    overrides = overrides_of(set_values)
    ctx = context(profile=profile, run=run, quiet=json_out)
    record = queries.run(ctx.state.read(), ctx.run_id)
    if record is None:
        raise Rl360Error("there is no run to train", "start one with `rl360 serve --recipe FILE` (or `rl360 up`)")
    ctx.recipe = load_run_recipe(Path(record["run_dir"]), extra=overrides)
    if dry_run:
        for action in train_stage.plan(ctx):
            print_action(action)
        return
    add_run_overrides(ctx, overrides)
    rec = train_stage.apply(ctx, resume=resume)
    if json_out:
        print_json(rec)
