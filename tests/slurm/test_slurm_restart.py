"""On the real dev Slurm, what the run's control plane starts again outlives the trainer's step.

A job step ends with the step whose `srun` launched it. The control plane (rl360cli/run/control.py) is a
component of its own on the service tier, so a router it restarts is a step launched from there and runs on
after the trainer's step has ended; restarted from inside the trainer (as the health watcher used to do),
Slurm cancelled it with the trainer ("job step CANCELLED"), and `rl360 status` showed it failed.

The router here is a stand-in (tests/inference/health_standins.py: answers /health and an empty /workers,
routes nothing); the trainer is a step that sleeps and ends; the control plane and Slurm are the real ones.
"""

from __future__ import annotations

import os
import signal
import sys
import time

import pytest

from rl360cli.backends.base import ComponentSpec
from rl360cli.config import load_recipe
from rl360cli.inference.health import probe
from rl360cli.ports import free_port
from rl360cli.stages.base import Context, resolve_profile
from rl360cli.stages.lifecycle import start_run
from rl360cli.state import transitions
from rl360cli.state.store import StateFile
from tests.conftest import REPO
from tests.slurm.conftest import sacct_step_state, slurm_out, start_spec, write_profile

pytestmark = pytest.mark.slurm

SMALL = {"service": {"num_nodes": 1, "cpus_per_node": 1}, "training": {"num_nodes": 1, "cpus_per_node": 1},
         "rollout": {"num_nodes": 1, "cpus_per_node": 1}}
TRAINER_S = 25


def wait_for(condition, what: str, timeout_s: float = 90.0):
    deadline = time.monotonic() + timeout_s
    while not (found := condition()):
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s:g}s"
        time.sleep(0.3)
    return found


def test_a_router_the_control_plane_restarted_runs_on_after_the_trainers_step_ended(rl360, tmp_path):
    profile = write_profile(tmp_path, "dev-restart", slurm={"exclusive": False, "poll_interval_s": 1.0}, tiers=SMALL)
    assert rl360("provision", "--profile", str(profile)).returncode == 0
    state = StateFile(rl360.state)
    recipe_path = REPO / "recipes" / "local-smoke.toml"
    found_profile, found_path = resolve_profile(state.read(), None, None)
    ctx = Context(state=state, profile=found_profile, profile_path=found_path, recipe=load_recipe(recipe_path),
                  recipe_path=recipe_path)
    run = start_run(ctx)
    transitions.mark_run_running(state, run, pid=os.getpid())
    env = {"PYTHONPATH": str(REPO)}
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    router = start_spec(rl360.state, ComponentSpec(
        name="router", tier="service", stage="serve", kind="router", run=run, env=env, ports={"http": port},
        argv=(sys.executable, "-m", "tests.inference.health_standins", "--port", str(port)), url=url,
        health_url=url + "/health"))
    start_spec(rl360.state, ComponentSpec(
        name="control", tier="service", stage="serve", kind="control", run=run, env=env,
        argv=(sys.executable, "-m", "rl360cli.run.control", "--state", str(rl360.state), "--run", run)))
    trainer = start_spec(rl360.state, ComponentSpec(
        name="trainer", tier="training", stage="train", kind="trainer", run=run,
        argv=("bash", "-c", f"sleep {TRAINER_S}")))
    control_log = ctx.run_dir / "logs" / "service.control.log"
    wait_for(lambda: control_log.exists() and "watching run" in control_log.read_text(), "the control plane started")

    os.kill(router["pid"], signal.SIGKILL)
    back = wait_for(lambda: (r := rl360.doc()["components"]["service/router"]).get("restarts") == 1
                    and r["status"] == "running" and r, "the router restarted")
    assert back["step_key"] != router["step_key"] and back["url"] == url
    assert "SIGKILL" in back["restart_reason"]

    # The trainer's step ends (the run's end); the restarted router's step is not its child, and runs on.
    report = rl360.wait_status(lambda r: r["components"]["training/trainer"]["status"] == "exited",
                               timeout_s=TRAINER_S + 60)
    assert sacct_step_state(trainer["step_key"]) == "COMPLETED"
    time.sleep(3)  # what Slurm would end with the trainer's step would be ending now
    report = rl360.status()
    assert report["runs"][run]["status"] == "finished"
    assert report["components"]["service/router"]["status"] == "running", report["components"]["service/router"]
    assert probe(url + "/health", timeout_s=2) is None
    job_id = back["step_key"].split(".")[0]
    steps = slurm_out("sacct", "-n", "-P", "-o", "JobIDRaw,State", "-j", job_id)
    assert f"{back['step_key']}|RUNNING" in steps.splitlines(), steps
    assert rl360("status").returncode == 0
