"""`rl360 logs`: the components' logs merged in time order, each line behind `tier/component`."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.text import Text

from rl360cli.commands.common import RunOpt, context, out
from rl360cli.logview import FINAL_RUN, Follower, LogFilter, LogLine, follow, parse_since
from rl360cli.stages.base import Context
from rl360cli.stages.status import reconcile
from rl360cli.state import queries
from rl360cli.state.schema import COMPONENT_FINAL, RunStatus

PALETTE = ("cyan", "magenta", "green", "yellow", "blue", "bright_cyan", "bright_magenta", "bright_green")


def logs(
    follow_: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing new lines until the run ends.")] = False,
    component: Annotated[list[str] | None, typer.Option("--component", "-c", help="Only this component (repeatable).")] = None,
    tier: Annotated[str | None, typer.Option("--tier", help="Only components of this tier.")] = None,
    since: Annotated[str | None, typer.Option("--since", help="Only lines newer than this (90s, 10m, 2h).")] = None,
    lines: Annotated[int | None, typer.Option("--lines", "-n", help="Start with the last N lines.")] = None,
    timestamps: Annotated[bool, typer.Option("--timestamps", "-t", help="Show each line's time.")] = False,
    run: RunOpt = None,
) -> None:
    """Print the run's logs in time order; with --follow, until the run ends (exit code from its status).

    Example: rl360 logs --follow --tier rollout --since 10m
    """
    ctx = context(run=run, quiet=True)
    where = LogFilter(components=tuple(component or ()), tier=tier, since=parse_since(since))
    printer = Printer(timestamps=timestamps)
    follower = Follower(folders=lambda: log_folders(ctx), emit=printer, where=where)
    for line in follower.backlog(lines):
        printer(line)
    if not follow_:
        return
    try:
        status = follow(follower, lambda: run_status(ctx))
    except KeyboardInterrupt:
        # Ctrl-C stops following, nothing else.
        raise typer.Exit(130) from None
    run_record = queries.run(ctx.state.read(), ctx.run_id) or {}
    footer = f"── run {ctx.run_id or '(none)'} {status}"
    if run_record:
        footer += f" at step {run_record.get('step', 0)}/{run_record.get('num_steps', '?')}"
        if run_record.get("reason"):
            footer += f" ({run_record['reason']})"
    out.print(Text(footer + " ──", style="bold" if status != RunStatus.FAILED else "bold red"))
    raise typer.Exit(FINAL_RUN[status])


def log_folders(ctx: Context) -> list[Path]:
    """The current run's log folder, plus the folders of components that belong to no run."""
    doc = ctx.state.read()
    folders = set()
    run = queries.run(doc, ctx.run_id)
    if run and run.get("run_dir"):
        folders.add(Path(run["run_dir"]) / "logs")
    for rec in queries.components(doc).values():
        if rec["log_path"] and rec["run"] in (None, ctx.run_id):
            folders.add(Path(rec["log_path"]).parent)
    return sorted(folders)


def run_status(ctx: Context) -> str | None:
    """The run's status after reconciling with reality; without a run, `finished` once nothing runs."""
    report = reconcile(ctx)
    run = report.runs.get(ctx.run_id or "")
    if run:
        return run["status"]
    live = any(c["status"] not in COMPONENT_FINAL for c in report.components.values())
    return None if live else RunStatus.FINISHED


class Printer:
    """Writes lines as `tier/component | text`, coloured on a terminal, plain when piped."""

    def __init__(self, *, timestamps: bool):
        self.timestamps = timestamps
        self.colors: dict[str, str] = {}
        self.plain = not sys.stdout.isatty()

    def __call__(self, line: LogLine) -> None:
        stamp = f"{line.time[11:23]} " if self.timestamps else ""
        if self.plain:
            sys.stdout.write(f"{stamp}{line.source} | {line.text}\n")
            sys.stdout.flush()
            return
        color = self.colors.setdefault(line.source, PALETTE[len(self.colors) % len(PALETTE)])
        out.print(Text.assemble((stamp, "dim"), (line.source, color), (" | ", "dim"), line.text))
