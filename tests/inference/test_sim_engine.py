"""Stand-in engines (rl360cli/inference/sim_engine.py): eight of them in one process behind the real
sglang-router, answered through rl360's real EngineClient; the weight-update protocol and pauses."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import subprocess
import sys
import urllib.request

import pytest

from rl360cli.agent.conversation import parse_action
from rl360cli.inference.client import EngineClient, EngineError
from rl360cli.inference.config import EngineConfig, SimulatedEngineConfig
from rl360cli.inference.router import router_command, router_ready_url, wait_router_workers
from rl360cli.inference.sim_engine import format_ports, parse_ports, sim_engine_specs
from tests.conftest import need

from .conftest import free_port, wait_http_ok

NUM_ENGINES = 8


def free_ports(count: int) -> list[int]:
    ports: set[int] = set()
    while len(ports) < count:
        ports.add(free_port())
    return sorted(ports)


def info(url: str) -> dict:
    with urllib.request.urlopen(url + "/server_info", timeout=10) as reply:
        return json.load(reply)


def post(url: str, path: str, body: dict) -> dict:
    request = urllib.request.Request(url + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as reply:
        return json.load(reply)


@pytest.fixture(scope="module")
def sim_cluster(tmp_path_factory, tiny_model):
    need(importlib.util.find_spec("sglang_router") is not None,
         "sglang-router is not installed: pip install 'rl360[rollout]'")
    folder = tmp_path_factory.mktemp("sim-engines")
    ports = free_ports(NUM_ENGINES)
    engines_log = folder / "engines.log"
    engines = subprocess.Popen(
        [sys.executable, "-m", "rl360cli.inference.sim_engine", "--ports", ",".join(map(str, ports)),
         "--tokenizer", str(tiny_model), "--per-token-ms", "20", "--max-batch-size", "4"],
        stdout=open(engines_log, "wb"), stderr=subprocess.STDOUT)
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    router = None
    try:
        for url in urls:
            wait_http_ok(url + "/health", engines, engines_log)
        port = free_port()
        cmd = router_command(EngineConfig(num_engines=NUM_ENGINES, router_policy="round_robin",
                                          router_health_check_interval_s=1),
                             worker_urls=urls, host="127.0.0.1", port=port, prometheus_port=free_port(),
                             python=sys.executable)
        router_log = folder / "router.log"
        router = subprocess.Popen(list(cmd.argv), stdout=open(router_log, "wb"), stderr=subprocess.STDOUT)
        router_url = f"http://127.0.0.1:{port}"
        wait_http_ok(router_ready_url("127.0.0.1", port), router, router_log)
        wait_router_workers(router_url, urls, timeout_s=60)
        yield router_url, urls, router_log
    finally:
        for proc in (router, engines):
            if proc is not None and proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


def test_requests_through_the_real_router_reach_every_simulated_engine(sim_cluster, tiny_model):
    router_url, urls, router_log = sim_cluster
    before = [info(u)["num_finished_requests"] for u in urls]
    # Each engine names the policy's tokenizer folder as its model, so the router loads that tokenizer
    # from this machine when the engine joins instead of asking the Hub for a model called "simulated".
    assert {info(u)["model_path"] for u in urls} == {str(tiny_model)}
    assert "HuggingFace" not in router_log.read_text(errors="replace")

    async def go():
        async with EngineClient(router_url) as client:
            return await asyncio.gather(*(client.generate([5, 6, i + 1], {"max_new_tokens": 64})
                                          for i in range(64)))

    results = asyncio.run(go())
    assert all(r.weight_version == 0 and r.finish_reason == "stop" for r in results)
    assert all(len(r.logprobs) == len(r.output_ids) > 0 for r in results)
    # The canned reply is an action the agent's own parser reads as a bash command.
    assert {parse_action(r.text).command for r in results} == {"echo 'sim' > answer.py"}
    gained = [info(u)["num_finished_requests"] - b for u, b in zip(urls, before)]
    assert sum(gained) == 64 and all(g > 0 for g in gained)


def test_max_new_tokens_cuts_a_reply_at_length(sim_cluster):
    router_url, _, _ = sim_cluster

    async def go():
        async with EngineClient(router_url) as client:
            return await client.generate([1, 2, 3], {"max_new_tokens": 3})

    result = asyncio.run(go())
    assert (len(result.output_ids), result.finish_reason) == (3, "length")


def test_a_weight_update_is_a_no_op_that_sets_the_version_every_engine_then_reports(sim_cluster):
    router_url, urls, _ = sim_cluster
    for url in urls:
        assert post(url, "/pause_generation", {"mode": "retract"})["status"] == "ok"
        answer = post(url, "/update_weights_from_distributed",
                      {"names": [], "dtypes": [], "shapes": [], "group_name": "g", "weight_version": "1",
                       "flush_cache": True})
        assert answer["success"] and answer["weight_version"] == "1"
        post(url, "/continue_generation", {})

    async def go():
        async with EngineClient(router_url) as client:
            return await asyncio.gather(*(client.generate([9, i + 1], {"max_new_tokens": 8})
                                          for i in range(16)))

    assert {r.weight_version for r in asyncio.run(go())} == {1}
    assert all(info(u)["num_weight_updates"] >= 1 for u in urls)


def test_a_pause_in_abort_mode_aborts_requests_in_flight_and_in_place_holds_them(sim_cluster):
    _, urls, _ = sim_cluster
    url = urls[0]

    async def go(mode: str):
        async with EngineClient(url) as client:
            request = asyncio.ensure_future(client.generate([4, 4], {"max_new_tokens": 64}))
            while info(url)["internal_states"][0]["num_running_reqs"] == 0:
                await asyncio.sleep(0.005)
            await asyncio.to_thread(post, url, "/pause_generation", {"mode": mode})
            held = not request.done()
            await asyncio.to_thread(post, url, "/continue_generation", {})
            try:
                return held, await request
            except EngineError as e:
                return held, e

    held, aborted = asyncio.run(go("abort"))
    assert isinstance(aborted, EngineError) and aborted.cause == "aborted"
    held, result = asyncio.run(go("in_place"))
    assert held and result.finish_reason == "stop"


def test_ports_and_the_serve_stages_processes():
    assert parse_ports("31002-31004,31010") == [31002, 31003, 31004, 31010]
    assert format_ports([31002, 31003, 31004, 31010]) == "31002-31004,31010"
    with pytest.raises(ValueError):
        parse_ports("31002,31002")
    engine = EngineConfig(kind="simulated", num_engines=5, simulated=SimulatedEngineConfig(engines_per_process=2))
    specs = sim_engine_specs(engine, ports=(40002, 40003, 40004, 40005, 40006), host="127.0.0.1", tokenizer=None,
                             python=sys.executable)
    assert [sorted(s.ports.values()) for s in specs] == [[40002, 40003], [40004, 40005], [40006]]
    assert specs[0].url == "http://127.0.0.1:40002" and specs[0].kind.startswith("engine")
