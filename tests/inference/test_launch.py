"""Golden command lines of the engines and the router, built from stages/*.toml and the recipe's [engine]."""

from __future__ import annotations

import dataclasses
import importlib.util
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from rl360cli.errors import Rl360Error
from rl360cli.inference.config import EngineConfig
from rl360cli.inference.launch import engine_command, engine_spec, router_spec, serve_ports
from rl360cli.inference.router import (check_router_open_files, generations_in_flight, require_router,
                                       router_command, router_open_files_needed)
from rl360cli.inference.sglang import sglang_server_command
from rl360cli.inference.templates import render
from tests.conftest import need

REPO = Path(__file__).resolve().parents[2]


def test_sglang_server_command_golden():
    engine = EngineConfig(kind="sglang", tp_size=4, mem_fraction_static=0.85, max_batch_size=256,
                          extra_args={"--context-length": "32768", "--enable-metrics": "", "--log-level": "warning"})
    cmd = sglang_server_command(engine, model_path="/models/k2-horizon-7b", host="10.1.0.7", port=31002,
                                weight_version=3, dtype="bfloat16", seed=7, api_key_file="/runs/r1/api-key",
                                python="python3", nccl_ifname="ib0")
    # The key is filled in from its file on the node (keyed_launch); the command itself never holds it.
    assert " ".join(cmd.argv) == (
        "python3 -m rl360cli.inference.keyed_launch --api-key-file /runs/r1/api-key -- "
        "python3 -m sglang.launch_server --model-path /models/k2-horizon-7b --host 10.1.0.7 --port 31002 "
        "--tp-size 4 --mem-fraction-static 0.85 --max-running-requests 256 --dtype bfloat16 --random-seed 7 "
        "--weight-version 3 --api-key <api-key file> --trust-remote-code --context-length 32768 --enable-metrics "
        "--log-level warning"
    )
    assert cmd.env == {"NCCL_SOCKET_IFNAME": "ib0"}


def test_sglang_flags_without_a_value_are_left_out():
    cmd = sglang_server_command(EngineConfig(kind="sglang"), model_path="/m", host="h", port=1, python="python3")
    assert cmd.argv == ("python3", "-m", "sglang.launch_server", "--model-path", "/m", "--host", "h", "--port", "1",
                        "--tp-size", "1", "--max-running-requests", "32", "--weight-version", "0",
                        "--trust-remote-code", "--log-level", "info")
    assert cmd.env == {}


def test_local_engine_command_golden():
    engine = EngineConfig(max_batch_size=16, max_wait_ms=2.5, num_threads=1, weight_sync_timeout_s=90)
    cmd = engine_command(engine, model_path="/runs/r1/model", host="127.0.0.1", port=31002, weight_version=0,
                         api_key_file="/runs/r1/api-key", python="python3")
    assert cmd.argv == (
        "python3", "-m", "rl360cli.inference.server", "--model", "/runs/r1/model", "--host", "127.0.0.1",
        "--port", "31002", "--max-batch-size", "16", "--max-wait-ms", "2.5", "--weight-version", "0",
        "--dtype", "float32", "--seed", "0", "--num-threads", "1", "--dist-timeout-s", "90",
        "--api-key-file", "/runs/r1/api-key", "--log-level", "info",
    )
    # The engine reads the key file itself: the key is in neither its command line nor its environment.
    assert cmd.env == {"GLOO_SOCKET_IFNAME": "lo"}
    # The prefix cache's size is written only where the recipe moves it off the engine's default.
    no_cache = engine_command(dataclasses.replace(engine, prefix_cache_mb=0), model_path="/m", host="127.0.0.1",
                              port=1, weight_version=0, python="python3")
    assert no_cache.argv[no_cache.argv.index("--prefix-cache-mb") + 1] == "0"
    # The static KV cache (CUDA graphs on a GPU) is a bare flag, written only when the recipe asks for it.
    static = engine_command(dataclasses.replace(engine, static_kv=True, device="cuda"), model_path="/m",
                            host="127.0.0.1", port=1, weight_version=0, python="python3")
    assert static.argv[-9:] == ("--device", "cuda", "--num-threads", "1", "--static-kv", "--dist-timeout-s", "90",
                                "--log-level", "info")


