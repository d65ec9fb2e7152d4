"""The state transitions of a tier's recovery from a lost node (rl360cli/backends/slurm_requeue.py decides them).

    ready --begin_requeue--> requeueing --finish_requeue--> ready   (components marked `restart` start again)
          \\--fail_tiers--> failed          end_tiers: a ready tier whose allocation ended for another reason

The Slurm backend's `TierRecovery` observes the cluster and chooses; these write what it chose, each under
the state file's lock. Reasons come from the caller (the floor knows no Slurm words).
"""

from collections.abc import Mapping, Sequence

from rl360cli.state.schema import (COMPONENT_FINAL, ComponentStatus, NodeStatus, PendingAllocation, RunStatus,
                                   TierStatus, now_iso)
from rl360cli.state.store import StateFile


def begin_requeue(state: StateFile, group: Sequence[str], *, old_job_ids: Sequence[str], lost: Sequence[str],
                  node_lost: str, requeued: str, resuming: str) -> None:
    """The group's components that the loss (or the cancel of the old allocation `old_job_ids`) ends are failed
    and marked `restart`, before the cancel ends them (the run's health watcher must not start them again
    meanwhile): `node_lost` on a lost node, `requeued` elsewhere. A run whose trainer is among them and failed
    of the loss runs again (it resumes: `resuming node_lost`). A component that had ended on its own before
    the loss is left be."""
    with state.update() as doc:
        for rec in doc["components"].values():
            if rec["backend"] != "slurm" or rec["tier"] not in group or str(rec.get("job_id")) not in old_job_ids:
                continue
            status = rec["status"]
            on_lost = any(n in lost for n in rec.get("nodes") or [rec["node"]])
            # A failure on a node now lost is the loss seen first (the health watcher's probes can beat Slurm's).
            was_live = status not in COMPONENT_FINAL or (status == ComponentStatus.FAILED and
                                                         (rec.get("reason") == node_lost or on_lost))
            if not was_live:
                continue
            rec.update(status=ComponentStatus.FAILED, reason=node_lost if on_lost else requeued, restart=True)
            run = doc["runs"].get(rec["run"] or "")
            if rec["kind"] == "trainer" and run and run["status"] == RunStatus.FAILED and \
                    node_lost in str(run.get("reason") or ""):
                run.update(status=RunStatus.RUNNING, reason=f"{resuming} {node_lost}")


def mark_requeueing(state: StateFile, group: Sequence[str], *, requeues: int, exclude: Sequence[str],
                    pending: PendingAllocation, old_job_ids: Sequence[str]) -> None:
    """The group's replacement allocation `pending` was submitted (without the `exclude`d nodes)."""
    with state.update() as doc:
        for name in group:
            tier = doc["tiers"][name]
            tier.update(status=TierStatus.REQUEUEING, requeues=requeues, lost_nodes=list(exclude),
                        requeued_at=now_iso(), replaced_nodes=list(tier["nodes"]), pending=pending,
                        previous_job_ids=sorted(set(tier.get("previous_job_ids") or []) | set(old_job_ids)))


def fail_tiers(state: StateFile, group: Sequence[str], *, reason: str, lost: Sequence[str], node_lost: str,
               resuming: str) -> None:
    """The group cannot recover (no requeue left, or its requeue failed): its tiers are failed, their live
    Slurm components failed (`node_lost` on a lost node) and no longer to be restarted, and a run that was
    resuming after the loss failed."""
    with state.update() as doc:
        for name in group:
            doc["tiers"][name].update(status=TierStatus.FAILED, reason=reason, pending=None)
        for rec in doc["components"].values():
            if rec["backend"] == "slurm" and rec["tier"] in group and rec["status"] not in COMPONENT_FINAL:
                on_lost = any(n in lost for n in rec.get("nodes") or [rec["node"]])
                rec.update(status=ComponentStatus.FAILED, reason=node_lost if on_lost else f"tier failed: {reason}")
            if rec["tier"] not in group:
                continue
            rec.pop("restart", None)
            run = doc["runs"].get(rec["run"] or "") if rec.get("kind") == "trainer" else None
            if run and run["status"] == RunStatus.RUNNING and str(run.get("reason") or "").startswith(resuming):
                run.update(status=RunStatus.FAILED, reason=f"trainer {node_lost}; {reason}")


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
    kept, marked `lost`."""
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
            for old, new in zip(old_nodes, new_nodes):
                if old in nodes and old in tier.get("lost_nodes", []):
                    nodes[old]["status"] = NodeStatus.LOST
                record = dict(nodes.get(new) or template)
                record.update(tier=name, status=NodeStatus.READY,
                              images=(nodes.get(new) or {}).get("images", {}))
                nodes[new] = record
