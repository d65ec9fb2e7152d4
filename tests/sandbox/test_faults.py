"""Acceptance fault tests: each ends with the right outcome and cause, and leaves no container and no process.

The provider fixtures check after each test that nothing of its run is left (no container with its run
label on any dev node; no sandbox folder or process under its root).
"""

from __future__ import annotations

import asyncio
import threading

import docker
import pytest

from rl360cli.outcome import InfraCause, Outcome
from rl360cli.sandbox import janitor
from rl360cli.sandbox.attempt import run_attempt
from rl360cli.sandbox.config import SandboxConfig
from rl360cli.sandbox.task_loader import load_task
from rl360cli.sandbox.waves import AdmissionController
from tests.sandbox.conftest import BUSYBOX, PYTHON, SPARE, containers_of, dev_script, run, write_task

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(params=["process", "docker"])
def provider_of(request):
    if request.param == "process":
        return request.getfixturevalue("process_provider")
    return request.getfixturevalue("docker_provider")


def test_a_verifier_that_writes_no_reward(provider_of, tmp_path):
    task = load_task(write_task(tmp_path, "t", test_sh="echo 'checked, but forgot the reward'\n"))
    result = run(run_attempt(provider_of(), task, _noop, attempt_id="v", labels={}))
    assert result.outcome == Outcome.INFRA_FAILURE and result.cause == InfraCause.VERIFIER_ERROR
    assert "neither reward.json nor reward.txt" in result.detail and "forgot" in result.verifier_output


def test_an_agent_command_that_hangs_past_its_timeout(provider_of, tmp_path):
    task = load_task(write_task(tmp_path, "t", test_sh="echo 0 > /logs/verifier/reward.txt\n"))

    async def agent(sandbox):
        result = await sandbox.exec("sleep 600", timeout_s=1.5)
        assert result.timed_out and result.exit_code is None

    result = run(run_attempt(provider_of(), task, agent, attempt_id="h", labels={}))
    assert result.outcome == Outcome.MODEL_FAILURE and result.cause is None and result.reward == 0.0
    assert result.commands[0]["timed_out"] and result.timings["agent"] < 15


def test_an_oom_inside_the_agents_own_command(provider_of, tmp_path):
    provider = provider_of(memory_mb=128)
    task = load_task(write_task(tmp_path, "t", image=PYTHON, test_sh="echo 0 > /logs/verifier/reward.txt\n"))

    async def agent(sandbox):
        await sandbox.exec("python3 -c 'x = b\"y\" * (600 * 2**20)'", timeout_s=30)

    result = run(run_attempt(provider, task, agent, attempt_id="o", labels={}))
    assert result.outcome == Outcome.MODEL_FAILURE and result.cause is None
    assert result.commands[0]["limit"] == "memory" and "memory" in result.detail
    assert "reward" in result.events  # the verifier still ran: the reward stands


@pytest.mark.docker
def test_an_image_that_does_not_exist(docker_provider, tmp_path):
    task = load_task(write_task(tmp_path, "t", image="127.0.0.1:5000/rl360/no-such-image:404"))
    result = run(run_attempt(docker_provider(), task, _noop, attempt_id="i", labels={}))
    assert result.outcome == Outcome.INFRA_FAILURE and result.cause == InfraCause.IMAGE_PULL
    assert not result.retriable and "no-such-image" in result.detail


@pytest.mark.docker
def test_a_container_killed_from_outside_mid_attempt(docker_provider, docker_node_specs, tmp_path):
    provider = docker_provider()
    task = load_task(write_task(tmp_path, "t", image=BUSYBOX))
    started = threading.Event()
    where = {}

    async def agent(sandbox):
        where.update(node=sandbox.node, cid=sandbox.info()["container_id"])
        started.set()
        await sandbox.exec("sleep 120", timeout_s=180)

    async def go():
        job = asyncio.create_task(run_attempt(provider, task, agent, attempt_id="k", labels={}, node="n1"))
        await asyncio.to_thread(started.wait, 60)
        await asyncio.sleep(0.5)
        api = docker.APIClient(base_url=docker_node_specs[0].docker_host, version="auto")
        await asyncio.to_thread(api.kill, where["cid"])  # someone else kills it
        return await job

    result = run(go())
    assert result.outcome == Outcome.INFRA_FAILURE and result.cause == InfraCause.SANDBOX_LOST
    assert result.retriable and "killed from outside" in result.detail and result.node == "n1"


@pytest.mark.docker
@pytest.mark.slow
def test_a_nodes_dockerd_stopped_mid_attempt_is_node_lost_and_retried_elsewhere(
        docker_provider, docker_node_specs, spare_node, tmp_path):
    n1 = docker_node_specs[0]
    provider = docker_provider(nodes=[spare_node, n1])
    # The spare node's cache "holds" the image, so the controller places the first try there.
    ctl = AdmissionController(provider, config=SandboxConfig(provider="docker", retry_backoff_s=0.1),
                              node_images={SPARE: {BUSYBOX: None}})
    task = load_task(write_task(tmp_path, "t", image=BUSYBOX,
                                test_sh='[ "$(cat /app/out 2>/dev/null)" = done ] && r=1 || r=0; '
                                        "echo $r > /logs/verifier/reward.txt\n"))
    first_try = threading.Event()

    async def agent(sandbox):  # it can start over: the second call finishes the job
        if not first_try.is_set():
            first_try.set()
            await sandbox.exec("sleep 120", timeout_s=180)
        await sandbox.exec("echo done > /app/out", timeout_s=10)

    async def go():
        job = asyncio.create_task(ctl.run_attempt(task, agent, attempt_id="lost", labels={}, rerun_agent=True))
        await asyncio.to_thread(first_try.wait, 60)
        await asyncio.sleep(0.5)
        await asyncio.to_thread(dev_script, "stop-node", SPARE)
        return await job

    result = run(go())
    assert result.nodes_tried == (SPARE, "n1") and result.retries == 1
    assert result.retried_causes == (f"{SPARE}: node_lost",)
    assert result.outcome == Outcome.OK and result.reward == 1.0
    assert ctl.nodes_state[SPARE].down_until > 0
    # The container on the lost node could not be removed while it was down; once the node is back, the
    # janitor finds it by its labels (nothing else knows it) and removes it, with what the node's warm
    # pool held when it went down.
    dev_script("start-node", SPARE)
    left = containers_of(provider.run_id, [spare_node])
    assert left
    removed = janitor.remove_all((spare_node, n1), {}, runs={provider.run_id})
    assert set(removed) >= set(left)
    assert containers_of(provider.run_id, [spare_node, n1]) == []


async def _noop(sandbox):
    pass