def test_router_command_golden():
    engine = EngineConfig(num_engines=2, router_policy="round_robin", router_health_check_interval_s=1)
    cmd = router_command(engine, worker_urls=["http://127.0.0.1:31002", "http://127.0.0.1:31003"],
                         host="127.0.0.1", port=31000, prometheus_port=31001, python="python3")
    assert " ".join(cmd.argv) == (
        "python3 -m sglang_router.launch_router --host 127.0.0.1 --port 31000 "
        "--worker-urls http://127.0.0.1:31002 http://127.0.0.1:31003 --policy round_robin "
        "--prometheus-host 127.0.0.1 --prometheus-port 31001 --health-check-endpoint /health "
        "--health-check-interval-secs 1 --health-check-timeout-secs 1 --health-failure-threshold 1 "
        "--health-success-threshold 1 --cb-failure-threshold 3 --cb-timeout-duration-secs 30 "
        "--retry-max-retries 1 --request-timeout-secs 1800 --worker-startup-timeout-secs 600 "
        "--worker-startup-check-interval 1 --shutdown-grace-period-secs 5 --log-level warn"
    )
    assert cmd.env == {}


def test_router_flags_parse_with_the_installed_router():
    """The router's own parser accepts every flag the template writes (catches renamed flags on upgrade)."""
    need(importlib.util.find_spec("sglang_router") is not None, "sglang-router is not installed: pip install -e '.[rollout]'")
    from sglang_router.launch_router import parse_router_args

    cmd = router_command(EngineConfig(), worker_urls=["http://127.0.0.1:1"], host="127.0.0.1", port=2,
                         prometheus_port=3, api_key_file="/runs/r1/api-key", python=sys.executable)
    assert cmd.argv[1:6] == ("-m", "rl360cli.inference.keyed_launch", "--api-key-file", "/runs/r1/api-key", "--")
    args = parse_router_args(list(cmd.argv[9:]))
    assert args.worker_urls == ["http://127.0.0.1:1"] and args.retry_max_retries == 1
    assert args.prometheus_host == "127.0.0.1" and args.health_failure_threshold == 1
    assert args.api_key == "<api-key file>"


def test_missing_router_package_names_the_install_command(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "sglang_router" else real(name, *a))
    with pytest.raises(Rl360Error) as info:
        require_router()
    assert info.value.fix == "install it with: pip install 'rl360[rollout]'"
    with pytest.raises(Rl360Error, match="sglang-router"):
        router_command(EngineConfig(), worker_urls=["http://x:1"], host="h", port=1, prometheus_port=2,
                       python=sys.executable)


def test_generations_in_flight_are_the_sessions_but_no_more_than_the_engines_run():
    engine = EngineConfig(kind="simulated", num_engines=96, max_batch_size=96)
    assert generations_in_flight(engine, 8192) == 8192
    assert generations_in_flight(engine, 16384) == 96 * 96


def test_the_router_open_files_check_counts_two_per_generation_and_one_per_engine():
    engine = EngineConfig(kind="simulated", num_engines=96, max_batch_size=96)
    need = 2 * 9216 + 96 + 256
    check_router_open_files(engine, 16384, hard_limit=need)  # just enough
    with pytest.raises(Rl360Error) as refused:
        check_router_open_files(engine, 16384, hard_limit=need - 1)
    assert "needs ~18,784 open files for 9,216 generations in flight" in str(refused.value)
    assert "ulimit -Hn" in refused.value.fix and "max_concurrent_sessions" in refused.value.fix


def test_the_routers_launcher_checks_the_open_files_limit_on_its_own_node():
    engine = EngineConfig(kind="simulated", num_engines=96, max_batch_size=96)
    cmd = router_command(engine, worker_urls=["http://127.0.0.1:1"], host="127.0.0.1", port=2, prometheus_port=3,
                         api_key_file="/runs/r1/api-key", python="python3", check_installed=False,
                         max_concurrent_sessions=16384)
    assert cmd.argv[:8] == ("python3", "-m", "rl360cli.inference.keyed_launch", "--api-key-file", "/runs/r1/api-key",
                            "--min-open-files", str(router_open_files_needed(engine, 16384)), "--")
    assert router_open_files_needed(engine, 16384) == 2 * 96 * 96 + 96 + 256


