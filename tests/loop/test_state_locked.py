"""A state file that a stuck command holds locked does not end a run: a step's progress is left out (the next
step records it again) and the run's end waits for the lock. The lock is the real flock, held by another
open file description of the same lock file, as another process's `rl360` would hold it."""

from __future__ import annotations

import threading
import time

import pytest

from rl360cli.run import driver
from rl360cli.state import transitions
from rl360cli.state.schema import RunStatus, StateError
from rl360cli.state.store import StateFile


@pytest.fixture
def state(tmp_path):
    state = StateFile(tmp_path / "state.json", lock_timeout_s=0.3)
    transitions.start_run(state, "r1", name="r", recipe="r.toml", run_dir=str(tmp_path / "r1"), num_steps=9,
                          resumed=False)
    transitions.mark_run_running(state, "r1", pid=1)
    return state


def hold_lock(state: StateFile, seconds: float) -> threading.Thread:
    held = threading.Event()

    def holder():
        with StateFile(state.path, lock_timeout_s=5).update():
            held.set()
            time.sleep(seconds)

    thread = threading.Thread(target=holder)
    thread.start()
    held.wait(5)
    return thread


def test_a_steps_progress_is_left_out_while_the_state_file_is_locked(state, capsys):
    holder = hold_lock(state, 1.0)
    assert driver.record_progress(state, "r1", step=3, policy_version=3, reward_mean=None) is False
    assert "progress not recorded in the state file" in capsys.readouterr().out
    holder.join()
    assert driver.record_progress(state, "r1", step=4, policy_version=4, reward_mean=None) is True
    assert state.read()["runs"]["r1"]["step"] == 4


def test_the_runs_end_waits_for_the_lock_then_fails_past_its_patience(state):
    holder = hold_lock(state, 1.0)
    driver.end_run_patiently(state, "r1", RunStatus.FINISHED, patience_s=10)
    holder.join()
    assert state.read()["runs"]["r1"]["status"] == "finished"

    holder = hold_lock(state, 2.0)
    with pytest.raises(StateError, match="is locked by pid"):
        driver.end_run_patiently(state, "r1", RunStatus.FAILED, patience_s=0.5)
    holder.join()
    assert state.read()["runs"]["r1"]["status"] == "finished"
