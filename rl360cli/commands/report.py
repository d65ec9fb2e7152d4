"""`rl360 report [RUN]`: write a run's page (HTML and PNG charts) and its trajectories page into its run
folder, print the page's path."""

from __future__ import annotations

from typing import Annotated

import typer

from rl360cli.commands.common import JsonFlag, context, out, print_json
from rl360cli.stages.report.build import write_report


def report(
    run: Annotated[str | None, typer.Argument(help="Run id (default: the current run, the one started last).",
                                              show_default=False)] = None,
    open_page: Annotated[bool, typer.Option("--open", help="Print the page as a file:// URL to open; no browser "
                                                           "is started.")] = False,
    json_out: JsonFlag = False,
) -> None:
    """Draw a run's charts and summary into <run folder>/report/report.html, and the sessions the loop kept into
    trajectories.html beside it (finished, running or failed runs).

    Example: rl360 report --open
    """
    result = write_report(context(quiet=True), run)
    if json_out:
        print_json(result.to_dict())
        return
    summary = result.summary
    missing = f"; not recorded: {', '.join(result.not_recorded)}" if result.not_recorded else ""
    out.print(f"run {result.run_id} {summary.detail}; {len(result.charts)} charts{missing}", markup=False)
    # --open prints the path alone on its line, as a file URL a terminal lets one click.
    out.print(result.path.as_uri() if open_page else str(result.path), markup=False)
