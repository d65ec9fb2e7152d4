"""No open doors: the run's API key (made once, mode 0600, never printed), required by the real engine process,
and launch commands that bind a node's own address, never 0.0.0.0."""

from __future__ import annotations

import dataclasses
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from rl360cli.config import load_profile, load_recipe
from rl360cli.errors import Rl360Error
from rl360cli.inference.apikey import KEY_PLACEHOLDER, create_api_key, read_api_key
from rl360cli.inference.config import EngineConfig
from rl360cli.inference.keyed_launch import NODE_ADDRESS, fill
from rl360cli.inference.launch import engine_command
from rl360cli.stages import serve
from rl360cli.stages.base import Context
from rl360cli.state.store import StateFile

from .conftest import EngineProcess, free_port, wait_http_ok

REPO = Path(__file__).resolve().parents[2]


def test_the_key_file_is_made_once_and_only_its_user_can_read_it(tmp_path):
    path = create_api_key(tmp_path / "run")
    key = read_api_key(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and len(key) >= 40
    assert create_api_key(tmp_path / "run") == path and read_api_key(path) == key  # serve again: same key
    path.chmod(0o644)
    with pytest.raises(Rl360Error, match="readable by others") as info:
        read_api_key(path)
    assert info.value.fix == f"run: chmod 600 {path}" and key not in str(info.value)
    with pytest.raises(Rl360Error, match="rl360 serve"):
        read_api_key(tmp_path / "nope")


def test_keyed_launch_fills_in_the_key_and_the_node_address_on_the_node(tmp_path, monkeypatch):
    path = create_api_key(tmp_path)
    key = read_api_key(path)
    monkeypatch.setenv("RL360_NODE_ADDRESS", "10.9.8.7")
    assert fill(["x", "--host", NODE_ADDRESS, "--api-key", KEY_PLACEHOLDER], api_key_file=str(path)) == [
        "x", "--host", "10.9.8.7", f"--api-key={key}"]
    # A real exec: the program gets the values, and its exit code is the launcher's.
    proc = subprocess.run([sys.executable, "-m", "rl360cli.inference.keyed_launch", "--api-key-file", str(path), "--",
                           sys.executable, "-c", "import sys; print(sys.argv[1:]); sys.exit(7)",
                           "--api-key", KEY_PLACEHOLDER, "--host", NODE_ADDRESS],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 7 and proc.stdout.strip() == str([f"--api-key={key}", "--host", "10.9.8.7"])
    missing = subprocess.run([sys.executable, "-m", "rl360cli.inference.keyed_launch", "--api-key-file",
                              str(tmp_path / "gone"), "--", "true", KEY_PLACEHOLDER],
                             capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2 and "API key file" in missing.stderr and len(missing.stderr.splitlines()) == 1


def test_a_key_that_starts_with_a_dash_reaches_an_argparse_program_as_the_options_value(tmp_path):
    # One URL-safe key in 64 starts with "-": given as `--api-key KEY`, argparse (sglang-router's launcher)
    # took it for an option and the router never started (a local-smoke run failed so, 2026-12-02).
    path = tmp_path / "api-key"
    path.write_text("-Zk3" + "a" * 40 + "\n")
    path.chmod(0o600)
    program = ("import argparse; p = argparse.ArgumentParser(); p.add_argument('--api-key', required=True); "
               "print(p.parse_args().api_key)")
    proc = subprocess.run([sys.executable, "-m", "rl360cli.inference.keyed_launch", "--api-key-file", str(path), "--",
                           sys.executable, "-c", program, "--api-key", KEY_PLACEHOLDER],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "-Zk3" + "a" * 40


def _status(url: str, method: str, path: str, key: str | None, body: dict | None = None) -> int:
    import urllib.error
    import urllib.request

    data = json.dumps(body).encode() if body is not None else (b"{}" if method == "POST" else None)
    request = urllib.request.Request(url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json",
                                              **({"Authorization": f"Bearer {key}"} if key else {})})
    try:
        with urllib.request.urlopen(request, timeout=60) as reply:
            return reply.status
    except urllib.error.HTTPError as e:
        return e.code


# Control and weight-update requests: each must be refused without the key.
GUARDED = [
    ("POST", "/generate", {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 1}}),
    ("POST", "/update_weights_from_disk", {"model_path": "/etc"}),
    ("POST", "/init_weights_update_group", {"master_address": "127.0.0.1", "master_port": 1, "rank_offset": 1,
                                            "world_size": 2, "backend": "gloo"}),
    ("POST", "/update_weights_from_distributed", {"names": [], "dtypes": [], "shapes": []}),
    ("POST", "/pause_generation", {"mode": "abort"}),
    ("POST", "/continue_generation", {}),
    ("POST", "/flush_cache", None),
    ("POST", "/abort_request", {"abort_all": True}),
    ("POST", "/update_weight_version", {"new_version": "9"}),
    ("GET", "/model_info", None),
    ("GET", "/server_info", None),
]


def test_the_real_engine_refuses_requests_without_the_key_and_never_holds_it_in_argv_env_or_log(tiny_model,
                                                                                                 tmp_path):
    key_file = create_api_key(tmp_path / "run")
    key = read_api_key(key_file)
    port = free_port()
    # The command exactly as `rl360 serve` renders it.
    cmd = engine_command(EngineConfig(num_threads=1), model_path=str(tiny_model), host="127.0.0.1", port=port,
                         api_key_file=str(key_file), python=sys.executable)
    log = tmp_path / "engine.log"
    proc = subprocess.Popen(list(cmd.argv), stdout=open(log, "wb"), stderr=subprocess.STDOUT,
                            env={**os.environ, **cmd.env, "RL360_ENGINE_API_KEY": ""})
    engine = EngineProcess(proc=proc, port=port, log=log)
    try:
        wait_http_ok(engine.url + "/health", proc, log)
        url = engine.url
        refused = {path: _status(url, method, path, None, body) for method, path, body in GUARDED}
        assert refused == {path: 401 for _, path, _ in GUARDED}
        assert {_status(url, m, p, "wrong-key", b) for m, p, b in GUARDED} == {401}
        assert _status(url, "GET", "/health", None) == 200 and _status(url, "GET", "/health_generate", None) == 200
        # With the key: accepted (the weight update from /etc is refused for what it is, a 400, not for auth).
        assert _status(url, "POST", "/generate", key, GUARDED[0][2]) == 200
        assert _status(url, "POST", "/pause_generation", key, {"mode": "abort"}) == 200
        assert _status(url, "POST", "/continue_generation", key, {}) == 200
        assert _status(url, "GET", "/model_info", key) == 200
        assert _status(url, "POST", "/update_weights_from_disk", key, {"model_path": "/etc"}) == 400
        for name in ("cmdline", "environ"):
            assert key.encode() not in Path(f"/proc/{proc.pid}/{name}").read_bytes()
    finally:
        engine.stop()
    assert key not in log.read_text()


def _context(tmp_path: Path, profile: str, recipe: str, run_id: str) -> Context:
    return Context(state=StateFile(tmp_path / "state.json"), profile=load_profile(REPO / profile),
                   profile_path=REPO / profile, recipe=load_recipe(REPO / recipe), run_id=run_id)


@pytest.mark.parametrize("profile, recipe", [("cluster/reference-33-nodes.toml", "recipes/coding-32.toml"),
                                             ("cluster/local.toml", "recipes/local-smoke.toml")])
def test_plans_and_recorded_commands_name_the_key_file_never_the_key(tmp_path, profile, recipe):
    ctx = _context(tmp_path, profile, recipe, "r1")
    if ctx.profile.run_root:
        ctx.profile = dataclasses.replace(ctx.profile, run_root=str(tmp_path / "runs"))
    key = read_api_key(create_api_key(ctx.run_dir))  # as `rl360 serve` leaves it
    actions = serve.plan(ctx)
    specs = serve.component_specs(ctx)
    shown = json.dumps([[a.detail, list(a.command)] for a in actions])
    recorded = json.dumps([[list(s.argv), s.env, s.url, s.health_url] for s in specs])
    assert key not in shown and key not in recorded
    assert "0.0.0.0" not in shown and "0.0.0.0" not in recorded
    engines = [s for s in specs if s.kind.startswith("engine")]
    router = next(s for s in specs if s.kind == "router")
    for spec in engines:
        argv = list(spec.argv)
        if spec.kind == "engine-sglang":
            assert argv[argv.index("--api-key") + 1] == KEY_PLACEHOLDER
            assert argv[argv.index("--host") + 1] == NODE_ADDRESS
        else:
            assert argv[argv.index("--api-key-file") + 1] == str(ctx.run_dir / "api-key")
    assert list(router.argv)[list(router.argv).index("--api-key") + 1] == KEY_PLACEHOLDER


def test_the_reference_plan_through_the_cli_has_no_open_door(cli):
    proc = cli("plan", "--recipe", str(REPO / "recipes/coding-32.toml"), "--profile",
               str(REPO / "cluster/reference-33-nodes.toml"), "--json")
    assert proc.returncode == 0, proc.stderr
    # The servers (the control plane beside them serves nothing).
    starts = [a for a in json.loads(proc.stdout)["actions"]
              if a["stage"] == "serve" and a["verb"] == "start" and a["subject"] != "service/control"]
    assert len(starts) == 97  # 96 engines and the router
    for action in starts:
        argv = action["command"]
        assert argv[argv.index("--host") + 1] == NODE_ADDRESS
        assert argv[argv.index("--api-key") + 1] == KEY_PLACEHOLDER
    assert "0.0.0.0" not in proc.stdout


def test_on_provisioned_slurm_tiers_each_server_is_reached_and_started_on_its_node(tmp_path):
    ctx = _context(tmp_path, "cluster/reference-33-nodes.toml", "recipes/coding-32.toml", "r1")
    ctx.profile = dataclasses.replace(ctx.profile, run_root=str(tmp_path / "runs"))
    with ctx.state.update() as doc:
        for tier, nodes in (("rollout", [f"gpu-r{i}" for i in range(24)]), ("service", ["cpu-s0"])):
            doc["tiers"][tier] = {"kind": tier, "backend": "slurm", "status": "ready", "nodes": nodes,
                                  "resources": {}}
    specs = {s.name: s for s in serve.component_specs(ctx)}
    # Four engines per node at TP=2 on 8 GPUs: engine 5 is the second of node 1.
    assert (specs["engine-5"].node, specs["engine-5"].url) == ("gpu-r1", "http://gpu-r1:31007")
    assert specs["engine-5"].health_url == "http://gpu-r1:31007/health"
    assert (specs["router"].node, specs["router"].url) == ("cpu-s0", "http://cpu-s0:31000")
    argv = list(specs["router"].argv)
    assert argv[argv.index("--worker-urls") + 6] == "http://gpu-r1:31007"
    assert argv[argv.index("--host") + 1] == NODE_ADDRESS
