"""The `rl360` command line: one command per stage, all sharing one cluster state file.

    rl360 up                      # the local recipe, end to end, on this machine
    rl360 plan --profile cluster/reference-33-nodes.toml
    rl360 logs --follow

Exit codes: 0 success; 1 bad input or a failed precondition (one line that
names the fix; a traceback only with --verbose); 2 usage; 3 a run or
component failed; 4 the run that `up` or `logs --follow` followed was
stopped (`rl360 down`) before it ended.

A command's module (rl360cli/commands/) is imported only when that command runs: `main` reads the
command's name past the global options and builds an app of that one command, so `rl360 status` does not
import `up`'s stages (0.2 s of CPU against 0.6 s with every command; docs/benchmarks.md "CLI start-up").
With no command, `--help`, or a name it does not know it builds every command, so the help and Click's
"did you mean" stay as they were. The modules are named in `COMMANDS` and loaded by `importlib`.
"""

from __future__ import annotations

import importlib
import sys
import traceback
from pathlib import Path
from typing import Annotated

import typer

from rl360cli.commands import common
from rl360cli.errors import Rl360Error
from rl360cli.state.store import DEFAULT_PATH

# Command -> (its module in rl360cli/commands/, the function it runs; a group's Typer `app`), in the order
# `rl360 --help` lists them.
COMMANDS: dict[str, tuple[str, str]] = {
    "up": ("up", "up"),
    "plan": ("up", "plan"),
    "down": ("down", "down"),
    "status": ("status", "status"),
    "provision": ("provision", "provision"),
    "logs": ("logs", "logs"),
    "report": ("report", "report"),
    "serve": ("serve", "serve"),
    "train": ("train", "train"),
    "prewarm-images": ("prewarm_images", "prewarm_images"),
    "sandboxes": ("sandboxes", "app"),
    "tasks": ("tasks", "app"),
    "agents": ("agents", "app"),
}
# The global options before the command, and those of them that take a value.
GLOBAL_FLAGS = frozenset({"--verbose", "-v"})
GLOBAL_VALUED = frozenset({"--state"})


def _global_options(
    state: Annotated[Path, typer.Option("--state", envvar="RL360_STATE", help="The cluster state file.")] = DEFAULT_PATH,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Show tracebacks of errors.")] = False,
) -> None:
    common.GLOBALS.state_path = state
    common.GLOBALS.verbose = verbose


def build_app(command: str | None = None) -> typer.Typer:
    """The `rl360` app with every command, or with only `command` (one of `COMMANDS`) and its module."""
    app = typer.Typer(
        name="rl360",
        help="Agentic RL of language models: provision tiers, prewarm images, launch sandboxes, serve, train, "
             "follow.",
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
        context_settings={"help_option_names": ["-h", "--help"]},
    )
    app.callback()(_global_options)
    for name, (module, attribute) in COMMANDS.items():
        if command not in (None, name):
            continue
        target = getattr(importlib.import_module(f"rl360cli.commands.{module}"), attribute)
        if isinstance(target, typer.Typer):
            app.add_typer(target, name=name)
        else:
            app.command(name)(target)
    return app


def invoked_command(args: list[str]) -> str | None:
    """The command `args` (the arguments after `rl360`) runs, read past the global options; None, for every
    command, when there is none, before `--help` or a name not in `COMMANDS`, or past an option it cannot read."""
    index = 0
    while index < len(args):
        arg = args[index]
        option, equals, _ = arg.partition("=")
        if arg in GLOBAL_FLAGS or (equals and option in GLOBAL_VALUED):
            index += 1
        elif arg in GLOBAL_VALUED:
            index += 2
        else:
            return arg if arg in COMMANDS else None
    return None


def main() -> None:
    try:
        build_app(invoked_command(sys.argv[1:]))()
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
