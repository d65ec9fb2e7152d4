"""The local backend through the real CLI: components as supervised process groups, reconciled with /proc."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rl360cli import procinfo
from rl360cli.backends.base import ComponentSpec
from rl360cli.config import load_profile
from rl360cli.stages.base import Context, start_component
from rl360cli.state.store import StateFile

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def ctx(state_path) -> Context:
    return Context(state=StateFile(state_path), profile=load_profile(REPO / "cluster/local.toml"),
                   profile_path=REPO / "cluster/local.toml", run_id="r1")


def spawn(ctx: Context, name: str, script: str, tier: str = "service") -> dict:
    spec = ComponentSpec(name=name, tier=tier, stage="test", kind="worker", argv=("bash", "-c", script), run="r1")
    return start_component(ctx, spec)


def family_of(rec: dict) -> list[int]:
    return procinfo.family(rec["supervisor_pid"], rec["pgid"])


def test_sigkilled_component_shows_failed_and_down_leaves_no_process(ctx, cli):
    # One component that also leaves a background grandchild behind, one plain one.
    a = spawn(ctx, "a", "sleep 300 & sleep 300")
    b = spawn(ctx, "b", "sleep 300", tier="rollout")
    time.sleep(0.3)
    pids = set(family_of(a)) | set(family_of(b))
    assert len(pids) >= 5  # two supervisors, two bash, the sleeps

    os.kill(a["pid"], signal.SIGKILL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        status = cli("status", "--json")
        comps = json.loads(status.stdout)["components"]
        if comps["service/a"]["status"] == "failed":
            break
        time.sleep(0.2)
    assert status.returncode == 3, status.stderr
    assert comps["service/a"]["status"] == "failed"
    assert comps["service/a"]["exit_code"] == 137
    assert comps["rollout/b"]["status"] == "running"

    down = cli("down", "--grace", "2")
    assert down.returncode == 0, down.stderr
    still = [p for p in pids if procinfo.is_alive(p)]
    assert still == []
    assert json.loads(cli("status", "--json").stdout)["components"] == {}
    assert cli("down").stdout.strip() == "nothing was running"


def test_a_reused_pid_is_not_mistaken_for_the_component(ctx, cli):
    rec = spawn(ctx, "c", "sleep 300")
    with ctx.state.update() as doc:
        # As if the component and its supervisor had ended and their pids now belonged to someone else.
        doc["components"]["service/c"]["start_time"] += 1
        doc["components"]["service/c"]["supervisor_start_time"] += 1
    comps = json.loads(cli("status", "--json").stdout)["components"]
    assert comps["service/c"]["status"] == "failed"
    assert comps["service/c"]["reason"] == "the process vanished without an exit code"
    ctx.backend.stop({"c": rec}, grace_s=1)


def test_clean_exit_is_exited_not_failed(ctx, cli):
    spawn(ctx, "d", "echo bye")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        comps = json.loads(cli("status", "--json").stdout)["components"]
        if comps["service/d"]["status"] == "exited":
            break
        time.sleep(0.2)
    assert comps["service/d"]["status"] == "exited" and comps["service/d"]["exit_code"] == 0


def test_starting_a_running_component_again_duplicates_nothing(ctx):
    first = spawn(ctx, "e", "sleep 300")
    again = spawn(ctx, "e", "sleep 300")
    assert again["pid"] == first["pid"]
    ctx.backend.stop({"e": first}, grace_s=1)


def test_down_ignores_sigterm_then_kills(ctx, cli):
    rec = spawn(ctx, "stubborn", "trap '' TERM; while true; do sleep 0.1; done")
    time.sleep(0.3)
    t0 = time.monotonic()
    assert cli("down", "--grace", "1").returncode == 0
    assert not procinfo.is_alive(rec["pid"])
    assert time.monotonic() - t0 < 30


def test_logs_follow_sees_lines_new_components_and_ends_with_the_run(ctx, state_path):
    with ctx.state.update() as doc:
        doc["runs"]["r1"] = {"status": "running", "run_dir": str(ctx.run_dir), "step": 0, "num_steps": 3}
        doc["current_run"] = "r1"
    spawn(ctx, "early", "echo early-line; sleep 300")
    follower = subprocess.Popen([sys.executable, "-m", "rl360cli", "logs", "--follow"], cwd=REPO,
                                env={**os.environ, "RL360_STATE": str(state_path)}, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    try:
        assert _wait_for_line(follower, "service/early | early-line", 10)
        spawn(ctx, "late", "sleep 0.5; echo late-line; sleep 300", tier="rollout")
        t_written = time.monotonic() + 0.5
        assert _wait_for_line(follower, "rollout/late | late-line", 10)
        assert time.monotonic() - t_written < 1.5  # seen within about a second (0.2 s polls)
        with ctx.state.update() as doc:
            doc["runs"]["r1"].update(status="finished", step=3)
        rest, _ = follower.communicate(timeout=20)
        assert follower.returncode == 0
        assert rest.strip().splitlines()[-1] == "── run r1 finished at step 3/3 ──"
    finally:
        if follower.poll() is None:
            follower.kill()
        ctx.backend.stop({cid: r for cid, r in ctx.state.read()["components"].items()}, grace_s=1)


def test_logs_follow_exits_3_when_the_trainer_dies(ctx, state_path):
    with ctx.state.update() as doc:
        doc["runs"]["r1"] = {"status": "running", "run_dir": str(ctx.run_dir), "step": 1, "num_steps": 3}
        doc["current_run"] = "r1"
    spec = ComponentSpec(name="trainer", tier="training", stage="train", kind="trainer",
                         argv=("bash", "-c", "echo training; sleep 1; exit 7"), run="r1")
    start_component(ctx, spec)
    follower = subprocess.run([sys.executable, "-m", "rl360cli", "logs", "--follow"], cwd=REPO, timeout=30,
                              env={**os.environ, "RL360_STATE": str(state_path)}, capture_output=True, text=True)
    assert follower.returncode == 3
    assert "training/trainer | training" in follower.stdout
    assert "failed" in follower.stdout.splitlines()[-1] and "exit code 7" in follower.stdout.splitlines()[-1]


def _wait_for_line(proc: subprocess.Popen, text: str, timeout: float) -> bool:
    import selectors

    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if sel.select(timeout=0.1):
            line = proc.stdout.readline()
            if text in line:
                return True
            if not line:
                return False
    return False


def test_a_tier_with_a_cpu_list_pins_its_components(state_path, tmp_path):
    profile_path = tmp_path / "pinned.toml"
    profile_path.write_text('name = "pinned"\n[tiers.service]\nshare = 0.2\ncpu_list = [0]\n'
                            '[tiers.training]\nshare = 0.4\n[tiers.rollout]\nshare = 0.4\n')
    ctx = Context(state=StateFile(state_path), profile=load_profile(profile_path), profile_path=profile_path,
                  run_id="r1")
    rec = spawn(ctx, "pinned", "sleep 300")
    try:
        status = Path(f"/proc/{rec['pid']}/status").read_text()
        allowed = next(line.split()[1] for line in status.splitlines() if line.startswith("Cpus_allowed_list"))
        assert allowed == "0"
    finally:
        ctx.backend.stop({"pinned": rec}, grace_s=1)


def test_a_component_may_open_as_many_files_as_the_hard_limit_allows(ctx):
    # A shell's soft limit is often 1,024 below a far higher hard one; a router at 8,192 sessions
    # needs ~16,000. The supervisor lifts the component's soft limit to the hard one.
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
    try:
        rec = spawn(ctx, "files", "sleep 300")
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    try:
        limits = Path(f"/proc/{rec['pid']}/limits").read_text()
        line = next(line for line in limits.splitlines() if line.startswith("Max open files"))
        got_soft, got_hard = line.split()[3:5]
        assert got_soft == got_hard == ("unlimited" if hard == resource.RLIM_INFINITY else str(hard))
    finally:
        ctx.backend.stop({"files": rec}, grace_s=1)


def test_serve_refuses_a_run_the_router_has_too_few_file_descriptors_for(state_path, tmp_path):
    # local-smoke keeps up to 64 generations in flight: 2 x 64 + 1 engine + 256 spares = 385 needed.
    def low_limit():
        import resource

        resource.setrlimit(resource.RLIMIT_NOFILE, (300, 300))

    env = {**os.environ, "RL360_STATE": str(state_path), "COLUMNS": "400"}
    serve = [sys.executable, "-m", "rl360cli", "serve", "--recipe", str(REPO / "recipes/local-smoke.toml")]
    proc = subprocess.run(serve, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
                          preexec_fn=low_limit)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    error = [line for line in (proc.stdout + proc.stderr).splitlines() if line.startswith("error:")]
    assert error == ["error: the router needs ~385 open files for 64 generations in flight and this machine allows "
                     "300; raise the hard limit (`ulimit -Hn`, /etc/security/limits.conf), or lower [rollout] "
                     "max_concurrent_sessions or [engine] max_batch_size"]
    doc = json.loads(state_path.read_text())  # still a valid state file, and nothing was started
    assert doc["components"] == {}


def test_procinfo_counts_the_cpu_a_process_has_run():
    child = subprocess.Popen([sys.executable, "-c", "import time\nend = time.process_time() + 0.3\n"
                              "while time.process_time() < end: pass\ninput()"], stdin=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while (procinfo.stat(child.pid).cpu_ticks / os.sysconf("SC_CLK_TCK")) < 0.3:
            assert time.monotonic() < deadline, "the busy child's CPU ticks never reached 0.3 s"
            time.sleep(0.05)
        assert procinfo.stat(child.pid).cpu_ticks < 60 * os.sysconf("SC_CLK_TCK")
    finally:
        child.kill()
        child.wait()
