"""`rl360 tasks check PATH...`: run each task's oracle and a no-op through the verifier; exit 1 on a bad task.
`rl360 tasks calibrate PATH --recipe R`: each task's pass rate on the recipe's starting policy, and the manifest
of those worth training on."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from rl360cli.commands.common import JsonFlag, ProfileOpt, RecipeOpt, SetOpt, context, out, overrides_of, print_json
from rl360cli.errors import Rl360Error
from rl360cli.logview import FINAL_RUN
from rl360cli.loop.calibration import Band
from rl360cli.sandbox.task_loader import load_task_set
from rl360cli.stages import tasks_check
from rl360cli.stages.calibrate import calibrate as run_calibration
from rl360cli.stages.calibrate import calibration_overrides
from rl360cli.state.schema import RunStatus

app = typer.Typer(help="Validate Harbor-format tasks before training on them.", no_args_is_help=True)


@app.command("check")
def check(
    paths: Annotated[list[Path], typer.Argument(help="Task folders, or task set folders (folders of tasks).")],
    provider: Annotated[str, typer.Option("--provider", help="process (this machine), docker (the profile's "
                                                             "nodes) or daytona (DAYTONA_API_KEY).")] = "process",
    include: Annotated[list[str] | None, typer.Option("--include", help="Only these task folder names (repeat).",
                                                      show_default=False)] = None,
    concurrency: Annotated[int, typer.Option("--concurrency", "-j", help="Tasks checked at once.")] = 4,
    probe: Annotated[bool, typer.Option("--probe", help="Then probe each passing verifier: empty, garbage and the "
                                                        "instruction echoed into the oracle's output files, and "
                                                        "those files moved aside, must each score below 1.")] = False,
    force_build: Annotated[bool, typer.Option("--force-build", help="Build a docker_image task from the "
                                                                    "environment/Dockerfile beside it instead of "
                                                                    "pulling the image (Harbor's --force-build).")
                           ] = False,
    artifacts: Annotated[Path | None, typer.Option("--artifacts", help="Keep each attempt's artifacts (the task's "
                                                                        "`artifacts` and /logs/artifacts) in "
                                                                        "DIR/<task>/<attempt>/, with Harbor's "
                                                                        "manifest.json.", show_default=False)] = None,
    profile: ProfileOpt = None,
    json_out: JsonFlag = False,
) -> None:
    """Each task's oracle (solution/solve.sh) must reach reward 1 and a no-op must not; exit 1 otherwise.

    Example: rl360 tasks check recipes/tasks/examples --provider docker --profile cluster/dev-docker.toml --probe
    """
    tasks_check.check_options(provider=provider, concurrency=concurrency)
    loaded = tasks_check.load_tasks(paths, include=include or ())
    report = tasks_check.check(context(profile=profile, quiet=json_out), loaded, provider=provider,
                               concurrency=concurrency, probe=probe, force_build=force_build,
                               artifacts_dir=artifacts.resolve() if artifacts else None)
    if json_out:
        print_json(report.to_dict())
    else:
        render_check(report)
    if report.failed:
        raise typer.Exit(1)


def render_check(report: tasks_check.TasksCheck) -> None:
    probed = any(r.probes for r in report.rows)
    table = Table("task", "oracle reward", "no-op reward", *(("probes",) if probed else ()), "outcome", "seconds",
                  title=f"tasks check ({report.provider})", title_justify="left")
    for r in report.rows:
        oracle = "-" if r.oracle is None else f"{r.oracle.reward:g}"
        noop = "-" if r.noop is None else f"{r.noop.reward:g}"
        # Each probe's reward, in PROBES' order (empty garbage echo moved); "-" where none ran.
        probes = (" ".join(f"{v.reward:g}" for v in r.probes.values()) or "-",) if probed else ()
        outcome = "[green]ok[/green]" if r.passed else "[red]" + escape("; ".join(r.problems)) + "[/red]"
        table.add_row(r.task, oracle, noop, *probes, outcome, f"{r.seconds:.1f}")
    out.print(table)
    out.print(f"{len(report.rows) - len(report.failed)}/{len(report.rows)} tasks pass")
    if report.offline:
        out.print(escape(f"{len(report.offline)} of these tasks want the internet (Harbor's default, unless a task "
                         f'says network_mode = "no-network"), and profile {report.profile} gives sandboxes none '
                         '([egress] mode = "none"): a verifier that fetches scores 0. See docs/sandboxes.md, '
                         '"Network".'))


@app.command("calibrate")
def calibrate(
    path: Annotated[Path, typer.Argument(help="A task set folder (a Harbor dataset).")],
    recipe: RecipeOpt = None,
    samples: Annotated[int, typer.Option("-k", "--samples", help="Attempts per task.")] = 16,
    band: Annotated[str, typer.Option("--band", help="Pass rates kept, LOW:HIGH (both included).")] = "0.2:0.4",
    include: Annotated[list[str] | None, typer.Option("--include", help="Only these task folder names (repeat).",
                                                      show_default=False)] = None,
    manifest: Annotated[Path | None, typer.Option("--manifest", help="Where to write the manifest (default: the "
                                                                     "run folder's manifest.json).",
                                                  show_default=False)] = None,
    profile: ProfileOpt = None,
    set_values: SetOpt = None,
    json_out: JsonFlag = False,
) -> None:
    """Attempt each task k times with the recipe's starting policy (its engines, sandboxes and agent, nothing
    trained); write the manifest of the tasks whose pass rate is in the band and that had no infrastructure
    failure. Train on them with `[tasks] manifest = "PATH"` (or --set tasks.manifest=PATH).

    Exit codes: 0 calibrated, 1 bad input, 3 the run failed, 4 it was stopped (`rl360 down`).

    Example: rl360 tasks calibrate recipes/tasks/coding-32 --recipe recipes/coding-32.toml -k 16 --band 0.2:0.4
    """
    if recipe is None:
        raise Rl360Error("tasks calibrate needs the recipe whose policy, engines and agent attempt the tasks",
                         "pass --recipe RECIPE.toml")
    chosen_band = Band.parse(band)
    load_task_set(path, include=tuple(include or ()))  # a missing set or task fails here, before anything starts
    overrides = [*overrides_of(set_values), *calibration_overrides(path, include or ())]
    ctx = context(recipe=recipe, profile=profile, overrides=overrides, quiet=json_out)
    result = run_calibration(ctx, k=samples, band=chosen_band, manifest=manifest, overrides=overrides)
    ctx.event("tasks", "calibrate", f"run {result.run_id}", outcome=str(result.status), band=str(chosen_band),
              k=samples, chosen=len(result.chosen), tasks=len(result.rows))
    if json_out:
        print_json({"run": result.run_id, "status": str(result.status), "reason": result.reason, "k": samples,
                    "band": str(chosen_band), "manifest": str(result.manifest) if result.manifest else None,
                    "tasks": [r.to_dict() for r in result.rows], "chosen": [r.task for r in result.chosen]})
    elif result.status != RunStatus.FINISHED:
        out.print(f"calibration run {result.run_id} {result.status}: {result.reason or 'see `rl360 logs`'}")
    else:
        chosen = {r.task for r in result.chosen}
        table = Table("task", "samples", "scored", "passed", "pass rate", "infra failures", "session s", "tokens",
                      "in band",
                      title=f"tasks calibrate: {path} (k={samples}, band {chosen_band})", title_justify="left")
        for r in result.rows:
            rate = "-" if r.pass_rate is None else f"{r.pass_rate:.2f}"
            infra = ", ".join(f"{cause} {n}" for cause, n in sorted(r.infra_failures.items())) or "-"
            table.add_row(r.task, str(r.samples), str(r.valid), str(r.passed), rate, infra, f"{r.session_s:.1f}",
                          str(r.generated_tokens), "[green]yes[/green]" if r.task in chosen else "no")
        out.print(table)
        out.print(f"{len(chosen)}/{len(result.rows)} tasks in band {chosen_band}: {result.manifest}")
        if chosen:
            out.print(f"train on them: --set tasks.manifest={result.manifest}")
        else:
            out.print("none to train on: widen --band, or start from another policy")
    raise typer.Exit(FINAL_RUN[result.status])

