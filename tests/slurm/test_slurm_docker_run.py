"""The reference deployment's layout on the dev cluster, and its recovery from a lost node, in one run: tiers on
Slurm, the session actors on the rollout node, every sandbox on the dockerd of its own actor's node (dev Slurm
node nX has dev dockerd nX), the node's egress proxy holding its sandboxes under `[egress] mode = "allow"`. The
rollout node is killed mid-run: the sessions its actors held are masked `node_lost`, the tier is requeued on the
spare node (its actors, its egress proxy and its engine with it, the node prewarmed first), the loop waits for it
to serve again before it sends new groups, the steps after it train there; after `rl360 down`, nothing of the
run is left on any daemon, the lost node's included once it is back, nor what no actor removed (a step on each
rollout node cleans it). One run for what were two tests (2026-12-07: the suite's slow part is its critical path).

    python -m pytest tests/slurm/test_slurm_docker_run.py     # slow: ~60-80 s (3 steps and a requeue)
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections import Counter
from datetime import datetime
from pathlib import Path

import pytest

from rl360cli.egress.standin import InternetStandIn
from tests.conftest import DEV_ROOT, REPO, need, run_cli
from tests.slurm.conftest import dev_slurm
from tests.slurm.test_slurm_node_loss import wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.docker, pytest.mark.slow]

NODES = ("n1", "n2", "n3", "n4")  # cluster/dev/slurm.sh's
PROFILE = REPO / "cluster" / "dev-slurm-docker.toml"
RECIPE = REPO / "recipes" / "slurm-docker-smoke.toml"
# Every verifier first fetches a file from an allowed host, through its node's egress proxy.
FILE = os.urandom(2048)
FETCH = ("python3 -c \"import urllib.request; urllib.request.urlopen('{url}', timeout=20).read()\" "
         "|| echo 'fetch failed' >&2\n")


def tasks_that_fetch(folder: Path, url: str) -> Path:
    """The arith tasks, each let onto the network for one allowed host, whose verifier fetches `url` first."""
    shutil.copytree(REPO / "recipes" / "tasks" / "arith-32", folder)
    for task in folder.iterdir():
        toml = task / "task.toml"
        toml.write_text(toml.read_text().replace('network_mode = "no-network"', 'network_mode = "allowlist"\n'
                                                 'allowed_hosts = ["files.example.test"]'))
        test = task / "tests" / "test.sh"
        test.write_text(re.sub(r"(?m)^exec python3", lambda m: FETCH.format(url=url) + m.group(0), test.read_text(),
                               count=1))
    return folder


def socket_of(node: str) -> str:
    return f"unix://{DEV_ROOT}/docker/{node}/docker.sock"


def dev_profile(folder: Path, *, egress_host: str) -> Path:
    """cluster/dev-slurm-docker.toml with one rollout node (room for the recipe's 4 sandboxes at once), so that the
    spare fourth node can take its place, and `[egress] mode = "allow"` for `egress_host` alone."""
    profile = folder / "dev-slurm-docker.toml"
    profile.write_text(PROFILE.read_text().replace("/tmp/rl360-dev/", f"{DEV_ROOT}/")
                       .replace('"../images/images.toml"', json.dumps(str(REPO / "images" / "images.toml")))
                       .replace("[tiers.rollout]\nnum_nodes = 2", "[tiers.rollout]\nnum_nodes = 1")
                       .replace("cpus = 2.0\nmemory_mb = 4096", "cpus = 4.0\nmemory_mb = 8192")
                       + f'\n[egress]\nmode = "allow"\nallow = ["{egress_host}"]\n'
                       f'[egress.hosts]\n"{egress_host}" = "127.0.0.1"\n')
    return profile


def test_a_rollout_node_lost_mid_run_is_replaced_and_every_daemon_is_left_clean(slurm, docker_nodes, state_path,
                                                                                tmp_path):
    """One run, the layout and its recovery. `slurm.sh kill-node` on the rollout node once the run's first sandbox
    runs there: its session actors die with it and the groups they held come back masked `node_lost` (never run
    again, never trained); the tier is requeued on the spare node, Ray starts the actors again there, its egress
    proxy starts there too, and the loop sends no new group before the tier serves again (its engine back in the
    router), so the steps after the requeue train; the run finishes. Throughout, every sandbox ran on the daemon
    of its own session actor's node (the daemons' own account), and every verifier fetched its file through that
    node's egress proxy. The node that took the lost one's place was prewarmed (its cache recorded) before its
    actors took a session. Once the lost node is back, `rl360 down` removes what the dead actors' sandboxes left
    on its daemon, and what a dead actor would leave on any node (a container, a network, a volume)."""
    need(os.geteuid() == 0, "the egress proxy enters sandboxes' network namespaces: run as root")
    docker = docker_nodes["docker_cli"]
    missing = [n for n in NODES if subprocess.run([docker, "-H", socket_of(n), "version"], capture_output=True,
                                                  timeout=30).returncode != 0]
    need(not missing, f"dev dockerd of {', '.join(missing)} not answering (every Slurm node needs its own: "
                      "bash cluster/dev/docker-nodes.sh up 4)")
    outside = InternetStandIn({"/f": FILE}).__enter__()
    tasks = tasks_that_fetch(tmp_path / "tasks", outside.url("/f", "files.example.test"))
    profile = dev_profile(tmp_path, egress_host="files.example.test")
    # Every container each daemon creates from now on, with its labels and when (nanoseconds): the daemons' own
    # account of where each sandbox ran (their event buffers keep too few events to read afterwards).
    watchers = {n: subprocess.Popen([docker, "-H", socket_of(n), "events", "--filter", "event=create", "--filter",
                                     "type=container", "--filter", "label=rl360.run", "--format", "{{json .}}"],
                                    stdout=subprocess.PIPE, text=True)
                for n in NODES}
    up = subprocess.Popen([sys.executable, "-m", "rl360cli", "up", "--recipe", str(RECIPE), "--profile",
                           str(profile), "--set", "loop.num_steps=3", "--set", f"tasks.path={tasks}"], cwd=tmp_path,
                          text=True, env={**os.environ, "RL360_STATE": str(state_path), "COLUMNS": "200"},
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT)

    def first_sandbox() -> str | None:
        assert up.poll() is None, up.stdout.read()[-3000:]
        doc = json.loads(state_path.read_text()) if state_path.exists() else {}
        node = ((doc.get("tiers") or {}).get("rollout") or {}).get("nodes", [None])[0]
        run_id = next(iter(doc.get("runs") or {}), None)
        return node if node and run_id and ps(docker, node, run_id) else None

    victim = revived = None
    try:
        victim = wait_for(first_sandbox, 300, "the run's first sandbox")
        dev_slurm("kill-node", victim)
        out, _ = up.communicate(timeout=600)
        assert up.returncode == 0, out[-4000:]
        doc = json.loads(state_path.read_text())
        run_id, run = next(iter(doc["runs"].items()))
        assert (run["status"], run["step"]) == ("finished", 3)
        tier = doc["tiers"]["rollout"]
        assert tier["requeues"] == 1 and tier["lost_nodes"] == [victim] and tier["nodes"] != [victim], tier
        new_node = tier["nodes"][0]
        left = ps(docker, victim, run_id)
        assert left, "the dead actors' sandboxes are still on the lost node's daemon"
        # The node's egress proxy moved with the tier.
        assert {rec["node"] for rec in doc["components"].values() if rec["kind"] == "egress"} == {new_node}

        run_dir = Path(run["run_dir"])
        samples = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
        verified = [json.loads(line) for line in (run_dir / "trajectories.jsonl").read_text().splitlines()]
        rows = samples + verified
        assert rows and all(r["sandbox_node"] == r["actor_node"] in (victim, new_node) for r in rows)
        assert {r["actor_node"] for r in rows} >= {new_node}
        ledger = [json.loads(line) for line in (run_dir / "ledger.jsonl").read_text().splitlines()]
        trained = [s for step in ledger for s in step["samples"]]
        assert len(ledger) == 3 and len(trained) == len(set(trained))
        # The sessions the dead actors held: masked node_lost, each naming the lost node as its actor's, counted
        # by cause in its step's row. A session that met the tier's engine dead first (it ran on the lost node
        # too) is masked engine_error. Nothing else is masked, and no masked sample is trained.
        masked = [set(step["masked"].values()) for step in ledger]
        assert set().union(*masked) <= {"engine_error", "node_lost"}, (masked, out[-3000:])
        lost = [r for r in samples if r["cause"] == "node_lost"]
        assert lost and {r["actor_node"] for r in lost} == {victim}, (masked, out[-3000:])
        assert not {f"{r['group']}-{r['sample']}" for r in lost} & set(trained)
        steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        assert sum(row["infra_failures_by_cause"].get("node_lost", 0) for row in steps) == len(lost)
        # The loop waited for the tier to serve again: a step after the one that lost the node trains.
        first_lost = next(i for i, causes in enumerate(masked) if "node_lost" in causes)
        assert any(step["samples"] for step in ledger[first_lost + 1:]), (masked, out[-3000:])
        # Every verifier that ran to its end (network: none) went out through its own node's proxy, the only
        # one that could enter its namespace: each fetched the file, and a step that lost nothing counts 16. Each
        # proxy went upstream at most a few times (a few verifiers at once may all miss its cache).
        verified = [r for r in verified if r["outcome"] == "ok"]
        assert verified and all((r["egress"] or {}).get("bytes") == {"files.example.test": len(FILE)}
                                for r in verified), [r["egress"] for r in verified]
        whole = [row for row in steps if "reward_mean" in row and not row["infra_failures_by_cause"]]
        assert whole and all(row.get("egress/bytes/files.example.test") == 16 * len(FILE) for row in whole)
        assert 1 <= outside.gets["/f"] < 2 * 16
        # What the loop waited for, printed: Ray may report the dead actors' calls only once they are back on the
        # new node (2026-12-07: once after 24 s of waiting for the requeue, once with nothing left to wait for).
        driver_log = Path(doc["components"]["training/trainer"]["log_path"]).read_text()
        print("\nmasked by step:", [dict(Counter(step["masked"].values())) for step in ledger], "trained by step:",
              [len(step["samples"]) for step in ledger], *re.findall(r".*rollout tier.*", driver_log), sep="\n  ")

        dev_slurm("revive-node", victim)
        revived = victim
        # What a session actor that died would leave on a node: a container, a network and a volume of the run.
        label = f"rl360.run={run_id}"
        for argv in (["run", "-d", "--label", label, "--network", "none", docker_nodes["images"]["busybox"],
                      "sleep", "300"], ["network", "create", "--label", label, f"left-{run_id}"],
                     ["volume", "create", "--label", label, f"left-{run_id}"]):
            subprocess.run([docker, "-H", socket_of(new_node), *argv], check=True, capture_output=True, timeout=60)
        down = run_cli("down", state=state_path, cwd=tmp_path, timeout=300)
        assert down.returncode == 0, down.stdout + down.stderr
    finally:
        outside.__exit__(None, None, None)
        if up.poll() is None:
            up.kill()
        if victim and not revived:
            dev_slurm("revive-node", victim)
        for watcher in watchers.values():
            watcher.terminate()
    created = {n: [json.loads(line) for line in w.communicate(timeout=30)[0].splitlines() if line.strip()]
               for n, w in watchers.items()}
    # The new node's prewarm, recorded in the state file after the requeue, ended before the first sandbox of the
    # run was created on its daemon.
    prewarm = doc["nodes"][new_node].get("prewarm") or {}
    assert prewarm.get("status") == "ok" and prewarm["at"] > tier["requeued_at"], (prewarm, tier)
    assert doc["nodes"][new_node]["images"] and not tier.get("prewarm_pending")
    of_run = {n: [e for e in created[n] if e.get("Actor", {}).get("Attributes", {}).get("rl360.run") == run_id]
              for n in NODES}
    starts = [e["timeNano"] / 1e9 for e in of_run[new_node]]
    warmed_at = datetime.fromisoformat(prewarm["at"]).timestamp()
    assert starts and min(starts) >= warmed_at, (min(starts or [0]) - warmed_at, prewarm)
    # The daemons' own account: the run's sandboxes were created on the two rollout nodes' daemons only, each on
    # the daemon of the node its sample's record names.
    attempts = {n: {e["Actor"]["Attributes"].get("rl360.attempt") for e in of_run[n]} - {None} for n in NODES}
    assert {n for n in NODES if attempts[n]} == {victim, new_node}, {n: len(a) for n, a in attempts.items()}
    where = {attempt: node for node, held in attempts.items() for attempt in held}
    named = {f"{r['group']}-{r['sample']}": r["sandbox_node"] for r in rows}
    assert named and all(where.get(attempt) == node for attempt, node in named.items()), (named, where)
    # Nothing of the run on any daemon: the lost node's too.
    for node in NODES:
        for what in (["ps", "-aq"], ["network", "ls", "-q"], ["volume", "ls", "-q"]):
            listed = subprocess.run([docker, "-H", socket_of(node), *what, "--filter", f"label=rl360.run={run_id}"],
                                    capture_output=True, text=True, check=True, timeout=60).stdout.split()
            assert listed == [], f"{node} still holds {what[0]} {listed} of run {run_id}"


def ps(docker: str, node: str, run_id: str) -> list[str]:
    """The containers of run `run_id` on node's daemon, running or not."""
    return subprocess.run([docker, "-H", socket_of(node), "ps", "-aq", "--filter", f"label=rl360.run={run_id}"],
                          capture_output=True, text=True, check=True, timeout=60).stdout.split()
