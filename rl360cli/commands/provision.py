"""`rl360 provision`: allocate the service, training and rollout tiers of a cluster profile."""

from __future__ import annotations

from rl360cli.commands.common import DryRunOpt, JsonFlag, ProfileOpt, context, print_action, print_json
from rl360cli.stages import provision as provision_stage


def provision(profile: ProfileOpt = None, dry_run: DryRunOpt = False, json_out: JsonFlag = False) -> None:
    """Allocate the three tiers and record their nodes (and Slurm job ids) in the state file.

    Example: rl360 provision --profile cluster/dev-slurm.toml
    """
    ctx = context(profile=profile, quiet=json_out)
    if dry_run:
        for a in provision_stage.plan(ctx):
            print_action(a)
        return
    tiers = provision_stage.apply(ctx)
    if json_out:
        print_json(tiers)
