"""`rl360 tasks check` and `rl360 sandboxes launch|list|stop`, run as a user runs them (subprocesses)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rl360cli import procinfo
from tests.sandbox.conftest import EXAMPLE_IDS, EXAMPLES, containers_of, write_task


@pytest.fixture
def env(sandbox_root):
    """Process sandboxes of the CLI under this test's own root (RL360_SANDBOX_ROOT)."""
    return {"RL360_SANDBOX_ROOT": str(sandbox_root)}


@pytest.fixture
def dev_profile(tmp_path, docker_node_specs) -> Path:
    """cluster/dev-docker.toml for the dev nodes actually running (their sockets may live elsewhere)."""
    text = 'name = "dev-docker"\nbackend = "local"\n\n[registry]\naddress = "127.0.0.1:5000"\n'
    for spec in docker_node_specs:
        text += f'\n[[nodes]]\nname = "{spec.name}"\ndocker_host = "{spec.docker_host}"\ncpus = 2.0\nmemory_mb = 4096\n'
    path = tmp_path / "dev-docker.toml"
    path.write_text(text)
    return path


def test_the_shipped_dev_docker_profile_loads():
    from rl360cli.config import load_profile

    profile = load_profile(Path(__file__).resolve().parents[2] / "cluster" / "dev-docker.toml")
    assert [n.name for n in profile.nodes] == ["n1", "n2", "n3"]


def test_tasks_check_passes_the_examples_with_the_process_provider(cli, bwrap, env):
    proc = cli("tasks", "check", str(EXAMPLES), env=env)
    assert proc.returncode == 0, proc.stderr
    for task_id in EXAMPLE_IDS:
        assert task_id in proc.stdout
    assert f"{len(EXAMPLE_IDS)}/{len(EXAMPLE_IDS)} tasks pass" in proc.stdout
    data = json.loads(cli("tasks", "check", str(EXAMPLES / "hello-world"), "--json", env=env).stdout)
    row = data["tasks"][0]
    assert data["passed"] and row["oracle"]["reward"] == 1.0 and row["noop"]["reward"] == 0.0
    assert set(row["oracle"]["timings"]) >= {"start", "agent", "verify", "stop"}


