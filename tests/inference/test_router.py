"""The real sglang-router (pip sglang-router 0.3.x) in front of two real local engines, as `rl360 serve` runs it."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import subprocess
import sys
import urllib.request

import pytest

from rl360cli.inference.client import EngineClient, EngineError
from rl360cli.inference.config import EngineConfig
from rl360cli.inference.router import router_command, router_ready_url, wait_router_workers
from tests.conftest import need

from .conftest import free_port, wait_http_ok

pytestmark = pytest.mark.slow


def served(url: str) -> int:
    with urllib.request.urlopen(url + "/get_server_info", timeout=10) as reply:
        return json.load(reply)["num_finished_requests"]


def running(url: str) -> int:
    with urllib.request.urlopen(url + "/get_load", timeout=10) as reply:
        return json.load(reply)[0]["num_reqs"]


@pytest.fixture(scope="module")
def cluster(module_engines, tiny_model, tmp_path_factory):
    need(importlib.util.find_spec("sglang_router") is not None,
         "sglang-router is not installed: pip install 'rl360[rollout]'")
    engines = module_engines(tiny_model, count=2)
    port = free_port()
    cmd = router_command(EngineConfig(num_engines=2, router_policy="round_robin", router_health_check_interval_s=1),
                         worker_urls=[e.url for e in engines], host="127.0.0.1", port=port,
                         prometheus_port=free_port(), python=sys.executable)
    log = tmp_path_factory.mktemp("router") / "router.log"
    router = subprocess.Popen(list(cmd.argv), stdout=open(log, "wb"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http_ok(router_ready_url("127.0.0.1", port), router, log)
        wait_router_workers(url, [e.url for e in engines], timeout_s=60)
        yield url, engines
    finally:
        router.terminate()
        try:
            router.wait(timeout=20)
        except subprocess.TimeoutExpired:
            router.kill()
            router.wait()


def test_requests_through_the_router_reach_both_engines(cluster):
    url, engines = cluster
    before = [served(e.url) for e in engines]

    async def go():
        async with EngineClient(url) as client:
            return await asyncio.gather(*(client.generate([1, 2, i], {"max_new_tokens": 4}) for i in range(8)))

    results = asyncio.run(go())
    assert len(results) == 8 and all(len(r.output_ids) <= 4 and r.weight_version == 0 for r in results)
    gained = [served(e.url) - b for e, b in zip(engines, before)]
    assert sum(gained) == 8 and all(g > 0 for g in gained)


def test_a_dead_engine_fails_its_requests_and_the_router_stops_sending_to_it(cluster):
    url, (alive, victim) = cluster

    async def go():
        async with EngineClient(url) as client:
            async def attempt():
                try:
                    return await client.generate([3, 4], {"max_new_tokens": 800, "ignore_eos": True})
                except EngineError as e:
                    return e

            in_flight = [asyncio.ensure_future(attempt()) for _ in range(6)]
            while not (running(alive.url) and running(victim.url)):
                await asyncio.sleep(0.05)
            victim.kill()
            outcomes = await asyncio.gather(*in_flight)

            await asyncio.to_thread(wait_router_workers, url, [alive.url], unhealthy=[victim.url], timeout_s=60)
            before = served(alive.url)
            after_kill = await asyncio.gather(*(client.generate([5, i], {"max_new_tokens": 3}) for i in range(6)))
            return outcomes, after_kill, served(alive.url) - before

    outcomes, after_kill, gained = asyncio.run(go())
    errors = [o for o in outcomes if isinstance(o, EngineError)]
    finished = [o for o in outcomes if not isinstance(o, EngineError)]
    # Round robin put requests on both: those on the dead engine fail, typed; the others finish.
    assert errors and finished
    assert all(e.infra_cause == "engine_error" and e.cause in ("http", "disconnected") for e in errors)
    assert all(len(r.output_ids) == 800 for r in finished)
    # Afterwards every request goes to the live engine and succeeds.
    assert len(after_kill) == 6 and gained == 6
