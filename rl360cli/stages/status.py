"""Stage `status`: reconcile the state file with reality and report it.

Every recorded component is observed through its backend in one batched call
per backend (processes for local, one sacct + squeue for Slurm). A component
whose process is gone is failed with its exit code, never "running"; one whose
fate cannot be told is "unknown". Nothing is ever deleted here: one empty reply
from a scheduler is not evidence that a job ended.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from rl360cli.backends.base import FINAL, Observation
from rl360cli.stages.base import Context

NAME = "status"


@dataclass(kw_only=True)
class StatusReport:
    profile: dict | None
    tiers: dict
    nodes: dict
    components: dict
    runs: dict
    current_run: str | None
    sandboxes: dict[str, int] = field(default_factory=dict)
    changed: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {
            "profile": self.profile, "current_run": self.current_run, "tiers": self.tiers, "nodes": self.nodes,
            "components": self.components, "runs": self.runs, "sandboxes": self.sandboxes, "changed": self.changed,
        }

    @property
    def failed(self) -> list[str]:
        return [cid for cid, c in self.components.items() if c.get("status") == "failed"]


def observe(ctx: Context, doc: dict) -> dict[str, Observation]:
    """What every non-final component of `doc` is doing now, one batched call per backend."""
    comps = doc["components"]
    by_backend: dict[str, dict[str, dict]] = {}
    for cid, rec in comps.items():
        if rec.get("status") not in FINAL:
            by_backend.setdefault(rec.get("backend", "local"), {})[cid] = rec
    seen: dict[str, Observation] = {}
    for name, records in by_backend.items():
        seen.update(ctx.backend_named(name).observe(records))
    return seen


def reconcile(ctx: Context) -> StatusReport:
    doc = ctx.state.snapshot()
    seen = observe(ctx, doc)
    changed = [cid for cid, obs in seen.items() if _differs(doc["components"].get(cid), obs)]
    runs_to_fail = _runs_whose_trainer_ended(doc, seen)
    if changed or runs_to_fail:
        with ctx.state.update() as doc:
            for cid in changed:
                rec = doc["components"].get(cid)
                if rec is None or rec.get("status") in FINAL:
                    continue  # changed under us (another command stopped it): theirs wins
                obs = seen[cid]
                rec.update(status=obs.status, exit_code=obs.exit_code, reason=obs.reason)
            for run_id, (status, reason) in runs_to_fail.items():
                run = doc["runs"].get(run_id)
                if run is not None and run.get("status") == "running":
                    run.update(status=status, reason=reason)
        for cid in changed:
            obs = seen[cid]
            ctx.event(NAME, "observe", cid, obs.status, exit_code=obs.exit_code, reason=obs.reason)
    if _heal(ctx, doc):
        doc = ctx.state.read()
    return StatusReport(
        profile=doc.get("profile"), tiers=doc["tiers"], nodes=doc["nodes"], components=doc["components"],
        runs=doc["runs"], current_run=doc.get("current_run"),
        sandboxes=dict(Counter(s.get("status", "unknown") for s in doc["sandboxes"].values())), changed=changed,
    )


def _heal(ctx: Context, doc: dict) -> bool:
    """Let backends that recover from lost nodes (Slurm: a bounded requeue) take their next step."""
    names = {t.get("backend", "local") for t in doc["tiers"].values()}
    progressed = False
    for name in sorted(names):
        heal = getattr(ctx.backend_named(name), "heal", None)
        for message in heal() if heal else ():
            ctx.say(message)
            progressed = True
    return progressed


def _differs(rec: dict | None, obs: Observation) -> bool:
    if rec is None:
        return False
    if obs.status == "unknown" and obs.reason == "ending":
        return False  # the supervisor is writing the exit code: look again next time
    return (rec.get("status"), rec.get("exit_code"), rec.get("reason")) != (obs.status, obs.exit_code, obs.reason)


def _runs_whose_trainer_ended(doc: dict, seen: dict[str, Observation]) -> dict[str, tuple[str, str]]:
    """A run still marked running whose trainer component has ended without saying so."""
    out = {}
    for cid, obs in seen.items():
        rec = doc["components"].get(cid) or {}
        run = doc["runs"].get(rec.get("run") or "")
        if rec.get("kind") == "trainer" and run and run.get("status") == "running" and obs.status in FINAL:
            reason = f"trainer {obs.reason or obs.status}"
            out[rec["run"]] = ("failed" if obs.status == "failed" else "finished", reason)
    return out
