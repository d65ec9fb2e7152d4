"""Stage `down`: stop everything the state knows, release the tiers, and confirm it.

Components get SIGTERM (or `scancel` of their job step), then SIGKILL after a
grace period; sandboxes the runs made are removed (also those an orchestrator
that crashed left behind, found by label); the tiers' allocations are given
back. Idempotent: a second `down` finds nothing to do. Records of what was
stopped leave the state file; the events log keeps their history.

A run under way ends `stopped` ("stopped by rl360 down"), recorded before its
components are stopped: its trainer, which then sees its engines go (a reset
connection), leaves a stopped run as it is (loop/driver.py), so stopping is
never recorded as failing.
"""

from __future__ import annotations

from rl360cli.stages.base import Action, Context
from rl360cli.state import RUN_ACTIVE, ComponentRecord, RunStatus, StateDoc, TierRecord, by_backend, now_iso

NAME = "down"
STOP_REASON = "stopped by rl360 down"


def plan(ctx: Context) -> list[Action]:
    doc = ctx.state.read()
    actions = [Action(stage=NAME, verb="stop", subject=f"run {rid}", detail=f"at step {run.get('step', 0)}")
               for rid, run in doc["runs"].items() if run["status"] in RUN_ACTIVE]
    actions += [Action(stage=NAME, verb="stop", subject=cid, detail=_where(rec))
               for cid, rec in doc["components"].items()]
    if doc["sandboxes"]:
        actions.append(Action(stage=NAME, verb="remove", subject=f"{len(doc['sandboxes'])} sandboxes"))
    actions += [Action(stage=NAME, verb="release", subject=f"tier {name}", detail=_where(tier))
                for name, tier in doc["tiers"].items()]
    return actions


def apply(ctx: Context, *, grace_s: float = 10.0) -> dict:
    stopped_runs = stop_runs(ctx)
    doc = ctx.state.read()
    for name, records in by_backend(doc["components"]).items():
        ctx.backend_named(name).stop(records, grace_s=grace_s)
        for cid in records:
            ctx.event(NAME, "stop", cid)
            ctx.say(f"{cid}: stopped")

    removed_sandboxes = _remove_sandboxes(ctx, doc)

    for name, tiers in by_backend(doc["tiers"]).items():
        ctx.backend_named(name).release(tiers)
        for tier_name in tiers:
            ctx.event(NAME, "release", f"tier {tier_name}")
            ctx.say(f"tier {tier_name}: released")

    with ctx.state.update() as new:
        for cid in doc["components"]:
            new["components"].pop(cid, None)
        for name in doc["tiers"]:
            new["tiers"].pop(name, None)
        for sid in removed_sandboxes:
            new["sandboxes"].pop(sid, None)
    stopped_runs += stop_runs(ctx)  # one that started while the components were being stopped
    return {
        "components": sorted(doc["components"]),
        "tiers": sorted(doc["tiers"]),
        "sandboxes": len(removed_sandboxes),
        "runs": stopped_runs,
    }


def stop_runs(ctx: Context) -> list[str]:
    """Mark every run under way `stopped`, with the reason; returns their ids."""
    with ctx.state.update() as doc:
        stopped = [rid for rid, run in doc["runs"].items() if run["status"] in RUN_ACTIVE]
        for rid in stopped:
            doc["runs"][rid].update(status=RunStatus.STOPPED, reason=STOP_REASON, ended_at=now_iso())
    for rid in stopped:
        ctx.event(NAME, "stop", f"run {rid}", reason=STOP_REASON)
        ctx.say(f"run {rid}: {STOP_REASON}")
    return stopped


def _remove_sandboxes(ctx: Context, doc: StateDoc) -> list[str]:
    """Remove every sandbox the runs of this state file made (found by label too, so also those a
    crashed orchestrator never recorded); returns the ids of the records to drop."""
    runs = set(doc["runs"]) | {s["run"] for s in doc["sandboxes"].values() if s["run"]}
    if not runs:
        return []
    from rl360cli.sandbox.janitor import remove_all

    removed = remove_all(ctx.profile.nodes, doc["sandboxes"], runs=runs)
    if removed:
        ctx.event(NAME, "remove", "sandboxes", count=len(removed))
        ctx.say(f"sandboxes: {len(removed)} removed")
    return list(doc["sandboxes"])


def _where(rec: ComponentRecord | TierRecord) -> str:
    if rec.get("job_id"):
        return f"job {rec['job_id']}"
    if rec.get("pid"):
        return f"pid {rec['pid']}"
    return ", ".join(rec.get("nodes") or [])
