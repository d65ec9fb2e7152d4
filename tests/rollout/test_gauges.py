"""A step's scale figures (rl360cli/rollout/gauges.py): the running counters, and two real Ray session
actors over the simulated provider, behind the real sglang-router in front of a simulated engine, their
figures checked against what happened (the providers' own ledgers, the router's own counter, the
trajectories that came back)."""

from __future__ import annotations

import importlib.util
import json
import math
import random
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from rl360cli.metrics import Histogram, Level, merged_quantile
from rl360cli.rollout.gauges import StepGauges, metrics_url_of, router_requests
from tests.conftest import REPO, need

# ----------------------------------------------------------------------------- the counters


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_level_keeps_its_peak_and_time_weighted_mean_per_interval():
    clock = Clock()
    level = Level(clock)
    level.add(2)            # 2 for 1 s
    clock.now += 1
    level.add(3)            # 5 for 2 s
    clock.now += 2
    level.add(-5)           # 0 for 1 s
    clock.now += 1
    assert level.take() == {"now": 0, "max": 5, "mean": (2 * 1 + 5 * 2) / 4, "seconds": 4}
    level.add(1)
    clock.now += 2
    assert level.take() == {"now": 1, "max": 1, "mean": 1.0, "seconds": 2}


def test_merged_histograms_give_quantiles_within_five_percent():
    rng = random.Random(3)
    values = [rng.lognormvariate(0, 1.5) for _ in range(5000)]
    parts = [Histogram(), Histogram(), Histogram()]
    for i, value in enumerate(values):
        parts[i % 3].add(value)
    taken = [p.take() for p in parts]
    ordered = sorted(values)
    for q in (0.5, 0.9, 0.99):
        exact = ordered[math.ceil(q * len(ordered)) - 1]
        assert exact <= merged_quantile(taken, q) <= exact * Histogram.RATIO
    assert merged_quantile(taken, 1.0) == max(values)
    assert sum(t["count"] for t in taken) == 5000 and sum(t["sum"] for t in taken) == pytest.approx(sum(values))
    assert parts[0].take()["count"] == 0  # a take starts again empty
    assert merged_quantile([Histogram().take()], 0.99) is None


def test_the_router_counter_is_read_from_its_prometheus_text():
    text = ('# TYPE smg_router_requests_total counter\n'
            'smg_router_requests_total{router_type="http",endpoint="generate",streaming="false"} 7\n'
            'smg_router_requests_total{router_type="http",endpoint="generate",streaming="true"} 2\n'
            'smg_router_requests_total{router_type="http",endpoint="flush_cache",streaming="false"} 5\n'
            'smg_http_requests_total{method="POST",path="/generate"} 9\n')
    assert router_requests(text) == 9
    assert router_requests("smg_http_requests_total 3\n") == 0  # none routed yet: the router has no counter
    assert metrics_url_of("http://127.0.0.1:32000") == "http://127.0.0.1:32001/metrics"


# ----------------------------------------------------------------------------- real actors

NUM_ACTORS = 2
SESSIONS_PER_ACTOR = 16
PER_ACTOR_SANDBOXES = 4


def free_port_pair() -> int:
    """A port p with p + 1 free too (the router and its metrics, as `rl360 serve` lays them out)."""
    import socket

    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        try:
            with socket.socket() as s:
                s.bind(("127.0.0.1", port + 1))
            return port
        except OSError:
            continue
    raise RuntimeError("no free pair of ports")


