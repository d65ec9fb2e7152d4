"""Faults together in one real run on the local backend (real engine processes behind the real
sglang-router, Ray session actors, the gloo weight broadcast): sandbox failures injected at 25% from the
start, then one engine killed by its pid, then one of the two session actors (as when its node is
lost), then the router.

Every injected failure is masked with its cause, never a reward of 0. The trainer's health watcher
(rl360cli/run/control.py) starts the engine again from its record, takes it back into the
weight-update group at the trainer's version and registers it with the router again; the attempts it was
serving end as `engine_error` infra failures (masked); the run ends with every engine on the trainer's
version, and `rl360 status` says so, with the restart counted. How long the engine took to be back is
printed (and kept in docs/reliability.md), not asserted. (`[engine] max_restarts = 0`, an engine that
stays failed, is tests/inference/test_health.py's.) Ray starts the session actor again
(`[rollout] actor_max_restarts`); the groups it held come back masked (`unknown`: its process died on a node that
lives), never run again, and the next step waits for it.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
import urllib.request
from pathlib import Path

import pytest

from rl360cli import procinfo
from rl360cli.inference.apikey import optional_api_key
from tests.conftest import run_cli
from tests.loop.conftest import LOCAL_SMOKE_V0, metrics_of, write_run_files

pytestmark = pytest.mark.slow

RECIPE = """
[model]
# local-smoke's policy v0: it earns rewards, so steps train.
kind = "huggingface"
path = "{policy}"
[rollout]
num_session_actors = 2
max_turns = 4
max_new_tokens = 48
max_total_tokens = 512
[trainer]
# local-smoke's warm-up: few samples a step survive the injected failures, and a fresh Adam at full lr on
# them took the policy to a reward of 0 by step 3 (then the spinning guard ends the run).
lr_warmup_steps = 4
[loop]
num_steps = 8
num_tasks_per_step = 6
num_samples_per_task = 4
[engine]
num_engines = 2
num_threads = 1
"""


def wait_until_running_a_request(engine_url: str, api_key: str, timeout_s: float = 120.0) -> None:
    """Poll the engine's load (the route sglang-router probes) until it has a request running or waiting."""
    request = urllib.request.Request(engine_url.rstrip("/") + "/get_load",
                                     headers={"Authorization": f"Bearer {api_key}"})
    deadline = time.monotonic() + timeout_s
    while True:
        with urllib.request.urlopen(request, timeout=5) as reply:
            if json.load(reply)[0]["num_reqs"] > 0:
                return
        assert time.monotonic() < deadline, f"{engine_url} ran no request for {timeout_s:g}s"
        time.sleep(0.02)


def session_actor_pids(driver_pid: int) -> list[int]:
    """The run's Ray session actor processes: below its driver, titled by Ray after their class."""
    pids = []
    for pid in procinfo.family(driver_pid):
        try:
            if Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"ray::SessionActor"):
                pids.append(pid)
        except OSError:
            continue
    return pids


def current_run(state_path) -> tuple[dict, dict]:
    doc = json.loads(state_path.read_text())
    return doc, doc["runs"][doc["current_run"]]


