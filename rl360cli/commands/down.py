"""`rl360 down`: stop everything the state knows and release the tiers."""

from __future__ import annotations

import dataclasses
from typing import Annotated

import typer

from rl360cli.commands.common import DryRunOpt, JsonFlag, ProfileOpt, context, out, print_action, print_json
from rl360cli.stages import down as down_stage


def down(
    profile: ProfileOpt = None,
    grace: Annotated[float, typer.Option("--grace", help="Seconds between SIGTERM and SIGKILL.")] = 10.0,
    dry_run: DryRunOpt = False,
    json_out: JsonFlag = False,
) -> None:
    """Stop every component and sandbox of the cluster and release its tiers; safe to run twice.

    Example: rl360 down --grace 5
    """
    ctx = context(profile=profile, quiet=json_out)
    if dry_run:
        actions = down_stage.plan(ctx)
        for a in actions:
            print_action(a)
        if not actions:
            out.print("nothing to stop")
        return
    stopped = down_stage.apply(ctx, grace_s=grace)
    if json_out:
        print_json(dataclasses.asdict(stopped))
    elif not stopped.anything:
        out.print("nothing was running")
