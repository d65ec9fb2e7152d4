"""A rollout node's reaper (rl360cli/sandbox/docker/reaper.py) on a dev Docker node: the run's containers past their
session's deadline plus the grace are removed, running or not, whoever started them; nothing else is. And the
docker provider puts the session's deadline on its container (not on the spec a pool matches)."""

from __future__ import annotations

import time

import docker
import pytest

from rl360cli.sandbox.docker.reaper import DEADLINE_LABEL, reap_expired
from rl360cli.sandbox.task_loader import load_task
from tests.sandbox.conftest import BUSYBOX, run, write_task

pytestmark = [pytest.mark.docker, pytest.mark.timeout(240)]


def test_the_runs_containers_past_their_deadline_and_grace_are_removed_and_no_other(docker_node_specs):
    api = docker.APIClient(base_url=docker_node_specs[0].docker_host, version="auto", timeout=30)
    run_id, now = f"reap-{time.time_ns()}", time.time()
    # name -> labels: the one to go (an actor that died started it, long past its deadline), then those to keep.
    cases = {
        "expired": {"rl360.run": run_id, DEADLINE_LABEL: f"{now - 1000:.0f}"},
        "within-grace": {"rl360.run": run_id, DEADLINE_LABEL: f"{now - 10:.0f}"},
        "not-due": {"rl360.run": run_id, DEADLINE_LABEL: f"{now + 1000:.0f}"},
        "no-deadline": {"rl360.run": run_id},  # a warm pool's, not yet taken
        "bad-deadline": {"rl360.run": run_id, DEADLINE_LABEL: "soon"},
        "another-run": {"rl360.run": f"{run_id}-other", DEADLINE_LABEL: f"{now - 1000:.0f}"},
    }
    made = {}
    try:
        for name, labels in cases.items():
            made[name] = api.create_container(BUSYBOX, command=["sleep", "300"], labels=labels,
                                              host_config=api.create_host_config(network_mode="none"))["Id"]
            api.start(made[name])
        api.stop(made["expired"], timeout=0)  # running or not: both go
        assert reap_expired(api, run_id, grace_s=60, now=now) == [made["expired"]]
        left = {c["Id"] for c in api.containers(all=True, filters={"id": list(made.values())})}
        assert left == set(made.values()) - {made["expired"]}
        # A second round finds nothing more to do, and a container gone meanwhile is no error.
        assert reap_expired(api, run_id, grace_s=60, now=now) == []
    finally:
        for cid in made.values():
            try:
                api.remove_container(cid, force=True)
            except docker.errors.NotFound:
                pass


def test_a_sessions_container_carries_its_deadline_and_its_nodes_reaper_removes_it_once_due(docker_provider,
                                                                                           docker_node_specs,
                                                                                           tmp_path):
    provider = docker_provider(cpus=0.25, memory_mb=64)
    node = docker_node_specs[0]
    task = load_task(write_task(tmp_path, "t"))
    deadline = f"{time.time() - 1000:.0f}"  # its session ended long ago; nobody stopped it (its actor died)

    async def go():
        sandbox = await provider.start(task, attempt_id="r-1", labels={"rl360.run": provider.run_id,
                                                                        DEADLINE_LABEL: deadline}, node=node.name)
        api = docker.APIClient(base_url=node.docker_host, version="auto")
        labels = api.inspect_container(sandbox.container_id)["Config"]["Labels"]
        removed = reap_expired(api, provider.run_id, grace_s=60)
        await sandbox.stop()
        return sandbox, labels, removed

    sandbox, labels, removed = run(go())
    assert labels[DEADLINE_LABEL] == deadline and labels["rl360.attempt"] == "r-1"
    assert DEADLINE_LABEL not in dict(sandbox.spec.labels)  # a pool matches specs: no session's deadline in one
    assert removed == [sandbox.container_id]
