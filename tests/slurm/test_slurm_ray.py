"""A Ray cluster inside the Slurm allocations: the head as a job step on the service node, a worker as a
job step on each of the training and rollout nodes, token auth on, and a driver on this machine that
joins and runs a task on each tier's node. The fake nodes share one host and its /tmp, where two Ray
workers started at once used to take the same plasma socket."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from rl360cli.backends.slurm_ray import ray_address, ray_cluster_specs, ray_env
from tests.slurm.conftest import start_spec, write_profile

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

DRIVER = """
import json, os, sys, time
import ray
ray.init(address=sys.argv[1], log_to_driver=False)
deadline = time.time() + 90
while len([n for n in ray.nodes() if n["Alive"]]) < 3 and time.time() < deadline:
    time.sleep(0.5)
where = lambda: (os.environ.get("SLURMD_NODENAME"), os.environ.get("SLURM_JOB_ID"))
on = {t: ray.remote(num_cpus=0, resources={f"tier_{t}": 0.5})(where) for t in ("service", "training", "rollout")}
print(json.dumps({"nodes": len([n for n in ray.nodes() if n["Alive"]]),
                  **{t: ray.get(f.remote(), timeout=120) for t, f in on.items()}}))
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_ray_head_and_worker_as_job_steps(rl360, tmp_path):
    # Whole-node CPU requests keep the two tiers on two different fake nodes without --exclusive.
    tiers = {t: {"num_nodes": 1, "cpus_per_node": 2} for t in ("service", "training")}
    tiers["rollout"] = {"num_nodes": 1, "cpus_per_node": 1}
    profile = write_profile(tmp_path, "dev-ray", slurm={"exclusive": False}, tiers=tiers)
    assert rl360("provision", "--profile", str(profile)).returncode == 0
    doc = rl360.doc()
    assert doc["tiers"]["service"]["nodes"] != doc["tiers"]["training"]["nodes"]
    token = tmp_path / "ray" / "auth_token"
    port = free_port()
    specs = ray_cluster_specs(doc=doc, run=None, token_path=token, port=port, python=sys.executable,
                              num_cpus={"service": 1, "training": 1, "rollout": 1})
    node = {t: doc["tiers"][t]["nodes"][0] for t in ("service", "training", "rollout")}
    assert [s.id for s in specs] == ["service/ray-head", f"training/ray-worker-{node['training']}",
                                     f"rollout/ray-worker-{node['rollout']}"]
    assert [a for s in specs for a in s.argv if a.startswith("--temp-dir=")] == \
        [f"--temp-dir=/tmp/ray/{node[t]}" for t in ("service", "training", "rollout")]
    assert all(s.env["RAY_AUTH_MODE"] == "token" and s.env["RAY_AUTH_TOKEN_PATH"] == str(token) for s in specs)
    assert oct(token.stat().st_mode & 0o777) == "0o600" and len(token.read_text()) == 64
    records = [start_spec(rl360.state, spec) for spec in specs]

    driver = subprocess.run([sys.executable, "-c", DRIVER, ray_address(doc, port=port)], capture_output=True,
                            text=True, timeout=240, env={**os.environ, **ray_env(token)})
    assert driver.returncode == 0, driver.stderr[-3000:]
    seen = json.loads(driver.stdout.strip().splitlines()[-1])
    assert seen["nodes"] == 3
    # Each tier's task ran inside that tier's allocation, on its node.
    for tier in ("service", "training", "rollout"):
        assert seen[tier] == [doc["tiers"][tier]["nodes"][0], str(doc["tiers"][tier]["job_id"])]

    report = rl360.status()
    assert {c: report["components"][c]["status"] for c in report["components"]} == \
        {s.id: "running" for s in specs}
    assert rl360("down", "--grace", "10").returncode == 0
    # Nothing of this Ray cluster is left: no process carries its token path any more.
    marker = f"RAY_AUTH_TOKEN_PATH={token}".encode()
    left = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if marker in environ.read_bytes():
                left.append(environ.parent.name)
        except OSError:
            continue
    assert not left, f"Ray processes left behind: {left}"
    assert all(json.loads(Path(r["status_path"]).read_text()).get("exit_code") is not None for r in records)
