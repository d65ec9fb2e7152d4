"""`rl360 up` and `rl360 plan`: run every built stage in order, or show what that would do."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from rl360cli.commands.common import (DryRunOpt, JsonFlag, ProfileOpt, RecipeOpt, SetOpt, context, out, overrides_of,
                                      print_action, print_json)
from rl360cli.commands.watch import watch_run
from rl360cli.logview import FINAL_RUN
from rl360cli.stages.base import Action, Context
from rl360cli.stages.lifecycle import UP_STAGES, bring_up, start_run, was_stopped
from rl360cli.state import queries
from rl360cli.state.schema import RunStatus

DEFAULT_RECIPE = Path("recipes/local-smoke.toml")


def up(
    recipe: RecipeOpt = None,
    profile: ProfileOpt = None,
    dry_run: DryRunOpt = False,
    resume: Annotated[bool, typer.Option("--resume", help="Continue the recipe's last run from its checkpoint.")] = False,
    inject_failures: Annotated[
        float | None,
        typer.Option("--inject-failures", help="Fail this fraction of sandbox starts and execs "
                                               "(--set sandbox.inject_failure_rate=RATE).")
    ] = None,
    set_values: SetOpt = None,
    detach: Annotated[bool, typer.Option("--detach", help="Return once the run has started.")] = False,
    json_out: JsonFlag = False,
) -> None:
    """Provision the tiers, start the engines and the trainer, and follow the run to its end.

    Exit codes: 0 the run finished, 1 bad input, 3 the run failed, 4 the run was stopped (`rl360 down`).

    Example: rl360 up --recipe recipes/local-smoke.toml --set run.seed=3
    """
    overrides = overrides_of(set_values, inject_failures=inject_failures)
    ctx = context(recipe=recipe or DEFAULT_RECIPE, profile=profile, overrides=overrides, quiet=json_out)
    if dry_run:
        ctx.run_id = ctx.run_id if resume else "<new run>"
        _show_plan(ctx, json_out, overrides)
        return
    start_run(ctx, resume=resume, overrides=overrides)
    applied = bring_up(ctx)
    if was_stopped(ctx):  # `rl360 down` came while `up` was starting the run
        if not json_out:
            reason = queries.run(ctx.state.read(), ctx.run_id)["reason"]
            out.print(f"run {ctx.run_id} {RunStatus.STOPPED} before its loop began; {reason}")
        raise typer.Exit(FINAL_RUN[RunStatus.STOPPED])
    if json_out:
        print_json({"run": ctx.run_id, "state": str(ctx.state.path), "stages": applied})
    if not detach and "train" in applied:
        raise typer.Exit(watch_run(ctx, quiet=json_out))


def plan(recipe: RecipeOpt = None, profile: ProfileOpt = None, set_values: SetOpt = None,
         json_out: JsonFlag = False) -> None:
    """Show what `rl360 up` would do (tiers, nodes, components, resources, ports, exact commands); start nothing.

    Example: rl360 plan --recipe recipes/local-smoke.toml --profile cluster/reference-33-nodes.toml
    """
    overrides = overrides_of(set_values)
    ctx = context(recipe=recipe or DEFAULT_RECIPE, profile=profile, overrides=overrides, quiet=True)
    ctx.run_id = "<new run>"
    _show_plan(ctx, json_out, overrides)


def collect_plan(ctx: Context) -> list[Action]:
    actions: list[Action] = []
    for stage in UP_STAGES:
        if stage.applies(ctx):
            actions += stage.plan(ctx)
    return actions


def _show_plan(ctx: Context, json_out: bool, overrides: list) -> None:
    actions = collect_plan(ctx)
    texts = [o.text for o in overrides]
    if json_out:
        print_json({"profile": str(ctx.profile_path), "recipe": str(ctx.recipe_path), "overrides": texts,
                    "actions": [dataclasses.asdict(a) for a in actions]})
        return
    with_set = f" with --set {' '.join(texts)}" if texts else ""
    table = Table(title=f"plan: {ctx.recipe_path.name if ctx.recipe_path else ''}{with_set} on {ctx.profile.name}",
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
