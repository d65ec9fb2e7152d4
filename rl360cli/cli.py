"""The `rl360` command line: one command per stage, all sharing one cluster state file.

    rl360 up                      # the local recipe, end to end, on this machine
    rl360 plan --profile cluster/reference-33-nodes.toml
    rl360 logs --follow

Exit codes: 0 success; 1 bad input or a failed precondition (one line that
names the fix; a traceback only with --verbose); 2 usage; 3 a run or
component failed; 4 the run that `up` or `logs --follow` followed was
stopped (`rl360 down`) before it ended.
"""

from __future__ import annotations

import sys
import traceback
from pathlib import Path
from typing import Annotated

import typer

from rl360cli.commands import (common, down, logs, prewarm_images, provision, report, sandboxes, serve, status, tasks,
                               train, up)
from rl360cli.errors import Rl360Error
from rl360cli.state.store import DEFAULT_PATH

app = typer.Typer(
    name="rl360",
    help="Agentic RL of language models: provision tiers, prewarm images, launch sandboxes, serve, train, follow.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


@app.callback()
def _global_options(
    state: Annotated[Path, typer.Option("--state", envvar="RL360_STATE", help="The cluster state file.")] = DEFAULT_PATH,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Show tracebacks of errors.")] = False,
) -> None:
    common.GLOBALS.state_path = state
    common.GLOBALS.verbose = verbose


def _register() -> None:
    app.command("up")(up.up)
    app.command("plan")(up.plan)
    app.command("down")(down.down)
    app.command("status")(status.status)
    app.command("provision")(provision.provision)
    app.command("logs")(logs.logs)
    app.command("report")(report.report)
    app.command("serve")(serve.serve)
    app.command("train")(train.train)
    app.command("prewarm-images")(prewarm_images.prewarm_images)
    app.add_typer(sandboxes.app, name="sandboxes")
    app.add_typer(tasks.app, name="tasks")


_register()


def main() -> None:
    try:
        app()
    except Rl360Error as e:
        if common.GLOBALS.verbose:
            traceback.print_exc()
        sys.stderr.write(f"error: {e}\n")
        sys.exit(e.exit_code)
    except Exception as e:  # noqa: BLE001 — an unexpected error still gets one line and exit 1
        if common.GLOBALS.verbose:
            traceback.print_exc()
        else:
            sys.stderr.write(f"error: {type(e).__name__}: {e} (rerun with --verbose for the traceback)\n")
        sys.exit(1)