def wait_ok(url: str, proc: subprocess.Popen, log: Path, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()[-2000:]
        try:
            with urllib.request.urlopen(url, timeout=2) as reply:
                if reply.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"{url} not ready:\n{log.read_text()[-2000:]}")


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A simulated engine behind the real router, the router's metrics on its port + 1."""
    need(importlib.util.find_spec("sglang_router") is not None,
         "sglang-router is not installed: pip install 'rl360[rollout]'")
    from rl360cli.inference.config import EngineConfig
    from rl360cli.inference.router import router_command, wait_router_workers
    from rl360cli.inference.testing import build_tiny_test_model

    folder = tmp_path_factory.mktemp("gauges")
    model = build_tiny_test_model(folder / "tiny")
    engine_port, router_port = free_port_pair(), free_port_pair()
    engine_log, router_log = folder / "engine.log", folder / "router.log"
    engine = subprocess.Popen([sys.executable, "-m", "rl360cli.inference.sim_engine", "--ports", str(engine_port),
                               "--tokenizer", str(model), "--per-token-ms", "1", "--max-batch-size", "64"],
                              stdout=open(engine_log, "wb"), stderr=subprocess.STDOUT)
    router = None
    try:
        wait_ok(f"http://127.0.0.1:{engine_port}/health", engine, engine_log)
        cmd = router_command(EngineConfig(num_engines=1, router_policy="round_robin"),
                             worker_urls=[f"http://127.0.0.1:{engine_port}"], host="127.0.0.1", port=router_port,
                             prometheus_port=router_port + 1, python=sys.executable)
        router = subprocess.Popen(list(cmd.argv), stdout=open(router_log, "wb"), stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{router_port}"
        wait_ok(url + "/health", router, router_log)
        wait_router_workers(url, [f"http://127.0.0.1:{engine_port}"], timeout_s=60)
        yield model, url, folder
    finally:
        for proc in (router, engine):
            if proc is not None:
                proc.terminate()
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


@pytest.mark.slow
def test_the_actors_figures_match_what_happened(served):
    import ray

    from rl360cli.agent.config import RolloutConfig
    from rl360cli.rl.trajectory import Trajectory
    from rl360cli.rollout.session_actor import ActorSetup, SessionActor
    from rl360cli.sandbox.config import SandboxConfig, SimulatedSandboxConfig

    model, router_url, folder = served
    ledgers = folder / "ledgers"
    # Two nodes per actor; a 5 MB image over a 10 MB/s link shared by the pulls: each pull takes ~1 s,
    # long enough for the actors' sampling to see it.
    sandbox = SandboxConfig(provider="simulated", max_concurrent=PER_ACTOR_SANDBOXES, wave_size=1000,
                            exec_timeout_s=10.0, simulated=SimulatedSandboxConfig(
                                num_nodes=4, image_size_mb=5.0, registry_bandwidth_mb_s=10.0, max_concurrent_pulls=2,
                                start_latency_s=0.01, stop_latency_s=0.0, exec_median_s=0.02, exec_p99_ratio=2.0,
                                verifier_latency_s=0.01, ledger_dir=str(ledgers)))
    rollout = RolloutConfig(max_turns=2, max_new_tokens=8, max_total_tokens=512, num_session_actors=NUM_ACTORS,
                            max_concurrent_sessions=NUM_ACTORS * SESSIONS_PER_ACTOR)
    ray.init(address="local", num_cpus=2, include_dashboard=False, configure_logging=False, log_to_driver=False)
    try:
        remote = ray.remote(SessionActor)
        actors = [remote.options(num_cpus=0, max_concurrency=1000).remote(ActorSetup(
            run_id="gauges", policy_dir=str(model), router_url=router_url, actor_index=i,
            tasks_path=str(REPO / "recipes" / "tasks" / "arith-32"), rollout=rollout, sandbox=sandbox))
            for i in range(NUM_ACTORS)]
        gauges = StepGauges(actors)
        assert gauges.router_metrics_url == metrics_url_of(router_url)
        groups = ray.get([actor.run_group.remote(f"arith-0{i}", f"g{i}", SESSIONS_PER_ACTOR)
                          for i, actor in enumerate(actors)])
        figures = gauges.take()
        again = gauges.take()
        # Where the router's metrics cannot be read, the rate is the requests the actors sent.
        blind = StepGauges(actors, router_metrics_url=f"http://127.0.0.1:{free_port_pair()}/metrics")
        _, late = ray.get(actors[0].run_group.remote("arith-05", "late", 4))
        fallback = blind.take()
        ray.get([actor.close.remote() for actor in actors])
        # An actor that died (or that Ray is starting again: the same refusal) gives no figures; the take goes on.
        ray.kill(actors[1])
        without = gauges.take()
    finally:
        ray.shutdown()

    trajectories = [Trajectory.from_bytes(blob) for _, blobs in groups for blob in blobs]
    ledger = [json.loads(p.read_text()) for p in ledgers.glob("ledger-*.json")]
    assert len(trajectories) == NUM_ACTORS * SESSIONS_PER_ACTOR and len(ledger) == NUM_ACTORS
    # Every session held a slot at once (each actor's group started together), and all of them ended.
    assert figures["sessions_done"] == len(trajectories)
    assert figures["sessions_in_flight_max"] == NUM_ACTORS * SESSIONS_PER_ACTOR
    assert 0 < figures["sessions_in_flight_mean"] < NUM_ACTORS * SESSIONS_PER_ACTOR
    # Admission: 16 starts per actor through 4 slots; the providers' ledgers saw every start.
    assert NUM_ACTORS * (SESSIONS_PER_ACTOR - PER_ACTOR_SANDBOXES) <= figures["admission_queue_max"]
    assert figures["admission_queue_max"] <= NUM_ACTORS * SESSIONS_PER_ACTOR
    assert 0 < figures["admission_wait_mean_s"] <= figures["admission_wait_p99_s"] <= figures["admission_wait_max_s"]
    # (The ledgers hold the late group's starts too, which only the last take saw.)
    assert figures["sandbox_starts"] + fallback["sandbox_starts"] == sum(entry["starts"] for entry in ledger)
    warm = [take["warm_start_ratio"] * take["sandbox_starts"] for take in (figures, fallback)]
    assert round(sum(warm)) == sum(entry["warm_starts"] for entry in ledger) and 0 < warm[0] < 32
    # Pulls: seen in flight, never above what the providers allow, nor above their own peaks.
    assert figures["pull_cap"] == sum(entry["pull_cap"] for entry in ledger) == 2
    assert 0 < figures["pulls_in_flight_max"] <= sum(entry["max_pulls_in_flight"] for entry in ledger)
    # The router's own counter: one request per generation of every session, as the actors counted.
    turns = sum(len(t.metadata["turns"]) for t in trajectories)
    assert figures["router_rps_source"] == "router"
    assert round(figures["router_requests_per_s"] * figures["gauge_interval_s"]) == turns
    assert round(figures["actor_requests_per_s"] * figures["gauge_interval_s"]) == turns
    assert figures["actor_cpu_s"] > 0 and figures["actor_cpu_s_per_1k_sessions"] > 0
    assert figures["actor_memory_peak_mb"] > 0
    # The second take holds only what came after the first: nothing.
    assert again["sessions_done"] == 0 and again["sessions_in_flight_max"] == 0
    assert again["sandbox_starts"] == 0 and again["warm_start_ratio"] is None
    assert again["router_requests_per_s"] == 0 and again["admission_wait_p99_s"] is None
    late_turns = sum(len(Trajectory.from_bytes(blob).metadata["turns"]) for blob in late)
    assert fallback["router_rps_source"] == "actors" and fallback["sessions_done"] == 4
    # Actor 0's figures alone (the late group was the blind take's): half the pull cap, nothing since.
    assert without["sessions_done"] == 0 and 0 < without["pull_cap"] < figures["pull_cap"], without
    assert round(fallback["router_requests_per_s"] * fallback["gauge_interval_s"]) == late_turns
