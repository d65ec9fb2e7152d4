"""The recovery from a lost node decides on the records' fields, never on the words of a reason
(rl360cli/state/recovery.py): a table of fields -> what `begin_requeue` and `fail_tiers` do, on a real state file.

    python -m pytest tests/cli/test_recovery.py
"""

from __future__ import annotations

import pytest

from rl360cli.state import recovery, transitions
from rl360cli.state.schema import ComponentStatus, RunStatus
from rl360cli.state.store import StateFile

REQUEUED, RESUMING = "tier requeued (words)", "trainer resuming (words)"


def seed(state: StateFile, component: dict, run: dict) -> None:
    with state.update() as doc:
        doc["tiers"]["training"] = {"backend": "slurm", "status": "ready", "job_id": "7", "nodes": ["n1", "n2"]}
        doc["runs"]["r1"] = {"name": "r", **run}
        doc["components"]["training/trainer"] = {
            "backend": "slurm", "tier": "training", "name": "trainer", "kind": "trainer", "run": "r1",
            "job_id": "7", "node": "n2", "nodes": ["n2"], "exit_code": None, **component}


LIVE = {"status": "running", "reason": None}
# fields of the trainer's record -> (status, cause, restart) after begin_requeue with n1 lost (None: untouched)
COMPONENTS = [
    ("live elsewhere: ended by the requeue", LIVE, ("failed", None, True, REQUEUED)),
    ("live on the lost node", {**LIVE, "node": "n1", "nodes": ["n1"]}, ("failed", "node_lost", True, "node_lost")),
    ("failed of a lost node, seen first", {"status": "failed", "cause": "node_lost", "reason": "x"},
     ("failed", None, True, REQUEUED)),
    ("failed, the words say node_lost but no cause", {"status": "failed", "reason": "node_lost"}, None),
    ("exited on its own before", {"status": "exited", "reason": None}, None),
    ("another backend's, in the tier", {**LIVE, "backend": "local"}, None),
    ("of another allocation", {**LIVE, "job_id": "8"}, None),
]


@pytest.mark.parametrize("component,after", [c[1:] for c in COMPONENTS], ids=[c[0] for c in COMPONENTS])
def test_begin_requeue_marks_the_components_the_requeue_ends(tmp_path, component, after):
    state = StateFile(tmp_path / "state.json")
    seed(state, component, {"status": "running"})
    before = state.read()["components"]["training/trainer"]
    recovery.begin_requeue(state, ("training",), old_job_ids=["7"], lost=["n1"], requeued=REQUEUED,
                           resuming=RESUMING)
    rec = state.read()["components"]["training/trainer"]
    if after is None:
        assert rec == before
    else:
        assert (rec["status"], rec["cause"], rec["restart"], rec["reason"]) == after


# the run's fields -> its (status, resume_after, reason) after begin_requeue, its trainer failed on lost n2
RUNS = [
    ("failed of the loss: resumes", {"status": "failed", "cause": "node_lost", "reason": "trainer node_lost"},
     ("running", "node_lost", RESUMING)),
    ("failed, the words say node_lost but no cause", {"status": "failed", "reason": "trainer node_lost"},
     ("failed", None, "trainer node_lost")),
    ("failed otherwise", {"status": "failed", "cause": None, "reason": "RuntimeError"}, ("failed", None, "RuntimeError")),
    ("stopped", {"status": "stopped", "reason": "stopped by rl360 down"}, ("stopped", None, "stopped by rl360 down")),
]


@pytest.mark.parametrize("run,after", [r[1:] for r in RUNS], ids=[r[0] for r in RUNS])
def test_begin_requeue_resumes_a_run_only_when_its_cause_is_the_loss(tmp_path, run, after):
    state = StateFile(tmp_path / "state.json")
    seed(state, {"status": "failed", "cause": "node_lost", "reason": "node_lost"}, run)
    recovery.begin_requeue(state, ("training",), old_job_ids=["7"], lost=["n2"], requeued=REQUEUED,
                           resuming=RESUMING)
    got = state.read()["runs"]["r1"]
    assert (got["status"], got.get("resume_after"), got["reason"]) == after


