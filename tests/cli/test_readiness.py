"""The one wait for a launched component to become ready (rl360cli/backends/readiness.py), through the stages'
start (stages/base.py) with real supervised processes on the local backend, and the named transitions it
records (rl360cli/state/transitions.py).

    python -m pytest tests/cli/test_readiness.py
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rl360cli.backends.base import ComponentSpec
from rl360cli.backends.local import LocalBackend
from rl360cli.backends.readiness import WaitEnd, answers, wait_until_ready
from rl360cli.config import load_profile
from rl360cli.errors import RunFailed
from rl360cli.stages.base import Context, start_component
from rl360cli.state import queries, transitions
from rl360cli.state.schema import ComponentStatus
from rl360cli.state.store import StateFile

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def ctx(state_path) -> Context:
    c = Context(state=StateFile(state_path), profile=load_profile(REPO / "cluster/local.toml"),
                profile_path=REPO / "cluster/local.toml", run_id="r1")
    yield c
    # What a test started and left running (a ready `sleep 300`, one not ready in time) ends with it; records a
    # test wrote by hand name no process.
    LocalBackend(c.profile).stop({cid: rec for cid, rec in queries.components(c.state.read()).items()
                                  if rec.get("pid")}, grace_s=2.0)


def spec(name: str, script: str, ready_file: Path) -> ComponentSpec:
    return ComponentSpec(name=name, tier="service", stage="test", kind="worker", argv=("bash", "-c", script),
                         run="r1", ready_file=str(ready_file))


def record(ctx: Context, cid: str) -> dict:
    return queries.component(ctx.state.read(), cid)


def test_a_component_that_writes_its_ready_file_is_running(ctx, tmp_path):
    ready = tmp_path / "a.ready"
    start_component(ctx, spec("a", f"touch {ready}; sleep 300", ready), ready_timeout_s=60)
    assert record(ctx, "service/a")["status"] == ComponentStatus.RUNNING


def test_one_that_ends_first_is_failed_with_its_exit_code(ctx, tmp_path):
    with pytest.raises(RunFailed, match=r"service/b ended before it was ready \(exit code 3"):
        start_component(ctx, spec("b", "exit 3", tmp_path / "b.ready"), ready_timeout_s=60)
    rec = record(ctx, "service/b")
    assert (rec["status"], rec["exit_code"]) == (ComponentStatus.FAILED, 3)
    assert rec["reason"].startswith("exit code 3")


def test_one_not_ready_in_time_is_unknown(ctx, tmp_path):
    with pytest.raises(RunFailed, match=r"service/c did not write .*c.ready within 0.5s"):
        start_component(ctx, spec("c", "sleep 300", tmp_path / "c.ready"), ready_timeout_s=0.5)
    rec = record(ctx, "service/c")
    assert (rec["status"], rec["reason"]) == (ComponentStatus.UNKNOWN, "not ready after 0.5s")


def test_a_restart_words_what_it_records(ctx, tmp_path):
    with pytest.raises(RunFailed):
        start_component(ctx, spec("d", "exit 4", tmp_path / "d.ready"), ready_timeout_s=60)
    end = wait_until_ready(LocalBackend(ctx.profile), ctx.state, "service/d",
                           ready=answers(ready_file=str(tmp_path / "d.ready")), timeout_s=60, after_restart=True)
    assert (end.how, end.log_path) == (WaitEnd.ENDED, record(ctx, "service/d")["log_path"])
    assert record(ctx, "service/d")["reason"].startswith("restart failed: exit code 4")


def test_a_component_down_stopped_or_dropped_is_left_as_down_wrote_it(ctx, tmp_path):
    ready = tmp_path / "e.ready"
    transitions.record_component(ctx.state, "service/e", {"status": ComponentStatus.STOPPED, "log_path": "x",
                                                          "reason": "stopped by rl360 down", "exit_code": None})
    backend = LocalBackend(ctx.profile)
    end = wait_until_ready(backend, ctx.state, "service/e", ready=answers(ready_file=str(ready)), timeout_s=60)
    assert end.how is WaitEnd.STOPPED
    assert wait_until_ready(backend, ctx.state, "service/gone", ready=answers(ready_file=str(ready)),
                            timeout_s=60).how is WaitEnd.STOPPED
    # Nor does any named transition change it.
    assert not any((transitions.mark_ready(ctx.state, "service/e"),
                    transitions.mark_failed(ctx.state, "service/e", reason="x", exit_code=1),
                    transitions.mark_unknown(ctx.state, "service/e", reason="x"),
                    transitions.mark_restart_failed(ctx.state, "service/e", reason="x"),
                    transitions.record_served_version(ctx.state, "service/e", version=3)))
    assert record(ctx, "service/e") == {"status": ComponentStatus.STOPPED, "log_path": "x",
                                        "reason": "stopped by rl360 down", "exit_code": None}


def test_the_named_transitions_write_their_fields(state_path):
    state = StateFile(state_path)
    transitions.record_component(state, "t/a", {"status": ComponentStatus.STARTING, "exit_code": 137, "reason": None})
    assert transitions.mark_ready(state, "t/a")
    assert record_of(state)["status"] == ComponentStatus.RUNNING
    transitions.mark_failed(state, "t/a", reason="hung")  # no exit code known: the recorded one stays
    assert record_of(state) == {"status": ComponentStatus.FAILED, "exit_code": 137, "reason": "hung", "cause": None}
    transitions.mark_failed(state, "t/a", reason="exit code 2", exit_code=2)
    assert record_of(state)["exit_code"] == 2
    transitions.mark_unknown(state, "t/a", reason="not ready after 1s")
    assert (record_of(state)["status"], record_of(state)["reason"]) == (ComponentStatus.UNKNOWN, "not ready after 1s")
    transitions.mark_restart_failed(state, "t/a", reason="restart failed: no node")
    assert (record_of(state)["status"], record_of(state)["restart"]) == (ComponentStatus.FAILED, False)
    transitions.record_served_version(state, "t/a", version=7)
    assert record_of(state)["served_version"] == 7


def record_of(state: StateFile) -> dict:
    return queries.component(state.read(), "t/a")
