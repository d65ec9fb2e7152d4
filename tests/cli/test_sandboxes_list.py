"""`rl360 sandboxes list` of a large fleet: beyond `PLAIN_OVER` rows, plain columns (a rich table of 8,192
rows took 4 s), every sandbox on its own line with its status checked now."""

from __future__ import annotations

from rl360cli.commands.sandboxes import PLAIN_OVER
from rl360cli.state.schema import now_iso
from rl360cli.state.store import StateFile


def test_a_large_fleet_is_listed_in_plain_columns_one_line_each(cli, state_path, tmp_path):
    count = PLAIN_OVER + 50
    with StateFile(state_path).update() as doc:
        for i in range(count):
            # Process sandboxes whose keeper is gone and whose folder never existed: "missing" when checked.
            doc["sandboxes"][f"sb-{i:04d}"] = {
                "run": "fleet-1", "node": "local", "provider": "process", "task": "t", "attempt": f"a{i}",
                "image": "host", "container_id": None, "pid": 2**22 + i, "pid_start": 1, "status": "running",
                "started_at": now_iso(), "start_latency_s": 0.01, "queued_s": 0.0,
                "folder": str(tmp_path / "gone" / str(i))}
    listed = cli("sandboxes", "list")
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert lines[0] == f"sandboxes ({count})"
    assert lines[1].split() == ["sandbox", "run", "provider", "node", "status", "image", "started"]
    rows = [line.split() for line in lines[2:]]
    assert len(rows) == count and {row[0] for row in rows} == {f"sb-{i:04d}" for i in range(count)}
    assert all(row[1:6] == ["fleet-1", "process", "local", "missing", "host"] for row in rows)
    # The columns line up: every row's status starts where the header's does.
    assert {line.index(" missing ") + 1 for line in lines[2:]} == {lines[1].index("status")}