def test_injected_failures_are_masked_and_a_killed_engine_is_back_at_the_trainers_version(run_folder, state_path):
    recipe = write_run_files(run_folder, recipe_body=RECIPE.format(policy=LOCAL_SMOKE_V0))  # on a random free port block
    up = run_cli("up", "--recipe", str(recipe), "--detach", "--inject-failures", "0.25", state=state_path,
                 cwd=run_folder, timeout=600)
    assert up.returncode == 0, up.stdout + up.stderr
    deadline = time.monotonic() + 600
    while True:
        doc, run = current_run(state_path)
        if run.get("policy_version", 0) >= 1:  # a step has trained: the engines serve more than v0
            break
        assert run["status"] in ("starting", "running"), run
        assert time.monotonic() < deadline, "the run did not reach step 1"
        time.sleep(0.2)
    victim = doc["components"]["rollout/engine-1"]
    # Killed while it runs a request, which the kill then cuts: in a synchronous step the engines sit idle
    # while the trainer updates, and a kill then costs no attempt at all (seen once in CI).
    wait_until_running_a_request(victim["url"], optional_api_key(Path(run["run_dir"])))
    doc, run = current_run(state_path)
    os.kill(victim["pid"], signal.SIGKILL)
    killed_at, killed_at_step, version_then = time.monotonic(), run["step"], run["policy_version"]

    # Back: a new process under the same record, at the version the trainer had then or later.
    while True:
        doc, run = current_run(state_path)
        rec = doc["components"]["rollout/engine-1"]
        if rec.get("restarts") and rec["status"] == "running" and rec.get("served_version") is not None:
            break
        assert run["status"] in ("starting", "running"), (run, rec)
        assert time.monotonic() < killed_at + 300, f"engine-1 did not come back: {rec}"
        time.sleep(0.1)
    print(f"\nengine-1 back at policy version {rec['served_version']} {time.monotonic() - killed_at:.1f}s "
          f"after its kill (trainer at version {run['policy_version']})")
    assert rec["pid"] != victim["pid"] and rec["restarts"] == 1
    assert rec["served_version"] >= version_then

    # Then one of the two session actors (as when its node is lost): Ray starts it again, and the
    # groups it held come back masked.
    driver_log = Path(run["run_dir"]) / "logs" / "training.trainer.log"
    actor_pids = session_actor_pids(doc["components"]["training/trainer"]["pid"])
    assert len(actor_pids) == 2, actor_pids
    os.kill(actor_pids[0], signal.SIGKILL)
    actor_killed_at = time.monotonic()
    while not re.search(r"session actor \d started again", driver_log.read_text()):
        doc, run = current_run(state_path)
        assert run["status"] in ("starting", "running"), run
        assert time.monotonic() < actor_killed_at + 120, "the session actor was not started again"
        time.sleep(0.2)
    print(f"session actor started again {time.monotonic() - actor_killed_at:.1f}s after its kill "
          f"(at step {run['step']})")

    # Then the router: it comes back with both engines, and the run goes on through it.
    doc, run = current_run(state_path)
    router = doc["components"]["service/router"]
    os.kill(router["pid"], signal.SIGKILL)
    router_killed_at = time.monotonic()
    while True:
        doc, run = current_run(state_path)
        back = doc["components"]["service/router"]
        if back.get("restarts") and back["status"] == "running":
            break
        assert run["status"] in ("starting", "running"), (run, back)
        assert time.monotonic() < router_killed_at + 300, f"the router did not come back: {back}"
        time.sleep(0.1)
    print(f"router back {time.monotonic() - router_killed_at:.1f}s after its kill")
    assert back["pid"] != router["pid"] and back["url"] == router["url"]

    follow = run_cli("logs", "--follow", state=state_path, cwd=run_folder, timeout=600)
    assert follow.returncode == 0, follow.stdout[-3000:]
    status = json.loads(run_cli("status", "--json", state=state_path, cwd=run_folder).stdout)
    run = status["runs"][status["current_run"]]
    assert run["status"] == "finished" and run["step"] == 8
    assert len(re.findall(r"session actor \d started again", driver_log.read_text())) == 1
    assert session_actor_pids(status["components"]["training/trainer"]["pid"]) == []  # all ended with the run
    # Every engine ends on the trainer's version: the restarted one too; status asks them and says so.
    assert run["engine_versions"] == {e["url"]: run["policy_version"] for cid, e in status["components"].items()
                                      if cid.startswith("rollout/engine-")}
    assert status["engine_versions"] == {"rollout/engine-0": run["policy_version"],
                                         "rollout/engine-1": run["policy_version"]}
    assert status["components"]["rollout/engine-1"]["status"] == "running"
    assert status["components"]["rollout/engine-1"]["restarts"] == 1
    assert status["components"]["service/router"]["restarts"] == 1
    text = run_cli("status", state=state_path, cwd=run_folder).stdout
    assert f"serves v{run['policy_version']}, 1 restart" in text

    rows = metrics_of(state_path)
    assert len(rows) == 8
    for row in rows:
        batch = row["batch"]
        # Every injected failure is masked with its cause, and every sample is in exactly one bucket.
        assert batch.get("masked/injected", 0) == row["injected_failures"]
        assert row["infra_failures_by_cause"].get("injected", 0) == row["injected_failures"]
        assert batch["total"] == row["samples"]
        assert batch["kept"] + batch["masked"] + batch["filtered_zero_std"] + batch["dropped_stale"] \
            + batch["dropped_too_few_valid"] == batch["total"]
        assert batch["masked"] == sum(row["infra_failures_by_cause"].values())
    # 8 steps x 24 samples at 25% (starts and execs both draw): some were injected.
    assert sum(row["injected_failures"] for row in rows) > 0
    # What the kills cost: only engine_error infra failures besides the injected ones (a request the
    # router restart cut is sent again once; one that finds no router in time is one of them), and the
    # sessions the killed actor held (`unknown`: its process died, its node lives), every one masked, none
    # trained on.
    assert {cause for row in rows[:killed_at_step - 1] for cause in row["infra_failures_by_cause"]} <= {"injected"}
    after = rows[killed_at_step - 1:]
    assert {cause for row in after for cause in row["infra_failures_by_cause"]} <= {"engine_error", "injected",
                                                                                    "unknown"}
    assert sum(row["infra_failures_by_cause"].get("engine_error", 0) for row in after) >= 1
    for row in after:
        assert row["batch"].get("masked/engine_error", 0) == row["infra_failures_by_cause"].get("engine_error", 0)

    families = [procinfo.family(rec["supervisor_pid"], rec["pgid"]) for rec in status["components"].values()
                if rec.get("supervisor_pid")]
    assert run_cli("down", state=state_path, cwd=run_folder).returncode == 0
    leftovers = [pid for family in families for pid in family if procinfo.is_alive(pid)]
    assert leftovers == []
