"""A run's lifecycle as the commands drive it: start it, bring it up, follow it, end it.

    run_id = start_run(ctx, overrides=overrides)         # the run's record and folder (`rl360 serve` too)
    stopped = bring_up(ctx)                               # the stages of `rl360 up`, in order
    for seen in follow(ctx):                              # until it ends; then what served it is stopped
        render(seen)

Stopping is `rl360 down`'s (stages/down.py): it marks the runs stopped first, then stops what runs. A run's
own processes (its trainer's driver, its control plane: rl360cli/run/) record its progress and its end.
Commands only parse options, call these and render what they return.

The run folder holds the recipe as it was started (`recipe.toml`, plus
`overrides.json`: the `--set` overrides as typed), the components' logs,
`metrics.jsonl`, checkpoints and W&B's offline files. The run's record lists
the overrides too (`rl360 status` shows them).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from rl360cli.config import Override, load_run_recipe, record_run_overrides, run_overrides, save_run_recipe
from rl360cli.errors import Rl360Error
from rl360cli.metrics import read_metrics
from rl360cli.progress import read_generation
from rl360cli.stages import egress, prewarm_builds, prewarm_images, prewarm_snapshots, provision, serve, train
from rl360cli.stages.base import Context, new_run_id
from rl360cli.stages.status import reconcile
from rl360cli.state import queries, transitions
from rl360cli.state.schema import RUN_FINAL, RunRecord, RunStatus


def start_run(ctx: Context, *, resume: bool = False, overrides: Sequence[Override] = (),
              calibrate: int | None = None) -> str:
    """Create (or, with `resume`, reopen) the recipe's run; make it the current run. `ctx.recipe` is the
    recipe with `overrides` applied; a resumed run keeps its recipe file and the overrides it had, and
    `overrides` add to them (then `ctx.recipe` becomes that recipe, which its trainer reads too).
    `calibrate`: a calibration run instead, that many samples per task on policy v0 (run/calibrate.py)."""
    recipe = ctx.need_recipe()
    train.check_harness(ctx)  # a user's harness that does not import is refused before anything is made
    doc = ctx.state.read()
    for run_id, run in queries.active_runs(doc).items():
        if not (resume and run["name"] == recipe.run.name):
            raise Rl360Error(f"run {run_id} is still {run['status']}",
                             "follow it with `rl360 logs --follow`, or stop it with `rl360 down`")
    if resume:
        ctx.run_id = queries.last_run_of(doc, recipe.run.name)
        if ctx.run_id is None:
            raise Rl360Error(f"there is no earlier run of recipe '{recipe.run.name}' to resume",
                             "start one without --resume")
        # Checked before anything is written: a bad override leaves the run as it was.
        recipe = ctx.recipe = load_run_recipe(ctx.run_dir, extra=overrides)
        overrides = [*run_overrides(ctx.run_dir), *overrides]
        record_run_overrides(ctx.run_dir, overrides)
    else:
        ctx.run_id = new_run_id(recipe)
        ctx.run_dir.mkdir(parents=True, exist_ok=True)
        save_run_recipe(ctx.run_dir, ctx.recipe_path, overrides, copy_recipe=True)
    run_dir = ctx.run_dir
    transitions.start_run(ctx.state, ctx.run_id, name=recipe.run.name, recipe=str(ctx.recipe_path),
                          run_dir=str(run_dir), num_steps=recipe.loop.num_steps, resumed=resume,
                          overrides=[o.text for o in overrides], calibrate=calibrate)
    ctx.event("up", "start", f"run {ctx.run_id}", resume=resume, overrides=[o.text for o in overrides])
    ctx.say(f"run {ctx.run_id}: {run_dir}")
    return ctx.run_id


def add_run_overrides(ctx: Context, overrides: Sequence[Override]) -> None:
    """Add `overrides` to the current run's (`rl360 train --set`, `rl360 serve --set` joining a run): checked
    first, so a bad one changes nothing; then `ctx.recipe` is the run's recipe with them."""
    if not overrides:
        return
    ctx.recipe = load_run_recipe(ctx.run_dir, extra=overrides)
    everything = [*run_overrides(ctx.run_dir), *overrides]
    record_run_overrides(ctx.run_dir, everything)
    transitions.set_run_overrides(ctx.state, ctx.run_id or "", overrides=[o.text for o in everything],
                                  num_steps=ctx.recipe.loop.num_steps)
    ctx.event("train", "override", f"run {ctx.run_id}", overrides=[o.text for o in overrides])