def _launch_under_limits(soft: int, hard: int, need: int) -> subprocess.CompletedProcess:
    """keyed_launch with a need of `need` files, started with these limits, running a program that prints its own."""
    def limits():
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

    program = [sys.executable, "-c", "import resource; print(resource.getrlimit(resource.RLIMIT_NOFILE))"]
    return subprocess.run([sys.executable, "-m", "rl360cli.inference.keyed_launch", "--min-open-files", str(need), "--",
                           *program], capture_output=True, text=True, timeout=60, cwd=REPO, preexec_fn=limits)


def test_on_a_node_that_allows_too_few_open_files_the_launch_ends_in_one_line_before_the_program_runs():
    refused = _launch_under_limits(256, 300, need=385)
    assert refused.returncode == 2 and refused.stdout == ""  # the program never ran
    assert refused.stderr.count("\n") == 1
    assert "allows 300 open files and this program needs ~385; raise the node's hard limit (`ulimit -Hn`" \
        in refused.stderr
    ran = _launch_under_limits(256, 300, need=300)
    assert ran.returncode == 0 and ran.stdout.strip() == "(300, 300)"  # the soft limit raised to the hard one


def test_an_operator_changes_a_flag_in_the_template(tmp_path, monkeypatch):
    text = (REPO / "stages" / "sglang-router.toml").read_text().replace('"--log-level" = "warn"',
                                                                       '"--log-level" = "debug"')
    (tmp_path / "sglang-router.toml").write_text(text)
    monkeypatch.setenv("RL360_STAGES_DIR", str(tmp_path))
    cmd = router_command(EngineConfig(), worker_urls=["http://x:1"], host="h", port=1, prometheus_port=2,
                         check_installed=False, python=sys.executable)
    assert cmd.argv[-2:] == ("--log-level", "debug")


def test_template_mistakes_are_one_line_errors(tmp_path, monkeypatch):
    monkeypatch.setenv("RL360_STAGES_DIR", str(tmp_path))
    with pytest.raises(Rl360Error, match="missing"):
        render("nope", {})
    (tmp_path / "bad.toml").write_text('argv = ["{python}"]\n[flags]\n"--x" = "{typo}"\n')
    with pytest.raises(Rl360Error, match=r"unknown placeholder \{typo\}"):
        render("bad", {"python": "p"})


def test_component_specs_for_the_serve_stage():
    engine = EngineConfig(num_engines=2)
    ports = serve_ports(31000, engine.num_engines)
    assert (ports.router, ports.router_metrics, ports.engines) == (31000, 31001, (31002, 31003))
    specs = [engine_spec(engine, index=i, model_path="/m", host="127.0.0.1", port=p, run="r1", python=sys.executable)
             for i, p in enumerate(ports.engines)]
    assert [s.id for s in specs] == ["rollout/engine-0", "rollout/engine-1"]
    assert specs[1].health_url == "http://127.0.0.1:31003/health" and specs[1].ports == {"http": 31003}
    assert "--seed" in specs[1].argv and specs[1].argv[specs[1].argv.index("--seed") + 1] == "1"
    router = router_spec(engine, worker_urls=["http://127.0.0.1:31002", "http://127.0.0.1:31003"],
                         host="127.0.0.1", port=ports.router, prometheus_port=ports.router_metrics, run="r1",
                         python=sys.executable)
    assert router.id == "service/router" and router.health_url == "http://127.0.0.1:31000/readiness"


@pytest.mark.parametrize("field, value", [("router_max_retries", 0), ("router_health_check_interval_s", 0),
                                          ("num_threads", -1), ("weight_sync_timeout_s", 0.0),
                                          ("prefix_cache_mb", -1.0)])
def test_engine_table_rejects_bad_values(field, value):
    with pytest.raises(ValueError, match=field):
        EngineConfig(**{field: value})
