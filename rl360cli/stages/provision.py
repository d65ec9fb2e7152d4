"""Stage `provision`: allocate the service, training and rollout tiers and record them.

Local backend: shares of this machine. Slurm backend: one allocation per tier
(or one heterogeneous job) with its job id and node list. Idempotent: tiers
already provisioned with this profile are left as they are.
"""

from __future__ import annotations

from rl360cli.errors import Rl360Error
from rl360cli.nodes.config import need_docker_nodes
from rl360cli.stages.base import Action, Context
from rl360cli.state import queries, transitions
from rl360cli.state.schema import TierRecord

NAME = "provision"


def applies(ctx: Context) -> bool:
    return True


def plan(ctx: Context) -> list[Action]:
    if _already_provisioned(ctx):
        return [Action(stage=NAME, verb="keep", subject=f"tier {t}", detail="already provisioned")
                for t in ctx.profile.tiers]
    actions = [Action(stage=NAME, verb="allocate", subject=f"tier {a.tiers}", detail=a.detail, command=a.command,
                      script=a.script)
               for a in ctx.backend.provision_plan()]
    # Slurm: a profile that names no interpreter for the nodes gets this machine's; the plan says what to set.
    note = ctx.backend.python_note()
    if note:
        actions.append(Action(stage=NAME, verb="note", subject="python", detail=note))
    actions += [Action(stage=NAME, verb="place", subject=subject, detail=detail)
                for subject, detail in _placement(ctx)]
    return actions


def apply(ctx: Context) -> dict[str, TierRecord]:
    if _already_provisioned(ctx):
        ctx.say("tiers: already provisioned")
        return queries.tiers(ctx.state.read())
    # A recipe that does not fit the profile is refused here, before an allocation is asked for.
    _placement(ctx)
    if ctx.recipe is not None and ctx.recipe.sandbox.provider == "docker":
        need_docker_nodes(ctx.profile.nodes, ctx.profile.sandbox)
    tiers, nodes = ctx.backend.provision()
    transitions.record_provision(
        ctx.state, {"name": ctx.profile.name, "path": str(ctx.profile_path), "backend": ctx.profile.backend},
        tiers, nodes)
    for name, tier in tiers.items():
        ctx.event(NAME, "allocate", f"tier {name}", nodes=tier.get("nodes"), job=tier.get("job_id"))
        ctx.say(f"tier {name}: {tier['status']} on {', '.join(tier.get('nodes') or ['(pending)'])}")
    return tiers


def _placement(ctx: Context) -> list[tuple[str, str]]:
    """Where the recipe's parts go on the tiers, (subject, detail) rows (Slurm; none elsewhere); `Rl360Error`
    for a recipe that does not fit the profile."""
    return ctx.backend.placement_plan(ctx.recipe) if ctx.recipe is not None else []


def _already_provisioned(ctx: Context) -> bool:
    doc = ctx.state.read()
    if not queries.tiers(doc):
        return False
    recorded = queries.profile_path(doc)
    if recorded and recorded != str(ctx.profile_path):
        raise Rl360Error(
            f"the cluster is provisioned with profile {recorded}, not {ctx.profile_path}",
            "run `rl360 down` first, or pass the same --profile",
        )
    live = ctx.backend.tiers_alive(queries.tiers(doc))
    return all(live.get(name) for name in ctx.profile.tiers)