# ----------------------------------------------------------------------------- up

# The stages of `rl360 up`, in dependency order: tiers, node caches (Docker images or Daytona snapshots), the
# sandboxes' egress proxy, the tasks' built images (a build may go out through the proxy), engines and router,
# trainer.
UP_STAGES = (provision, prewarm_images, prewarm_snapshots, egress, prewarm_builds, serve, train)


def bring_up(ctx: Context) -> list[str]:
    """Run the stages of `rl360 up` that apply to the recipe, in order, for the current run (`start_run` made
    it); returns their names. `rl360 down` may come meanwhile: it stops what was recorded when it ran, so what
    was started after it is stopped here too, and the stages left are skipped (`was_stopped` tells)."""
    applied = [stage.NAME for stage in UP_STAGES if stage.applies(ctx)]
    try:
        for stage in UP_STAGES:
            if stage.NAME in applied and not was_stopped(ctx):
                stage.apply(ctx)
    except Rl360Error as error:
        # `rl360 down` while the engines were starting: they ended "before they were ready", because of it.
        if not was_stopped(ctx):
            _fail_if_nothing_runs(ctx, error)
            raise
    if was_stopped(ctx):
        stop_serving(ctx, ctx.run_id or "")
    return applied


def _fail_if_nothing_runs(ctx: Context, error: Rl360Error) -> None:
    """A run refused before any of its components ran (a recipe that does not fit the tiers, an allocation
    Slurm refuses) ends failed with the reason: the next `rl360 up` is not told that it is still starting. One
    with components running is left as it is, for `rl360 down` to stop them."""
    if not queries.live_components(ctx.state.read(), run=ctx.run_id):
        transitions.end_run(ctx.state, ctx.run_id or "", RunStatus.FAILED, reason=str(error))


def was_stopped(ctx: Context) -> bool:
    """True when `rl360 down` stopped the current run."""
    return queries.run_was_stopped(ctx.state.read(), ctx.run_id)


# ----------------------------------------------------------------------------- follow and end


@dataclass(frozen=True, kw_only=True, slots=True)
class RunView:
    """What following a run sees at one moment: its record (reconciled with reality), its metrics rows so
    far, and the step in generation (the run folder's generation.json)."""

    run_id: str
    run: RunRecord | dict
    rows: list[dict]
    generation: dict | None

    @property
    def ended(self) -> bool:
        return self.run.get("status") in RUN_FINAL


def follow(ctx: Context, *, poll_s: float = 1.0) -> Iterator[RunView]:
    """What the current run does, every `poll_s` seconds, until it ends; then the components that served it
    (engines, router, control plane) are stopped, unless `rl360 down` stopped the run (and them). The tiers
    stay provisioned. Leaving the loop early (Ctrl-C) leaves the run going."""
    run_id = ctx.run_id or ""
    while True:
        run = reconcile(ctx).runs.get(run_id, {})
        # A requeue just brought new nodes: they are prewarmed before their actors take sessions.
        if prewarm_images.prewarm_replaced_nodes(ctx):
            run = reconcile(ctx).runs.get(run_id, {})
        run_dir = run.get("run_dir") or ctx.run_dir
        seen = RunView(run_id=run_id, run=run, rows=read_metrics(run.get("metrics_path") or Path(run_dir) /
                                                                  "metrics.jsonl"),
                       generation=read_generation(run_dir))
        yield seen
        if seen.ended:
            break
        time.sleep(poll_s)
    if seen.run["status"] != RunStatus.STOPPED:
        stop_serving(ctx, run_id)


def stop_serving(ctx: Context, run_id: str) -> None:
    """Stop the components of a run that has ended, or was stopped while it started."""
    mine = queries.run_components(ctx.state.read(), run_id)
    for name, records in queries.by_backend(mine).items():
        ctx.backend_named(name).stop(records, grace_s=10.0)
    transitions.mark_components_stopped(ctx.state, mine)
    for cid in mine:
        ctx.event("up", "stop", cid, reason="run ended")