# the run's fields (its trainer running) -> its (status, cause) once the tier cannot recover
FAILS = [
    ("resuming after the loss: failed of it", {"status": "running", "resume_after": "node_lost"},
     ("failed", "node_lost")),
    ("running, the words say it resumes but no field", {"status": "running", "reason": "trainer restarting after x"},
     ("running", None)),
    ("finished", {"status": "finished", "resume_after": None}, ("finished", None)),
]


@pytest.mark.parametrize("run,after", [f[1:] for f in FAILS], ids=[f[0] for f in FAILS])
def test_fail_tiers_fails_a_run_that_was_to_resume(tmp_path, run, after):
    state = StateFile(tmp_path / "state.json")
    seed(state, LIVE, run)
    recovery.fail_tiers(state, ("training",), reason="no requeue left", lost=["n2"])
    doc = state.read()
    assert (doc["runs"]["r1"]["status"], doc["runs"]["r1"].get("cause")) == after
    trainer = doc["components"]["training/trainer"]
    assert (trainer["status"], trainer["cause"], "restart" in trainer) == ("failed", "node_lost", False)
    assert doc["tiers"]["training"]["status"] == "failed"


def test_the_fields_are_written_by_the_transitions_and_cleared_when_the_run_ends(tmp_path):
    state = StateFile(tmp_path / "state.json")
    seed(state, LIVE, {"status": "running"})
    # `rl360 status` saw the trainer's node lost: the component and its run say so in fields.
    transitions.record_observations(
        state, {"training/trainer": (ComponentStatus.FAILED, None, "node_lost", "node_lost")},
        {"r1": (RunStatus.FAILED, "trainer node_lost", "node_lost")})
    doc = state.read()
    assert (doc["components"]["training/trainer"]["cause"], doc["runs"]["r1"]["cause"]) == ("node_lost", "node_lost")
    recovery.begin_requeue(state, ("training",), old_job_ids=["7"], lost=["n2"], requeued=REQUEUED,
                           resuming=RESUMING)
    assert state.read()["runs"]["r1"]["resume_after"] == "node_lost"
    transitions.end_run(state, "r1", RunStatus.FINISHED)
    run = state.read()["runs"]["r1"]
    assert (run["status"], run["cause"], run["resume_after"]) == ("finished", None, None)


@pytest.mark.parametrize(("old_records", "pending"), [
    ({"n1": {"prewarm": {"status": "ok", "reason": None, "at": "t"}, "images": {}}}, ["n3"]),
    ({"n1": {"images": {}}}, None),  # never prewarmed: nothing to wait for
])
def test_a_requeue_leaves_its_new_node_waiting_for_the_prewarm_its_old_one_had(tmp_path, old_records, pending):
    state = StateFile(tmp_path / "state.json")
    with state.update() as doc:
        doc["tiers"]["rollout"] = {"backend": "slurm", "status": "requeueing", "job_id": "7", "nodes": ["n1"],
                                   "replaced_nodes": ["n1"], "lost_nodes": ["n1"]}
        doc["nodes"].update(old_records)
    recovery.finish_requeue(state, ("rollout",), allocations={"rollout": ("8", ["n3"])}, script="#!/bin/sh\n",
                            het_leader=None, holder_log="holder.log")
    doc = state.read()
    assert doc["tiers"]["rollout"]["prewarm_pending"] == pending
    # The new node's record is its own: the replaced node's prewarm is not taken for its.
    assert "prewarm" not in doc["nodes"]["n3"] and doc["nodes"]["n1"]["status"] == "lost"
    recovery.prewarm_done(state, ["n3"])
    assert state.read()["tiers"]["rollout"]["prewarm_pending"] is None
