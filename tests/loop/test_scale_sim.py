"""recipes/scale-sim.toml at CI size: 512 sessions through `rl360 up` and the real loop, on the stand-ins.

The same recipe as the reference-scale run, made smaller and faster with `--set` (32 tasks x 16
samples, 8 simulated engines, millisecond latencies, higher failure rates): real Ray session
actors, the real admission controller over the simulated provider, the real sglang-router in
front of the simulated engines, real `build_batch`, the simulated trainer. Checks the issue's
invariants from `metrics.jsonl` and the providers' ledgers: the samples reached build_batch,
pulls in flight stayed within the cap, no node went over its reservations, every injected
failure was masked and counted by its cause, and `rl360 down` leaves nothing running.
"""

from __future__ import annotations

import collections
import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from rl360cli.ports import free_port_block
from tests.conftest import REPO, run_cli
from tests.loop.conftest import metrics_of

pytestmark = pytest.mark.slow

RECIPE = REPO / "recipes" / "scale-sim.toml"
NUM_STEPS = 2
SAMPLES = 32 * 16
PULL_CAP = 4
MAX_INFRA_RETRIES = 2


def ci_settings(ledger_dir: Path) -> list[str]:
    return [
        f"loop.num_steps={NUM_STEPS}", "loop.num_samples_per_task=16",
        f"rollout.max_concurrent_sessions={SAMPLES}",
        "engine.num_engines=8", "engine.simulated.per_token_ms=5.0", "engine.simulated.weight_update_ms=10.0",
        "sandbox.max_concurrent=512", "sandbox.wave_size=512", "sandbox.retry_backoff_s=0.05",
        f"sandbox.max_infra_retries={MAX_INFRA_RETRIES}", "sandbox.start_timeout_s=0.5",
        "sandbox.simulated.start_latency_s=0.05", "sandbox.simulated.stop_latency_s=0.01",
        "sandbox.simulated.exec_median_s=0.2", "sandbox.simulated.exec_p99_ratio=5.0",
        "sandbox.simulated.verifier_latency_s=0.05",
        "sandbox.simulated.image_size_mb=100.0", f"sandbox.simulated.max_concurrent_pulls={PULL_CAP}",
        "sandbox.simulated.start_failure_rate=0.05", "sandbox.simulated.start_timeout_rate=0.02",
        "sandbox.simulated.pull_failure_rate=0.3", "sandbox.simulated.oom_rate=0.03",
        "sandbox.simulated.node_lost_rate=0.01", f'sandbox.simulated.ledger_dir="{ledger_dir}"',
        "trainer.simulated.step_s=0.5",
    ]


def expected_masked(ledgers: list[dict], *, max_infra_retries: int = MAX_INFRA_RETRIES) -> collections.Counter:
    """The cause each attempt must end with, from the failures the providers drew: a failure in a
    command ends it; start failures end it once every retry failed too (the last one's cause).
    bench/bench_scale_sim.py checks its runs with it too."""
    by_attempt: dict[str, list[tuple[str, str]]] = collections.defaultdict(list)
    for ledger in ledgers:
        for attempt, operation, cause in ledger["failures"]:
            by_attempt[attempt].append((operation, cause))
    ends: collections.Counter = collections.Counter()
    for failures in by_attempt.values():
        in_commands = [cause for operation, cause in failures if operation.startswith("exec")]
        starts = [cause for operation, cause in failures if operation.startswith("start")]
        if in_commands:
            ends[in_commands[0]] += 1
        elif len(starts) == max_infra_retries + 1:
            ends[starts[-1]] += 1
    return ends


