"""Benchmark: the state file and `rl360 status` at the reference deployment's size.

A state holding 8,192 sandboxes and 96 engines (plus the router and the
trainer): how long one locked write takes, and how long `rl360 status` (a
whole CLI process: start-up, reconcile against /proc, render) takes.
Goals (issue 2): a write under 20 ms, status under 300 ms.

    .venv/bin/python bench/bench_state.py        # writes the "State file and status" section of docs/benchmarks.md
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.report import write_section  # noqa: E402
from rl360cli.state.store import StateFile
from rl360cli.state.schema import now_iso  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def reference_state(state: StateFile) -> None:
    """Fill `state` like a running reference deployment; components point at live processes (this one)."""
    me = os.getpid()
    with state.update() as doc:
        doc["profile"] = {"name": "reference-33-nodes", "path": str(REPO / "cluster/local.toml"), "backend": "local"}
        for i in range(96):
            doc["components"][f"rollout/engine-{i}"] = _component("engine-local", f"engine-{i}", "rollout", me,
                                                                 31002 + i)
        doc["components"]["service/router"] = _component("router", "router", "service", me, 31000)
        doc["components"]["training/trainer"] = _component("trainer", "trainer", "training", me, None)
        for i in range(8192):
            doc["sandboxes"][f"sb-{i:05d}"] = {
                "run": "ref", "node": f"rollout-{i % 24:02d}", "provider": "docker",
                "image": "registry:5000/rl360/python:3.11", "container_id": f"{i:064x}", "status": "running",
                "started_at": now_iso(), "start_latency_s": 1.234,
            }
        doc["runs"]["ref"] = {"name": "ref", "status": "running", "step": 42, "num_steps": 150,
                              "policy_version": 42, "run_dir": "/tmp", "started_at": now_iso()}
        doc["current_run"] = "ref"


def _component(kind: str, name: str, tier: str, pid: int, port: int | None) -> dict:
    from rl360cli import procinfo

    return {"backend": "local", "node": "local", "pid": pid, "start_time": procinfo.start_time(pid),
            "supervisor_pid": pid, "supervisor_start_time": procinfo.start_time(pid), "pgid": os.getpgid(pid),
            "stage": "serve", "tier": tier, "name": name, "kind": kind, "run": "ref",
            "ports": {"http": port} if port else {}, "status": "running", "started_at": now_iso(),
            "log_path": "/tmp/x.log", "status_path": "/tmp/x.status.json", "exit_code": None, "reason": None}


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        state = StateFile(Path(tmp) / "state.json")
        reference_state(state)
        size_mb = state.path.stat().st_size / 1e6

        writes = []
        for i in range(30):
            started = time.perf_counter()
            with state.update() as doc:
                doc["runs"]["ref"]["step"] = i
            writes.append(time.perf_counter() - started)

        env = {**os.environ, "RL360_STATE": str(state.path), "COLUMNS": "160"}
        runs = []
        for _ in range(7):
            started = time.perf_counter()
            proc = subprocess.run([sys.executable, "-m", "rl360cli", "status"], env=env, cwd=REPO,
                                  capture_output=True, text=True)
            runs.append(time.perf_counter() - started)
            assert proc.returncode == 0, proc.stderr
        assert "8192" in proc.stdout and "rollout/engine-local ×96" in proc.stdout

    lines = [
        f"State with 96 engines, the router, the trainer and 8,192 sandboxes: {size_mb:.1f} MB of JSON.",
        "",
        "| measure | p50 | max | goal |",
        "|---|---|---|---|",
        f"| one locked write (read, modify, write, fsync, rename) | {statistics.median(writes) * 1000:.1f} ms "
        f"| {max(writes) * 1000:.1f} ms | < 20 ms |",
        f"| `rl360 status` (whole CLI process: start-up, reconcile, render) | {statistics.median(runs) * 1000:.0f} ms "
        f"| {max(runs) * 1000:.0f} ms | < 300 ms |",
        "",
        f"Measured {time.strftime('%Y-%m-%d')} on 2 cores; load average {os.getloadavg()[0]:.1f} at the end.",
    ]
    write_section("State file and status", "\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
