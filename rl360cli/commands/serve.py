"""`rl360 serve`: prepare the run's policy and start its engines and the router."""

from __future__ import annotations

from rl360cli.commands.common import (DryRunOpt, JsonFlag, ProfileOpt, RecipeOpt, SetOpt, context, overrides_of,
                                      print_action, print_json)
from rl360cli.commands.up import DEFAULT_RECIPE
from rl360cli.stages import serve as serve_stage
from rl360cli.stages.lifecycle import add_run_overrides, start_run
from rl360cli.state import queries
from rl360cli.state.schema import RUN_ACTIVE


def serve(recipe: RecipeOpt = None, profile: ProfileOpt = None, set_values: SetOpt = None,
          dry_run: DryRunOpt = False, json_out: JsonFlag = False) -> None:
    """Start the engines and the router of a run (a new run of the recipe unless one is starting).

    Example: rl360 serve --recipe recipes/local-smoke.toml --set engine.num_engines=2 && rl360 train
    """
    overrides = overrides_of(set_values)
    ctx = context(recipe=recipe or DEFAULT_RECIPE, profile=profile, overrides=overrides, quiet=json_out)
    if dry_run:
        ctx.run_id = "<new run>"
        for action in serve_stage.plan(ctx):
            print_action(action)
        return
    run = queries.run(ctx.state.read(), ctx.run_id)
    if run is None or run["status"] not in RUN_ACTIVE or run["name"] != ctx.need_recipe().run.name:
        start_run(ctx, overrides=overrides)
    else:
        add_run_overrides(ctx, overrides)  # the run that is starting: its recipe gets them too
    records = serve_stage.apply(ctx)
    if json_out:
        print_json({"run": ctx.run_id, "components": records})
