"""The state transitions of a tier's recovery from a lost node (rl360cli/backends/slurm_requeue.py decides them).

    ready --begin_requeue--> requeueing --finish_requeue--> ready   (components marked `restart` start again)
          \\--fail_tiers--> failed          end_tiers: a ready tier whose allocation ended for another reason

The backend's `TierRecovery` observes the cluster and chooses; these write what it chose, each under the state
file's lock. What they act on are fields: a component's or a run's `cause` (`node_lost`), a run's
`resume_after`, a component's `restart`, the tier's backend; the free-text `reason`s are written for people
(the caller's words) and never read here (tests/test_architecture.py checks it).
"""

from collections.abc import Mapping, Sequence

from rl360cli.outcome import InfraCause
from rl360cli.state.schema import (COMPONENT_FINAL, ComponentRecord, ComponentStatus, NodeStatus, PendingAllocation,
                                   RunStatus, StateDoc, TierStatus, now_iso)
from rl360cli.state.store import StateFile


def _in_allocation(doc: StateDoc, rec: ComponentRecord, group: Sequence[str]) -> bool:
    """`rec` is a step of one of the group's tiers, started by the tier's own backend (not a component that
    merely carries the tier's name, such as one the login machine runs)."""
    tier = doc["tiers"].get(rec["tier"]) if rec["tier"] in group else None
    return tier is not None and rec["backend"] == tier["backend"]


def _on_lost(rec: ComponentRecord, lost: Sequence[str]) -> bool:
    return any(n in lost for n in rec.get("nodes") or [rec["node"]])


def begin_requeue(state: StateFile, group: Sequence[str], *, old_job_ids: Sequence[str], lost: Sequence[str],
                  requeued: str, resuming: str) -> None:
    """The group's components that the loss (or the cancel of the old allocation `old_job_ids`) ends are failed
    and marked `restart`, before the cancel ends them (the run's health watcher must not start them again
    meanwhile): cause `node_lost` on a lost node, reason `requeued` elsewhere. A run whose trainer is among them
    and failed of the loss (its `cause`) runs again: `resume_after` the loss, reason `resuming`. A component that
    had ended on its own before the loss is left be."""
    with state.update() as doc:
        for rec in doc["components"].values():
            if not _in_allocation(doc, rec, group) or str(rec.get("job_id")) not in old_job_ids:
                continue
            status = rec["status"]
            on_lost = _on_lost(rec, lost)
            # A failure on a node now lost is the loss seen first (the health watcher's probes can beat Slurm's).
            was_live = status not in COMPONENT_FINAL or (status == ComponentStatus.FAILED and
                                                         (rec.get("cause") == InfraCause.NODE_LOST or on_lost))
            if not was_live:
                continue
            rec.update(status=ComponentStatus.FAILED, reason=InfraCause.NODE_LOST.value if on_lost else requeued,
                       cause=InfraCause.NODE_LOST if on_lost else None, restart=True)
            run = doc["runs"].get(rec["run"] or "")
            if rec["kind"] == "trainer" and run and run["status"] == RunStatus.FAILED and \
                    run.get("cause") == InfraCause.NODE_LOST:
                run.update(status=RunStatus.RUNNING, reason=resuming, cause=None, resume_after=InfraCause.NODE_LOST)


def mark_requeueing(state: StateFile, group: Sequence[str], *, requeues: int, exclude: Sequence[str],
                    pending: PendingAllocation, old_job_ids: Sequence[str]) -> None:
    """The group's replacement allocation `pending` was submitted (without the `exclude`d nodes)."""
    with state.update() as doc:
        for name in group:
            tier = doc["tiers"][name]
            tier.update(status=TierStatus.REQUEUEING, requeues=requeues, lost_nodes=list(exclude),
                        requeued_at=now_iso(), replaced_nodes=list(tier["nodes"]), pending=pending,
                        previous_job_ids=sorted(set(tier.get("previous_job_ids") or []) | set(old_job_ids)))


