"""How a Slurm component's state is judged from one poll snapshot and its step's files (no Slurm needed).

The snapshots here are built the way `slurm_poll` builds them from real squeue/sacct/sinfo output; the
status files are written by the real supervisor format. The point is the order of evidence and that
an empty or failed reply never ends a component.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rl360cli.backends.slurm_observe import observe_component
from rl360cli.backends.slurm_poll import Snapshot


def snapshot(*, queue=None, jobs=None, steps=None, nodes=None, errors=None) -> Snapshot:
    return Snapshot(time=0.0, job_ids=["7"], node_names=["n1", "n2"], queue=queue, acct_jobs=jobs,
                    acct_steps=steps, nodes=nodes, errors=errors or {})


RUNNING_JOB = {"7": {"state": "RUNNING", "nodes": ["n1", "n2"], "display_id": "7", "reason": None}}
NODES_OK = {"n1": {"state": "allocated", "lost": False}, "n2": {"state": "allocated", "lost": False}}


@pytest.fixture
def record(tmp_path: Path) -> dict:
    return {"backend": "slurm", "status": "running", "job_id": "7", "step": "3", "step_key": "7.3",
            "nodes": ["n1", "n2"], "node": "n1", "num_tasks": 2,
            "status_path": str(tmp_path / "rollout.engine.status.json")}


def write_status(record: dict, rank: int, **fields) -> None:
    path = Path(record["status_path"])
    if rank:
        path = path.with_name(f"rollout.engine.{rank}.status.json")
    path.write_text(json.dumps({"pid": 100 + rank, "start_time": 1, **fields}))


def step(state: str, exit_code: int | None = 0) -> dict:
    return {"7.3": {"state": state, "exit_code": exit_code, "signal": 0, "nodes": ["n1", "n2"], "end": None}}


def test_exit_codes_written_by_the_supervisors_are_final(record):
    write_status(record, 0, exit_code=0, ended_at=2.0)
    write_status(record, 1, exit_code=0, ended_at=2.1)
    # Even while Slurm still lists the step as running, and even on a node now lost.
    seen = observe_component(record, snapshot(queue=RUNNING_JOB, steps=step("RUNNING"),
                                              nodes={**NODES_OK, "n2": {"state": "down*", "lost": True}}))
    assert (seen.status, seen.exit_code) == ("exited", 0)


def test_the_first_failing_task_is_the_reason(record):
    write_status(record, 1, exit_code=3, ended_at=5.0)
    write_status(record, 0, exit_code=143, signal="SIGTERM", ended_at=5.1)
    seen = observe_component(record, snapshot(queue=RUNNING_JOB, steps=step("CANCELLED")))
    assert (seen.status, seen.exit_code, seen.reason) == ("failed", 3, "exit code 3 on n2 (rank 1)")


def test_one_failed_task_fails_the_component_before_the_step_is_down(record):
    write_status(record, 0)
    write_status(record, 1, exit_code=2, ended_at=1.0)
    seen = observe_component(record, snapshot(queue=RUNNING_JOB, steps=step("RUNNING")))
    assert (seen.status, seen.reason) == ("failed", "exit code 2 on n2 (rank 1)")


def test_a_lost_node_fails_its_components_with_node_lost(record):
    write_status(record, 0)
    write_status(record, 1)
    slurm_says_lost = snapshot(queue=RUNNING_JOB, steps=step("RUNNING"), nodes={**NODES_OK, "n2": {"lost": True}})
    assert observe_component(record, slurm_says_lost).reason == "node_lost"
    heartbeat_stale = snapshot(queue=RUNNING_JOB, steps=step("RUNNING"), nodes=NODES_OK)
    assert observe_component(record, heartbeat_stale, {"n1"}).reason == "node_lost"
    assert observe_component(record, heartbeat_stale).status == "running"


def test_a_step_slurm_ended_without_an_exit_code(record):
    node_fail = observe_component(record, snapshot(queue=RUNNING_JOB, steps=step("NODE_FAIL"), nodes=NODES_OK))
    assert (node_fail.status, node_fail.reason) == ("failed", "node_lost")
    cancelled = observe_component(record, snapshot(queue=RUNNING_JOB, steps=step("CANCELLED", 0), nodes=NODES_OK))
    assert (cancelled.status, cancelled.reason) == ("failed", "job step CANCELLED without an exit code")


def test_an_ended_allocation_ends_its_steps(record):
    jobs = {"7": {"state": "TIMEOUT", "nodes": ["n1"], "exit_code": 0, "signal": 0, "display_id": "7", "end": "x"}}
    seen = observe_component(record, snapshot(queue={}, jobs=jobs, steps={}, nodes=NODES_OK))
    assert (seen.status, seen.reason) == ("failed", "allocation 7 TIMEOUT")


def test_running_from_sacct_or_from_a_started_supervisor_in_a_running_job(record):
    assert observe_component(record, snapshot(queue=RUNNING_JOB, steps=step("RUNNING"))).status == "running"
    assert observe_component(record, snapshot(queue=RUNNING_JOB, steps=step("PENDING"))).status == "starting"
    # sacct has not caught up with the step yet, but the job runs and the supervisor started.
    write_status(record, 0)
    assert observe_component(record, snapshot(queue=RUNNING_JOB, jobs={}, steps={})).status == "running"


def test_an_empty_reply_is_unknown_never_ended(record):
    write_status(record, 0)
    empty = observe_component(record, snapshot(queue={}, jobs={}, steps={}, nodes={}))
    assert empty.status == "unknown" and "neither squeue nor sacct" in empty.reason
    failed = observe_component(record, snapshot(errors={"squeue": "x", "sacct": "y"}))
    assert (failed.status, failed.reason) == ("unknown", "Slurm did not answer (sacct, squeue)")


def test_a_stopped_component_stays_stopped(record):
    record.update(status="stopped", exit_code=143)
    assert observe_component(record, snapshot()).status == "stopped"
