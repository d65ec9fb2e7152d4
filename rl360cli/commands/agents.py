"""`rl360 agents try HARNESS --task PATH`: one session of a harness on one task, against rl360's CPU engine and a
real sandbox, as a run's session actor makes it; the outcome, the conversation and where the files are. The stage
is rl360cli/stages/agents_try.py."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from rl360cli.commands.common import JsonFlag, ProfileOpt, RecipeOpt, SetOpt, context, out, overrides_of, print_json
from rl360cli.errors import Rl360Error
from rl360cli.stages import agents_try

app = typer.Typer(help="Try the harness that drives rollout sessions (docs/agents.md).", no_args_is_help=True)

# The recipe whose policy and sandboxes a try uses unless --recipe names another: the tiny local-smoke policy.
DEFAULT_RECIPE = Path("recipes/local-smoke.toml")
# Characters of the conversation printed (all of it is in the output folder's trajectory.jsonl).
MAX_SHOWN_CHARS = 6000


@app.command("try")
def try_(
    harness: Annotated[str, typer.Argument(help="What [agent] harness takes: bash, mini-swe-agent, terminus-2, "
                                                "installed:<name>, python:module:function.")],
    task: Annotated[Path, typer.Option("--task", help="A task folder (it holds task.toml).")],
    recipe: RecipeOpt = None,
    profile: ProfileOpt = None,
    set_values: SetOpt = None,
    out_dir: Annotated[Path | None, typer.Option("--out", help="Where the session's files go (default: "
                                                               ".rl360/tries/<time>-<task>/).",
                                                 show_default=False)] = None,
    json_out: JsonFlag = False,
) -> None:
    """Run one session of HARNESS on the task, on the recipe's policy v0 served by rl360's CPU engine (default: the
    tiny local-smoke policy) in the recipe's sandbox; print its outcome (reward, turns, the masked cause), the
    conversation and where its log and trajectory are. Exit 1 when the session was masked (an infrastructure
    failure: the harness raised, ...) or the harness is refused.

    Example: rl360 agents try python:tests.agent.user_harness.simple_agent:run --task recipes/tasks/arith-32/arith-00
    """
    ctx = context(recipe=recipe or DEFAULT_RECIPE, profile=profile, overrides=overrides_of(set_values),
                  quiet=json_out)
    result = agents_try.try_harness(ctx, harness=harness, task_path=task, out_dir=out_dir)
    if json_out:
        print_json({**result.to_dict(), "conversation": list(result.conversation)})
    else:
        render(result)
    if result.masked:
        cause = result.cause.value if result.cause else "infra_failure"
        raise Rl360Error(f"the session was masked {cause}: {result.last_error or result.detail or 'no detail'}",
                         result.fix())


def render(result: agents_try.TryResult) -> None:
    for index, text in enumerate(result.conversation):
        title = f"conversation (segment {index + 1} of {len(result.conversation)})" if len(result.conversation) > 1 \
            else "conversation"
        out.rule(title, align="left")
        shown = text if len(text) <= MAX_SHOWN_CHARS else \
            f"[... {len(text) - MAX_SHOWN_CHARS} characters left out ...]\n{text[-MAX_SHOWN_CHARS:]}"
        out.print(shown, markup=False, highlight=False)
    out.rule(align="left")
    outcome = result.outcome.value + (f" ({result.cause.value})" if result.cause else "")
    reward = "-" if result.reward is None else f"{result.reward:g}"
    out.print(f"{result.harness} on {result.task}: {outcome}, reward {reward}, {result.turns} turns, "
              f"{result.segments} segments ({result.tito_breaks} tito breaks), {result.format_errors} format errors, "
              f"{result.seconds:.1f}s", markup=False, highlight=False)
    if result.detail:
        out.print(escape(f"detail: {result.detail}"))
    if result.last_error:
        out.print(escape(f"last error: {result.last_error}"))
    names = ", ".join(str(path.relative_to(result.out_dir)) for path in result.files)
    out.print(escape(f"files: {result.out_dir}/ ({names})"))
