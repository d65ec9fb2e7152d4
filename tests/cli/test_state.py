"""The cluster state file: atomic, locked, schema-checked, never silently rewritten."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from rl360cli.state import SCHEMA_VERSION, StateError, StateFile


def test_missing_file_is_an_empty_cluster(tmp_path):
    doc = StateFile(tmp_path / "state.json").read()
    assert doc["schema_version"] == SCHEMA_VERSION
    assert doc["components"] == {} and doc["tiers"] == {} and doc["runs"] == {}


def test_update_writes_and_keeps_the_previous_version(tmp_path):
    state = StateFile(tmp_path / "state.json")
    with state.update() as doc:
        doc["runs"]["a"] = {"status": "running"}
    with state.update() as doc:
        doc["runs"]["b"] = {"status": "running"}
    assert set(state.read()["runs"]) == {"a", "b"}
    assert set(json.loads(state.backup_path.read_text())["runs"]) == {"a"}


def test_an_exception_in_the_body_writes_nothing(tmp_path):
    state = StateFile(tmp_path / "state.json")
    with state.update() as doc:
        doc["runs"]["a"] = {}
    with pytest.raises(RuntimeError), state.update() as doc:
        doc["runs"]["b"] = {}
        raise RuntimeError("boom")
    assert set(state.read()["runs"]) == {"a"}


def test_a_snapshot_is_parsed_once_per_version_of_the_file(tmp_path):
    state = StateFile(tmp_path / "state.json")
    assert state.snapshot()["components"] == {}  # no file yet: an empty cluster
    with state.update() as doc:
        doc["components"]["a"] = {"status": "running"}
    first = state.snapshot()
    assert first is state.snapshot()  # the same version: one parse, shared
    other = StateFile(tmp_path / "state.json")  # another process's write makes a new version
    with other.update() as doc:
        doc["components"]["b"] = {"status": "running"}
    second = state.snapshot()
    assert second is not first and set(second["components"]) == {"a", "b"}
    assert state.read() is not state.read()  # read() stays a fresh copy to change freely


def test_corrupt_file_is_an_error_naming_file_and_fix_and_is_left_untouched(tmp_path):
    path = tmp_path / "state.json"
    path.write_text('{"schema_version": 1, "tiers": {')
    state = StateFile(path)
    with pytest.raises(StateError) as e:
        state.read()
    assert str(path) in str(e.value) and "corrupt" in str(e.value) and "cp " in str(e.value)
    with pytest.raises(StateError), state.update():
        pass
    assert path.read_text() == '{"schema_version": 1, "tiers": {'


def test_newer_schema_is_refused(tmp_path):
    path = tmp_path / "state.json"
    path.write_text(json.dumps({"schema_version": SCHEMA_VERSION + 1}))
    with pytest.raises(StateError, match="upgrade rl360"):
        StateFile(path).read()
    assert json.loads(path.read_text()) == {"schema_version": SCHEMA_VERSION + 1}


def test_lock_timeout_names_the_holding_pid(tmp_path):
    state = StateFile(tmp_path / "state.json", lock_timeout_s=0.3)
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import time
        from rl360cli.state import StateFile
        with StateFile({str(state.path)!r}).update():
            print("locked", flush=True)
            time.sleep(30)
    """)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(StateError) as e, state.update():
            pass
        assert f"pid {holder.pid}" in str(e.value)
    finally:
        holder.kill()
        holder.wait()


def test_readers_never_see_a_torn_file(tmp_path):
    state = StateFile(tmp_path / "state.json")
    stop = threading.Event()
    errors = []

    def read_forever():
        while not stop.is_set():
            try:
                state.read()
            except StateError as e:
                errors.append(e)

    reader = threading.Thread(target=read_forever)
    reader.start()
    for i in range(200):
        with state.update() as doc:
            doc["sandboxes"] = {f"s{j}": {"status": "running", "pad": "x" * 50} for j in range(i * 5)}
    stop.set()
    reader.join()
    assert errors == []
    assert len(state.read()["sandboxes"]) == 199 * 5


def test_sixteen_cli_processes_each_record_their_own_component(tmp_path, cli):
    state = tmp_path / "state.json"
    script = textwrap.dedent("""
        import sys
        from rl360cli.state import StateFile
        with StateFile(sys.argv[1]).update() as doc:
            doc["components"][f"service/c{sys.argv[2]}"] = {"status": "running", "backend": "local"}
    """)
    procs = [subprocess.Popen([sys.executable, "-c", script, str(state), str(i)]) for i in range(16)]
    assert [p.wait(timeout=60) for p in procs] == [0] * 16
    doc = json.loads(state.read_text())
    assert sorted(doc["components"]) == sorted(f"service/c{i}" for i in range(16))


def test_sixteen_rl360_commands_at_once_lose_no_update(tmp_path):
    """The same through the real CLI: 16 `rl360 provision` + status processes on one state file."""
    state = tmp_path / "state.json"
    env = {**os.environ, "RL360_STATE": str(state)}
    from tests.conftest import REPO

    procs = [subprocess.Popen([sys.executable, "-m", "rl360cli", "status" if i % 2 else "provision", "--json"],
                              cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
             for i in range(16)]
    codes = [p.wait(timeout=120) for p in procs]
    assert codes == [0] * 16, [p.stderr.read() for p in procs]
    doc = json.loads(state.read_text())
    assert set(doc["tiers"]) == {"service", "training", "rollout"}


def test_events_log_appends_one_json_line_per_event(tmp_path):
    from rl360cli import events

    state = StateFile(tmp_path / "state.json")
    threads = [threading.Thread(target=lambda i=i: [events.record(state, stage="t", action="a", subject=f"s{i}",
                                                                  n=k) for k in range(50)]) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    lines = list(events.read(state.events_path))
    assert len(lines) == 400
    assert {e["subject"] for e in lines} == {f"s{i}" for i in range(8)}
    assert all(time.strptime(e["time"][:19], "%Y-%m-%dT%H:%M:%S") for e in lines)
