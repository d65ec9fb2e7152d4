"""`rl360 up` and `rl360 plan`: run every built stage in order, or show what that would do."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from rl360cli.commands.common import (DryRunOpt, JsonFlag, ProfileOpt, RecipeOpt, context, out, print_action,
                                      print_json)
from rl360cli.stages import up_stages
from rl360cli.stages.base import Action, Context
from rl360cli.config import recipe_with_overrides
from rl360cli.stages.run import start_run

DEFAULT_RECIPE = Path("recipes/local-smoke.toml")


def up(
    recipe: RecipeOpt = None,
    profile: ProfileOpt = None,
    dry_run: DryRunOpt = False,
    resume: Annotated[bool, typer.Option("--resume", help="Continue the recipe's last run from its checkpoint.")] = False,
    inject_failures: Annotated[
        float | None, typer.Option("--inject-failures", help="Fail this fraction of sandbox starts and execs.")
    ] = None,
    detach: Annotated[bool, typer.Option("--detach", help="Return once the run has started.")] = False,
    json_out: JsonFlag = False,
) -> None:
    """Provision the tiers, start the engines and the trainer, and follow the run to its end.

    Example: rl360 up --recipe recipes/local-smoke.toml
    """
    ctx = context(recipe=recipe or DEFAULT_RECIPE, profile=profile, quiet=json_out)
    if inject_failures is not None:
        ctx.recipe = recipe_with_overrides(ctx.need_recipe(), {"inject_failure_rate": inject_failures})
    if dry_run:
        ctx.run_id = ctx.run_id if resume else "<new run>"
        _show_plan(ctx, json_out)
        return
    start_run(ctx, resume=resume)
    applied = [stage.NAME for stage in up_stages() if stage.applies(ctx)]
    for stage in up_stages():
        if stage.NAME in applied:
            stage.apply(ctx)
    if json_out:
        print_json({"run": ctx.run_id, "state": str(ctx.state.path), "stages": applied})
    if not detach and "train" in applied:
        from rl360cli.commands.watch import watch_run

        raise typer.Exit(watch_run(ctx, quiet=json_out))


def plan(recipe: RecipeOpt = None, profile: ProfileOpt = None, json_out: JsonFlag = False) -> None:
    """Show what `rl360 up` would do (tiers, nodes, components, resources, ports, exact commands); start nothing.

    Example: rl360 plan --recipe recipes/local-smoke.toml --profile cluster/reference-33-nodes.toml
    """
    ctx = context(recipe=recipe or DEFAULT_RECIPE, profile=profile, quiet=True)
    ctx.run_id = "<new run>"
    _show_plan(ctx, json_out)


def collect_plan(ctx: Context) -> list[Action]:
    actions: list[Action] = []
    for stage in up_stages():
        if stage.applies(ctx):
            actions += stage.plan(ctx)
    return actions


def _show_plan(ctx: Context, json_out: bool) -> None:
    actions = collect_plan(ctx)
    if json_out:
        print_json({"profile": str(ctx.profile_path), "recipe": str(ctx.recipe_path),
                    "actions": [dataclasses.asdict(a) for a in actions]})
        return
    table = Table(title=f"plan: {ctx.recipe_path.name if ctx.recipe_path else ''} on {ctx.profile.name}",
                  show_lines=False)
    for column in ("stage", "action", "subject", "detail"):
        table.add_column(column)
    for a in actions:
        table.add_row(a.stage, a.verb, a.subject, a.detail)
    out.print(table)
    detailed = [a for a in actions if a.command or a.script]
    if detailed:
        out.print("\n[bold]exact commands[/bold]")
        for a in detailed:
            print_action(a)