def fail_tiers(state: StateFile, group: Sequence[str], *, reason: str, lost: Sequence[str]) -> None:
    """The group cannot recover (no requeue left, or its requeue failed): its tiers are failed, their live
    components failed (cause `node_lost` on a lost node) and no longer to be restarted, and a run that was to
    resume after the loss (`resume_after`) failed of it."""
    with state.update() as doc:
        for name in group:
            doc["tiers"][name].update(status=TierStatus.FAILED, reason=reason, pending=None)
        for rec in doc["components"].values():
            if _in_allocation(doc, rec, group) and rec["status"] not in COMPONENT_FINAL:
                on_lost = _on_lost(rec, lost)
                rec.update(status=ComponentStatus.FAILED, cause=InfraCause.NODE_LOST if on_lost else None,
                           reason=InfraCause.NODE_LOST.value if on_lost else f"tier failed: {reason}")
            if rec["tier"] not in group:
                continue
            rec.pop("restart", None)
            run = doc["runs"].get(rec["run"] or "") if rec.get("kind") == "trainer" else None
            if run and run["status"] == RunStatus.RUNNING and run.get("resume_after"):
                run.update(status=RunStatus.FAILED, reason=f"trainer {InfraCause.NODE_LOST.value}; {reason}",
                           cause=InfraCause.NODE_LOST, resume_after=None)


def end_tiers(state: StateFile, ended: Mapping[str, str]) -> None:
    """Ready tiers whose allocation ended for another reason (tier -> the job's state)."""
    with state.update() as doc:
        for name, job_state in ended.items():
            tier = doc["tiers"].get(name)
            if tier is not None and tier["status"] == TierStatus.READY:
                tier.update(status=TierStatus.ENDED, reason=f"allocation {tier.get('job_id')} {job_state}")


def finish_requeue(state: StateFile, group: Sequence[str], *, allocations: Mapping[str, tuple[str, list[str]]],
                   script: str, het_leader: str | None, holder_log: str) -> None:
    """The group's replacement allocation holds its nodes (tier -> (job id, nodes)): the tiers are ready on
    them; each new node takes the place of a replaced one (its record, with this tier), and lost nodes are
    kept, marked `lost`. A new node whose tier's nodes were prewarmed (their records say how their last prewarm
    went) waits for its own (`prewarm_pending`, until `prewarm_done`): the loop sends its actors no session
    before (run/tier_watch.py)."""
    with state.update() as doc:
        nodes = doc["nodes"]
        for name in group:
            tier = doc["tiers"][name]
            job_id, new_nodes = allocations[name]
            old_nodes = list(tier.get("replaced_nodes") or [])
            tier.update(status=TierStatus.READY, job_id=job_id, nodes=new_nodes, script=script, pending=None,
                        het_leader=het_leader, het_group=group.index(name) if het_leader else None, reason=None,
                        holder_log=holder_log)
            template = next((nodes[n] for n in old_nodes if n in nodes), {})
            prewarmed = any("prewarm" in nodes.get(n, {}) for n in old_nodes)
            for old, new in zip(old_nodes, new_nodes):
                if old in nodes and old in tier.get("lost_nodes", []):
                    nodes[old]["status"] = NodeStatus.LOST
                record = dict(nodes.get(new) or template)
                record.update(tier=name, status=NodeStatus.READY,
                              images=(nodes.get(new) or {}).get("images", {}))
                if new not in nodes:
                    record.pop("prewarm", None)  # the replaced node's, not this one's
                nodes[new] = record
            fresh = [n for n in new_nodes if n not in old_nodes]
            tier["prewarm_pending"] = fresh if prewarmed and fresh else None


def prewarm_done(state: StateFile, done: Sequence[str]) -> None:
    """The prewarm of nodes a requeue brought (`prewarm_pending`) has ended, warmed or not (each node's record
    says how it went): the loop may send their actors sessions."""
    with state.update() as doc:
        for tier in doc["tiers"].values():
            left = [n for n in tier.get("prewarm_pending") or [] if n not in done]
            if tier.get("prewarm_pending"):
                tier["prewarm_pending"] = left or None