@pytest.mark.docker
def test_tasks_check_passes_the_examples_on_the_dev_docker_nodes(cli, dev_profile, docker_node_specs, env):
    proc = cli("tasks", "check", str(EXAMPLES), "--provider", "docker", "--profile", str(dev_profile), "--json",
               env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads(proc.stdout)
    assert data["passed"] and sorted(r["task"] for r in data["tasks"]) == sorted(EXAMPLE_IDS)
    assert {r["oracle"]["node"] for r in data["tasks"]} <= {spec.name for spec in docker_node_specs}


def test_tasks_check_fails_a_bad_task_set_and_says_why(cli, bwrap, env, tmp_path):
    ok = ("[ -f /app/done ] && echo 1 > /logs/verifier/reward.txt || { echo 'no /app/done'; "
          "echo 0 > /logs/verifier/reward.txt; }\n")
    write_task(tmp_path / "set", "good", test_sh=ok, solve_sh="touch /app/done\n")
    write_task(tmp_path / "set", "wrong-oracle", test_sh=ok, solve_sh="true\n")
    write_task(tmp_path / "set", "always-passes", test_sh="echo 1 > /logs/verifier/reward.txt\n",
               solve_sh="true\n")
    write_task(tmp_path / "set", "no-solution", test_sh=ok)
    proc = cli("tasks", "check", str(tmp_path / "set"), "--json", env=env)
    assert proc.returncode == 1
    rows = {r["task"]: r for r in json.loads(proc.stdout)["tasks"]}
    assert rows["good"]["passed"]
    assert rows["wrong-oracle"]["problems"] == ["oracle reward 0 < 1"]
    assert "no /app/done" in rows["wrong-oracle"]["oracle"]["verifier_output"]  # why, for the one who reads it
    assert rows["always-passes"]["problems"] == ["no-op reward 1 reaches 1: the tests pass without any work"]
    assert rows["no-solution"]["problems"] == ["no solution/solve.sh"]
    table = cli("tasks", "check", str(tmp_path / "set"), "--include", "good", "--include", "wrong-oracle", env=env)
    assert table.returncode == 1 and "oracle reward 0 < 1" in table.stdout and "1/2 tasks pass" in table.stdout


def test_tasks_check_keeps_each_attempts_artifacts_where_asked(cli, bwrap, env, tmp_path):
    # Harbor keeps a trial's artifacts in its folder; `--artifacts DIR` keeps each attempt's below DIR.
    write_task(tmp_path / "set", "report", toml='artifacts = ["/app/report.txt"]\n',
               test_sh="[ -f /app/report.txt ] && echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt\n",
               solve_sh="echo done > /app/report.txt\n")
    kept = tmp_path / "kept"
    proc = cli("tasks", "check", str(tmp_path / "set"), "--artifacts", str(kept), "--json", env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (kept / "report" / "oracle" / "app" / "report.txt").read_text() == "done\n"
    status = {kind: {e["source"]: e["status"] for e in json.loads((kept / "report" / kind / "manifest.json").read_text())}
              for kind in ("oracle", "noop")}
    assert status["oracle"]["/app/report.txt"] == "ok" and status["noop"]["/app/report.txt"] == "failed"


@pytest.mark.parametrize("args, message", [
    (("tasks", "check", "/nonexistent/tasks"), "error: task set /nonexistent/tasks: no such folder"),
    (("tasks", "check", str(EXAMPLES), "--provider", "podman"), "error: --provider 'podman' is not known"),
    (("tasks", "check", str(EXAMPLES), "--provider", "docker"), "lists no Docker nodes"),
    (("sandboxes", "launch", "--count", "0"), "error: --count must be at least 1"),
    (("sandboxes", "launch", "--count", "500", "--cpus", "1"), "do not fit"),
    (("sandboxes", "stop", "nope"), "error: no recorded sandbox nope"),
])
def test_bad_input_is_one_line_naming_the_fix(cli, env, args, message):
    proc = cli(*args, env=env)
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], proc.stderr


def test_a_refused_task_gets_its_own_row_and_the_others_are_checked(cli, bwrap, env, tmp_path):
    ok = "[ -f /app/done ] && echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt\n"
    write_task(tmp_path / "set", "good", test_sh=ok, solve_sh="touch /app/done\n")
    write_task(tmp_path / "set", "windows", toml='[environment]\nos = "windows"\n')
    # One that needs a variable this process lacks (harbor-cookbook's computer-use-windows: DAYTONA_API_KEY).
    write_task(tmp_path / "set", "needs-key", toml='[environment.env]\nKEY = "${RL360_TEST_UNSET_KEY}"\n',
               solve_sh="true\n")
    proc = cli("tasks", "check", str(tmp_path / "set"), "--json", env=env)
    assert proc.returncode == 1
    rows = {r["task"]: r for r in json.loads(proc.stdout)["tasks"]}
    assert rows["good"]["passed"] and rows["good"]["oracle"]["reward"] == 1
    assert not rows["windows"]["passed"] and rows["windows"]["oracle"] is None
    assert rows["windows"]["problems"][0].startswith("refused: task windows: Windows tasks need a Windows node")
    assert rows["needs-key"]["oracle"] is None and rows["needs-key"]["problems"] == [(
        "refused: task needs-key: [environment.env] needs ${RL360_TEST_UNSET_KEY}, which is not set; set "
        "RL360_TEST_UNSET_KEY in the environment rl360 runs in (Harbor reads it from --env-file)")]
    # A set none of whose tasks loads is one line, naming the first refusal.
    only = cli("tasks", "check", str(tmp_path / "set"), "--include", "windows", env=env)
    assert only.returncode == 1 and "windows: Windows tasks need a Windows node" in only.stdout + only.stderr
    one = cli("tasks", "check", str(tmp_path / "set" / "windows"), "--json", env=env)
    assert one.returncode == 1 and json.loads(one.stdout)["tasks"][0]["refused"].startswith("task windows")
    # `good` says nothing of its network: it wants the internet (Harbor's default), and the table says where it
    # stands under the profile's [egress] (printed whole: not read as rich markup).
    plain = cli("tasks", "check", str(tmp_path / "set"), "--include", "good", env=env)
    assert plain.returncode == 0 and 'gives sandboxes none ([egress] mode = "none")' in " ".join(plain.stdout.split())


def test_a_process_fleet_is_launched_listed_stopped_and_recorded(cli, bwrap, env, state_path, sandbox_root):
    plan = cli("sandboxes", "launch", "--count", "3", "--dry-run", env=env)
    assert plan.returncode == 0 and "launch 3 process sandboxes" in plan.stdout
    assert not state_path.exists() or not json.loads(state_path.read_text())["sandboxes"]
    proc = cli("sandboxes", "launch", "--count", "3", "--wave-size", "2", "--interval", "0.1", "--run", "fleet-t",
               "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    launched = json.loads(proc.stdout)
    assert len(launched["started"]) == 3 and launched["summary"]["starts"] == 3
    records = json.loads(state_path.read_text())["sandboxes"]
    assert len(records) == 3
    for rec in records.values():
        assert rec["run"] == "fleet-t" and rec["provider"] == "process" and rec["status"] == "running"
        assert procinfo.is_alive(rec["pid"], rec["pid_start"]) and Path(rec["folder"]).is_dir()
        assert rec["start_latency_s"] >= 0 and rec["node"] == "local"
    listed = json.loads(cli("sandboxes", "list", "--json", env=env).stdout)
    assert {s["status"] for s in listed.values()} == {"running"}
    one = sorted(records)[0]
    assert cli("sandboxes", "stop", one, env=env).returncode == 0
    assert sorted(json.loads(state_path.read_text())["sandboxes"]) == sorted(records)[1:]
    assert not procinfo.is_alive(records[one]["pid"], records[one]["pid_start"])
    # `rl360 down` removes the rest (the janitor), and the state forgets them.
    down = cli("down", "--json", env=env)
    assert down.returncode == 0, down.stderr
    assert json.loads(state_path.read_text())["sandboxes"] == {}
    for rec in records.values():
        assert not procinfo.is_alive(rec["pid"], rec["pid_start"]) and not Path(rec["folder"]).exists()
    assert cli("sandboxes", "list", env=env).stdout.strip() == "no sandboxes"


@pytest.mark.docker
def test_a_docker_fleet_in_waves_on_the_dev_nodes(cli, dev_profile, docker_node_specs, env, state_path):
    proc = cli("sandboxes", "launch", "--count", "6", "--wave-size", "2", "--interval", "0.3", "--provider",
               "docker", "--run", f"fleet-{state_path.parent.parent.name[-8:]}", "--profile", str(dev_profile),
               "--json", env=env, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    launched = json.loads(proc.stdout)
    run_id = launched["run"]
    try:
        assert len(launched["started"]) == 6 and launched["image"] == "127.0.0.1:5000/rl360/busybox:latest"
        assert len(containers_of(run_id, docker_node_specs)) == 6
        listed = json.loads(cli("sandboxes", "list", "--profile", str(dev_profile), "--json", env=env).stdout)
        assert len(listed) == 6 and {s["status"] for s in listed.values()} == {"running"}
        nodes = {spec.name for spec in docker_node_specs}
        assert all(s["container_id"] and s["node"] in nodes for s in listed.values())
    finally:
        stopped = cli("sandboxes", "stop", "--run", run_id, "--profile", str(dev_profile), "--json", env=env)
    assert len(json.loads(stopped.stdout)["stopped"]) == 6
    assert containers_of(run_id, docker_node_specs) == []
    assert json.loads(state_path.read_text())["sandboxes"] == {}