def test_scale_sim_at_ci_size_keeps_the_invariants(tmp_path: Path, state_path: Path):
    base = free_port_block(20)
    profile = tmp_path / "sim-profile.toml"
    text = (REPO / "cluster" / "sim-24-nodes.toml").read_text()
    text = re.sub(r"(?m)^base_port = \d+", f"base_port = {base}", text)
    profile.write_text(re.sub(r"(?m)^sync_port = \d+", f"sync_port = {base + 15}", text))
    ledger_dir = tmp_path / "ledgers"
    sets = [arg for setting in ci_settings(ledger_dir) for arg in ("--set", setting)]
    seen = ProcessWatch(state_path)
    seen.start()
    up = subprocess.run([sys.executable, "-m", "rl360cli", "up", "--recipe", str(RECIPE), "--profile", str(profile),
                         *sets], cwd=tmp_path, env={**os.environ, "RL360_STATE": str(state_path), "COLUMNS": "200"},
                        capture_output=True, text=True, timeout=600)
    seen.stop()
    try:
        assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
        doc = json.loads(state_path.read_text())
        run = doc["runs"][doc["current_run"]]
        assert run["status"] == "finished" and run["policy_version"] == NUM_STEPS
        # The engines, the router and the driver with its Ray processes were all seen running.
        assert len(seen.processes) >= 4

        # Every sample of every step went through build_batch; the kept ones reached the trainer.
        rows = metrics_of(state_path)
        assert len(rows) == NUM_STEPS
        assert all(row["samples"] == SAMPLES and row["batch"]["total"] == SAMPLES for row in rows)
        assert all(row["batch"]["kept"] > 0 for row in rows)
        # The simulated trainer bumped the version each step and the sync reached every engine with it.
        assert all(row["weight_sync_failed_engines"] == [] for row in rows)
        assert set(run["engine_versions"].values()) == {NUM_STEPS}

        ledgers = [json.loads(p.read_text()) for p in ledger_dir.glob("ledger-*.json")]
        assert len(ledgers) == 2  # one per session actor
        # Pulls: each actor's share of the cap, and the shares within the registry's cap.
        assert sum(ledger["pull_cap"] for ledger in ledgers) <= PULL_CAP
        assert all(0 < ledger["max_pulls_in_flight"] <= ledger["pull_cap"] for ledger in ledgers)
        # Reservations: the actors' node slices are disjoint and no node ever went over.
        nodes = [name for ledger in ledgers for name in ledger["nodes"]]
        assert len(nodes) == len(set(nodes)) == 24
        for ledger in ledgers:
            for name, node in ledger["nodes"].items():
                assert node["overcommits"] == 0, name
                assert node["peak_cpus"] <= node["cpus"] and node["peak_mb"] <= node["memory_mb"], name
        # The sessions of a step ran side by side, across both actors.
        assert sum(ledger["max_live"] for ledger in ledgers) >= SAMPLES * 3 // 4

        # The scale figures of each row (rl360cli/rollout/gauges.py) against the ledgers: every session of
        # a step in flight at once, every start counted, pulls within the cap, the router's own counter.
        assert max(row["sessions_in_flight_max"] for row in rows) == SAMPLES
        assert sum(row["sandbox_starts"] + row["sandbox_failed_starts"] for row in rows) == sum(
            ledger["starts"] for ledger in ledgers)
        assert all(row["pull_cap"] == PULL_CAP and 0 <= row["pulls_in_flight_max"] <= PULL_CAP for row in rows)
        assert all(row["router_rps_source"] == "router" for row in rows)
        assert round(sum(row["router_requests_per_s"] * row["gauge_interval_s"] for row in rows)) == round(
            sum(row["actor_requests_per_s"] * row["gauge_interval_s"] for row in rows))

        # Every drawn failure that ended an attempt was masked, under its own cause.
        masked = collections.Counter()
        for row in rows:
            masked.update(row["infra_failures_by_cause"])
        expected = expected_masked(ledgers)
        assert masked == expected
        assert {"oom_killed", "node_lost"} <= set(expected)
        drawn = collections.Counter()
        for ledger in ledgers:
            drawn.update(ledger["failures_by_cause"])
        assert {"sandbox_start", "timeout_infra", "image_pull", "oom_killed", "node_lost"} <= set(drawn)
    finally:
        down = run_cli("down", state=state_path, cwd=tmp_path, timeout=120)
    assert down.returncode == 0, down.stdout + down.stderr
    assert json.loads(state_path.read_text())["components"] == {}
    assert not [p for p in seen.processes if _started_at(p[0]) == p[1]], "processes of the run outlived `down`"


class ProcessWatch(threading.Thread):
    """Every process of the run's components (supervisors and all their descendants), seen every 0.2 s,
    as (pid, start time) so that a reused pid is not taken for one of them."""

    def __init__(self, state_path: Path):
        super().__init__(daemon=True)
        self.state_path = state_path
        self.processes: set[tuple[int, int]] = set()
        self._done = threading.Event()

    def stop(self) -> None:
        self._done.set()
        self.join()

    def run(self) -> None:
        while not self._done.wait(0.2):
            try:
                doc = json.loads(self.state_path.read_text())
            except (OSError, ValueError):
                continue
            roots = {rec["pid"] for rec in doc.get("components", {}).values() if rec.get("pid")}
            for pid in _descendants(roots):
                started = _started_at(pid)
                if started is not None:
                    self.processes.add((pid, started))


def _stat(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2:].split()  # fields from the state on (the name may hold spaces)


def _started_at(pid: int) -> int | None:
    """The process's start time (clock ticks since boot), or None when it is gone or a zombie."""
    fields = _stat(pid)
    if fields is None or fields[0] == "Z":
        return None
    return int(fields[19])


def _descendants(roots: set[int]) -> set[int]:
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (fields := _stat(int(entry.name))) is not None:
            parents[int(entry.name)] = int(fields[1])
    found = set(roots) & set(parents)
    while True:
        more = {pid for pid, parent in parents.items() if parent in found} - found
        if not more:
            return found
        found |= more
