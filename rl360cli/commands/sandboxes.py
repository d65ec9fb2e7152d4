"""`rl360 sandboxes launch|list|stop`: a fleet of idle sandboxes for load tests and warm pools."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from rl360cli.commands.common import DryRunOpt, JsonFlag, ProfileOpt, context, out, print_action, print_json
from rl360cli.errors import Rl360Error
from rl360cli.stages import sandboxes as stage

app = typer.Typer(help="Launch, list and stop a fleet of sandboxes (load tests, warm pools).",
                  no_args_is_help=True)

ProviderOpt = Annotated[str, typer.Option("--provider", help="process (this machine) or docker (the profile's nodes).")]
# Rich lays out every cell of a table (8,192 rows took 4 s): beyond this many rows, `list` prints plain columns.
PLAIN_OVER = 200


@app.command("launch")
def launch(
    count: Annotated[int, typer.Option("--count", "-n", help="How many sandboxes.")] = 4,
    wave_size: Annotated[int, typer.Option("--wave-size", help="Starts admitted per wave.")] = 4,
    interval: Annotated[float, typer.Option("--interval", help="Seconds between waves.")] = 0.5,
    provider: ProviderOpt = "process",
    image: Annotated[str | None, typer.Option("--image", help="Image to run (docker; default: the registry's busybox).",
                                              show_default=False)] = None,
    cpus: Annotated[float, typer.Option("--cpus", help="CPUs each sandbox reserves.")] = 0.05,
    memory_mb: Annotated[int, typer.Option("--memory-mb", help="Memory each sandbox reserves.")] = 64,
    adaptive: Annotated[bool, typer.Option("--adaptive", help="Grow or shrink waves with start latency.")] = False,
    run: Annotated[str | None, typer.Option("--run", help="Label the fleet with this run id.",
                                            show_default=False)] = None,
    profile: ProfileOpt = None,
    dry_run: DryRunOpt = False,
    json_out: JsonFlag = False,
) -> None:
    """Start COUNT idle sandboxes in waves and record them; they keep running until `sandboxes stop` or `down`.

    Example: rl360 sandboxes launch --count 24 --wave-size 4 --interval 0.5 --provider docker
    """
    if provider not in ("process", "docker"):
        raise Rl360Error(f"--provider {provider!r} is not known", "use process or docker")
    try:
        spec = stage.FleetSpec(count=count, provider=provider, wave_size=wave_size, interval_s=interval,
                               adaptive=adaptive, image=image, cpus=cpus, memory_mb=memory_mb, run=run)
    except ValueError as e:
        raise Rl360Error(str(e)) from None
    ctx = context(profile=profile, quiet=json_out)
    if dry_run:
        for action in stage.plan(ctx, spec):
            print_action(action)
        return
    result = stage.launch(ctx, spec)
    if json_out:
        print_json(result)
    else:
        table = Table("sandbox", "node", "start s", "warm", title=f"fleet {result['run']} ({result['image']})",
                      title_justify="left")
        for s in sorted(result["started"], key=lambda s: s.get("started_at", "")):
            table.add_row(s["id"], s["node"], f"{s['start_latency_s']:.3f}", "yes" if s.get("warm") else "-")
        out.print(table)
        summary = result["summary"]
        out.print(f"{len(result['started'])} started, {len(result['failed'])} failed; start latency p50 "
                  f"{_s(summary['start_latency_p50_s'])}, p95 {_s(summary['start_latency_p95_s'])}; warm starts "
                  f"{_ratio(summary['warm_start_ratio'])}")
        for f in result["failed"]:
            out.print(f"[red]failed[/red] {f['attempt']}: {f['error']}", markup=True)
    if result["failed"]:
        raise typer.Exit(3)


@app.command("list")
def list_(profile: ProfileOpt = None, json_out: JsonFlag = False) -> None:
    """Show the recorded sandboxes, each checked against its daemon or process now.

    Example: rl360 sandboxes list --json
    """
    ctx = context(profile=profile, quiet=True)
    records = stage.observe(ctx)
    if json_out:
        print_json(records)
        return
    if not records:
        out.print("no sandboxes")
        return
    columns = ("sandbox", "run", "provider", "node", "status", "image", "started")
    rows = [(sid, rec.get("run", "-"), rec.get("provider", "-"), rec.get("node", "-"), rec.get("status", "-"),
             rec.get("image") or "-", (rec.get("started_at") or "")[11:19])
            for sid, rec in sorted(records.items(), key=lambda kv: kv[1].get("started_at", ""))]
    if len(rows) > PLAIN_OVER:
        widths = [max(len(str(row[i])) for row in (columns, *rows)) for i in range(len(columns))]
        lines = ["  ".join(str(v).ljust(w) for v, w in zip(row, widths)).rstrip() for row in (columns, *rows)]
        out.file.write(f"sandboxes ({len(rows)})\n" + "\n".join(lines) + "\n")
        out.file.flush()
        return
    table = Table(*columns, title="sandboxes", title_justify="left")
    for row in rows:
        table.add_row(*row)
    out.print(table)


@app.command("stop")
def stop(
    ids: Annotated[list[str] | None, typer.Argument(help="Sandbox ids (default: all recorded).",
                                                    show_default=False)] = None,
    run: Annotated[str | None, typer.Option("--run", help="Only this fleet's sandboxes.", show_default=False)] = None,
    profile: ProfileOpt = None,
    json_out: JsonFlag = False,
) -> None:
    """Remove recorded sandboxes (all, one run's, or the given ids) and forget them.

    Example: rl360 sandboxes stop --run fleet-20261129-101500
    """
    ctx = context(profile=profile, quiet=json_out)
    gone = stage.stop(ctx, ids=tuple(ids or ()), run=run)
    if json_out:
        print_json({"stopped": gone})
    else:
        out.print(f"{len(gone)} sandboxes stopped" if gone else "no sandboxes to stop")


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}s"


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"
