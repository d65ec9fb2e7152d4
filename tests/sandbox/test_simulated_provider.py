"""The simulated provider (rl360cli/sandbox/simulated.py): the provider contract, image pulls under the
registry's cap, failures by cause at their rates, and the real admission controller over it.

The stand-in runs no processes, so these are fast; their latencies are set to milliseconds.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import statistics
from pathlib import Path

import pytest

from rl360cli.outcome import InfraCause, Outcome
from rl360cli.sandbox.attempt import noop_agent, run_attempt
from rl360cli.sandbox.config import SandboxConfig, SimulatedSandboxConfig
from rl360cli.sandbox.providers import make_provider
from rl360cli.sandbox.simulated import SimulatedProvider
from rl360cli.sandbox.task_loader import load_task
from rl360cli.sandbox.taxonomy import Event, SandboxError
from rl360cli.sandbox.waves import AdmissionController
from tests.conftest import REPO

TASK = load_task(REPO / "recipes" / "tasks" / "arith-32" / "arith-00")
FAST = dict(start_latency_s=0.001, stop_latency_s=0.0, exec_median_s=0.001, exec_p99_ratio=2.0,
            verifier_latency_s=0.001, image_size_mb=1.0, registry_bandwidth_mb_s=10_000.0)


def config(*, sandbox=None, **simulated) -> SandboxConfig:
    """A simulated [sandbox] with millisecond latencies and admission waves wide enough not to pace a test."""
    waves = {"max_concurrent": 1000, "wave_size": 1000, **(sandbox or {})}
    return SandboxConfig(provider="simulated", simulated=SimulatedSandboxConfig(**{**FAST, **simulated}), **waves)


def image_task(index: int):
    """arith-00 with an image of its own (the simulated caches are keyed by image)."""
    return dataclasses.replace(TASK, docker_image=f"127.0.0.1:5000/sim/task-{index}:1")


async def one_command_agent(sandbox) -> None:
    await sandbox.exec("echo '1' > answer.py", timeout_s=5)


# ----------------------------------------------------------------------------- the contract


def test_a_simulated_sandbox_keeps_the_provider_contract():
    async def scenario():
        provider = SimulatedProvider(config(num_nodes=2, node_cpus=4, node_memory_mb=4096))
        assert [n.name for n in provider.nodes()] == ["sim-00", "sim-01"]
        sandbox = await provider.start(TASK, attempt_id="a1", labels={}, node="sim-01")
        assert (sandbox.node, sandbox.provider, sandbox.task.id) == ("sim-01", "simulated", "arith-00")
        result = await sandbox.exec("anything at all", timeout_s=5)
        assert (result.exit_code, result.output, result.timed_out) == (0, "", False)
        assert await sandbox.read_file("/logs/verifier/reward.txt") is None
        with pytest.raises(SandboxError) as missing:
            await sandbox.download("/nowhere", "/tmp/never-written")
        assert missing.value.event == Event.PROVIDER_FAILED and "no such" in missing.value.detail
        state = provider.nodes_state["sim-01"]
        assert (state.reserved_cpus, state.reserved_mb, state.live) == (TASK.cpus, TASK.memory_mb, 1)
        await sandbox.stop()
        await sandbox.stop()  # safe twice; the reservation is given back once
        assert (state.reserved_cpus, state.reserved_mb, state.live) == (0.0, 0, 0)
        with pytest.raises(SandboxError) as gone:
            await sandbox.exec("true", timeout_s=5)
        assert gone.value.event == Event.SANDBOX_KILLED

    asyncio.run(scenario())


def test_a_whole_attempt_runs_through_make_provider_and_the_verifier_writes_a_reward():
    async def scenario():
        provider = make_provider(config(pass_rate=0.5, num_nodes=3), run_id="r1")
        assert isinstance(provider, AdmissionController) and provider.inner.name == "simulated"
        results = await asyncio.gather(*(provider.run_attempt(TASK, one_command_agent, attempt_id=f"a{i}")
                                         for i in range(40)))
        assert {r.outcome for r in results} <= {Outcome.OK}
        rewards = [r.reward for r in results]
        assert set(rewards) == {0.0, 1.0}  # both drawn among 40 at pass_rate 0.5
        assert all(r.node and r.node.startswith("sim-") for r in results)
        assert provider.inner.ledger.live == 0

    asyncio.run(scenario())


def test_the_ledger_times_the_agents_commands_with_the_sandboxes_live():
    async def scenario():
        provider = make_provider(config(num_nodes=2), run_id="r1")
        await asyncio.gather(*(provider.run_attempt(TASK, one_command_agent, attempt_id=f"a{i}") for i in range(30)))
        return provider.inner.ledger_dict()

    ledger = asyncio.run(scenario())
    assert ledger["execs"] - ledger["verifier_execs"] == 30  # one agent command per attempt
    seconds = [second for second, _, _ in ledger["timeline"]]
    assert seconds == sorted(set(seconds))  # one reading a second, the first command's
    for _, live, agent_commands in ledger["timeline"]:
        assert 1 <= live <= 30 and 0 <= agent_commands <= 30
    # The first reading is taken at the very first command, an agent's: its count is already 1.
    assert ledger["timeline"][0][2] == 1


def test_a_command_drawn_longer_than_its_timeout_times_out_as_a_model_failure():
    async def scenario():
        provider = SimulatedProvider(config(exec_median_s=0.05, exec_p99_ratio=1.0))
        result = await run_attempt(provider, TASK, lambda s: s.exec("sleep", timeout_s=0.001), attempt_id="t1")
        assert result.outcome == Outcome.MODEL_FAILURE and Event.AGENT_EXEC_TIMEOUT.value in result.events

    asyncio.run(scenario())


def test_exec_latencies_follow_the_recipes_lognormal():
    provider = SimulatedProvider(config(exec_median_s=2.0, exec_p99_ratio=10.0))
    draws = sorted(provider.exec_latency() for _ in range(40_000))
    assert statistics.median(draws) == pytest.approx(2.0, rel=0.05)
    assert draws[int(0.99 * len(draws))] == pytest.approx(20.0, rel=0.15)


# ----------------------------------------------------------------------------- images


def test_pulls_in_flight_never_exceed_the_cap_and_warm_starts_do_not_pull():
    async def scenario():
        provider = SimulatedProvider(config(num_nodes=6, max_concurrent_pulls=3, image_size_mb=20.0,
                                            registry_bandwidth_mb_s=2000.0))
        in_flight = []

        async def watch():
            while True:
                in_flight.append(provider.ledger.pulls_in_flight)
                await asyncio.sleep(0)

        watcher = asyncio.ensure_future(watch())
        # Four images on six nodes, three starts of each: 24 pulls, each shared by its three starts.
        sandboxes = await asyncio.gather(*(provider.start(image_task(i), attempt_id=f"c{i}-{n}-{k}", labels={},
                                                          node=f"sim-{n:02d}")
                                           for i in range(4) for n in range(6) for k in range(3)))
        watcher.cancel()
        ledger = provider.ledger
        assert ledger.pulls == 24 and ledger.cold_starts == 72
        assert max(in_flight) == ledger.max_pulls_in_flight == 3
        await asyncio.gather(*(s.stop() for s in sandboxes))
        again = await provider.start(image_task(2), attempt_id="warm", labels={}, node="sim-04")
        assert (ledger.pulls, ledger.warm_starts) == (24, 1)
        await again.stop()

    asyncio.run(scenario())


def test_a_prewarmed_fleet_starts_warm():
    async def scenario():
        provider = SimulatedProvider(config(prewarmed=True))
        await (await provider.start(TASK, attempt_id="p", labels={})).stop()
        assert (provider.ledger.pulls, provider.ledger.warm_starts) == (0, 1)

    asyncio.run(scenario())


def test_shares_split_the_nodes_and_the_pull_cap():
    sim = {"num_nodes": 5, "max_concurrent_pulls": 8}
    first, second = (SimulatedProvider(config(**sim), share=(i, 2)) for i in range(2))
    assert [n.name for n in first.nodes()] == ["sim-00", "sim-02", "sim-04"]
    assert [n.name for n in second.nodes()] == ["sim-01", "sim-03"]
    assert first.ledger.pull_cap + second.ledger.pull_cap <= 8
    many = SimulatedProvider(config(**sim, node_cpus=100.0), share=(3, 10))
    assert len(many.nodes()) == 5 and many.nodes()[0].cpus == pytest.approx(10.0)


# ----------------------------------------------------------------------------- failures by cause


@pytest.mark.parametrize("rate, cause, draws_per_attempt", [
    ("start_failure_rate", InfraCause.SANDBOX_START, 1),
    ("start_timeout_rate", InfraCause.TIMEOUT_INFRA, 1),
    ("pull_failure_rate", InfraCause.IMAGE_PULL, 1),
    ("oom_rate", InfraCause.OOM_KILLED, 1),
    # Per command: the agent's one and the verifier's.
    ("node_lost_rate", InfraCause.NODE_LOST, 2),
])
def test_failures_fire_at_their_rate_and_end_attempts_with_their_cause(rate, cause, draws_per_attempt):
    num = 400

    async def scenario():
        provider = make_provider(config(sandbox={"max_infra_retries": 0, "start_timeout_s": 0.001},
                                        **{rate: 0.2}, num_nodes=4), run_id="f")
        # Cold pulls only happen once per node and image: give every attempt an image of its own.
        tasks = [image_task(i) if rate == "pull_failure_rate" else TASK for i in range(num)]
        results = await asyncio.gather(*(provider.run_attempt(tasks[i], one_command_agent, attempt_id=f"f{i}")
                                         for i in range(num)))
        return results, provider.inner.ledger

    results, ledger = asyncio.run(scenario())
    failed = {r.attempt_id: r.cause for r in results if r.outcome == Outcome.INFRA_FAILURE}
    drawn = {attempt: recorded for attempt, _, recorded in ledger.failures}
    assert {a: c.value for a, c in failed.items()} == drawn
    assert set(failed.values()) == {cause}
    # Binomial: within four standard deviations of the expected count (80 of 400 at one draw of 0.2).
    p = 1 - 0.8**draws_per_attempt
    assert abs(len(failed) - num * p) <= 4 * (num * p * (1 - p)) ** 0.5
    assert all(r.outcome == Outcome.OK for r in results if r.attempt_id not in failed)


def test_retried_start_failures_are_drawn_afresh_and_recorded_by_the_admission_controller():
    async def scenario():
        provider = make_provider(config(sandbox={"max_infra_retries": 2, "retry_backoff_s": 0.0},
                                        start_failure_rate=0.3, num_nodes=3), run_id="r")
        results = await asyncio.gather(*(provider.run_attempt(TASK, noop_agent, attempt_id=f"r{i}")
                                         for i in range(200)))
        return results, provider

    results, provider = asyncio.run(scenario())
    retried = [r for r in provider.records if r.retry > 0]
    assert retried and any(r.ok for r in retried)
    assert sum(r.ok is False for r in provider.records) == provider.inner.ledger.failures_by_cause["sandbox_start"]
    masked = [r for r in results if r.outcome == Outcome.INFRA_FAILURE]
    assert len(masked) < sum(r.ok is False for r in provider.records)  # retries saved some


# ----------------------------------------------------------------------------- admission over it


def test_the_admission_controller_never_overcommits_a_simulated_node(tmp_path: Path):
    async def scenario():
        provider = make_provider(config(sandbox={"cpus": 0.5, "memory_mb": 512},
                                        num_nodes=3, node_cpus=4.0, node_memory_mb=3072, exec_median_s=0.005,
                                        ledger_dir=str(tmp_path)), run_id="adm")
        await asyncio.gather(*(provider.run_attempt(TASK, one_command_agent, attempt_id=f"n{i}")
                               for i in range(120)))
        await provider.close()
        return provider

    provider = asyncio.run(scenario())
    (ledger_file,) = tmp_path.glob("ledger-adm-*.json")
    ledger = json.loads(ledger_file.read_text())
    assert ledger["starts"] == 120 and ledger["max_live"] == 18  # 3 nodes x min(4 / 0.5, 3072 / 512)
    for name, node in ledger["nodes"].items():
        assert node["overcommits"] == 0
        assert node["peak_cpus"] <= node["cpus"] and node["peak_mb"] <= node["memory_mb"], name
    assert provider.summary()["peak_reserved"]["sim-00"]["memory_mb"] == 3072


def test_bad_simulated_settings_are_refused_with_the_fix():
    with pytest.raises(ValueError, match="exec_p99_ratio must be at least 1"):
        SimulatedSandboxConfig(exec_p99_ratio=0.5)
    with pytest.raises(ValueError, match="oom_rate must be in"):
        SimulatedSandboxConfig(oom_rate=1.5)
