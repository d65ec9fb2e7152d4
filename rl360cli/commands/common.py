"""What the command modules share: global options, the stage context, and output.

Commands print human output with rich, or one JSON document with `--json`.
Progress goes to stderr so that `--json` output stays machine-readable.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.text import Text

from rl360cli.config import inject_failures_override, load_recipe
from rl360cli.configload import parse_override
from rl360cli.stages.base import Context, resolve_profile
from rl360cli.state import queries
from rl360cli.state.store import DEFAULT_PATH, StateFile

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)

JsonFlag = Annotated[bool, typer.Option("--json", help="Print one JSON document instead of tables.")]
RecipeOpt = Annotated[
    Path | None, typer.Option("--recipe", "-r", help="Recipe TOML file.", envvar="RL360_RECIPE", show_default=False)
]
ProfileOpt = Annotated[
    Path | None,
    typer.Option("--profile", "-p", help="Cluster profile TOML (default: the provisioned one, else the recipe's).",
                 envvar="RL360_PROFILE", show_default=False),
]
RunOpt = Annotated[str | None, typer.Option("--run", help="Run id (default: the current run).", show_default=False)]
DryRunOpt = Annotated[bool, typer.Option("--dry-run", help="Print what would be done and start nothing.")]
SetOpt = Annotated[
    list[str] | None,
    typer.Option("--set", metavar="SECTION.KEY=VALUE", show_default=False,
                 help="Override a recipe value, checked as the recipe is; the value is TOML (3, 5e-6, docker, "
                      "\"a b\", [1, 2]); repeatable, later ones win. Example: --set run.seed=3"),
]


@dataclass
class Globals:
    state_path: Path = DEFAULT_PATH
    verbose: bool = False


GLOBALS = Globals()


def state_file() -> StateFile:
    return StateFile(GLOBALS.state_path)


def overrides_of(texts: list[str] | None, *, inject_failures: float | None = None) -> list:
    """The `Override`s of `--set` options (and `--inject-failures`, which is one more); bad syntax is a
    one-line `ConfigError`."""
    overrides = [inject_failures_override(inject_failures)] if inject_failures is not None else []
    return overrides + [parse_override(text) for text in texts or ()]


def context(*, recipe: Path | None = None, profile: Path | None = None, run: str | None = None,
            overrides: list | None = None, quiet: bool = False):
    """The stage context for this command: state, profile, recipe (with `overrides` applied) and run."""
    state = state_file()
    doc = state.snapshot()
    loaded_recipe = load_recipe(recipe, overrides=overrides or ()) if recipe else None
    loaded_profile, profile_path = resolve_profile(doc, profile, loaded_recipe)
    return Context(
        state=state,
        profile=loaded_profile,
        profile_path=profile_path,
        recipe=loaded_recipe,
        recipe_path=recipe.absolute() if recipe else None,
        run_id=run or queries.current_run_id(doc),
        say=(lambda message: None) if quiet else say,
    )


def say(message: str) -> None:
    err.print(Text.assemble(("› ", "dim"), message))


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")


def print_action(action) -> None:
    """One planned action: a line, then its exact command and script if it has them."""
    out.print(Text.assemble((f"{action.stage}: ", "dim"), f"{action.verb} {action.subject}",
                            (f"  {action.detail}" if action.detail else "", "dim")))
    if action.command:
        out.print(" ".join(action.command), markup=False)
    if action.script:
        out.print(action.script, markup=False, end="" if action.script.endswith("\n") else "\n")
