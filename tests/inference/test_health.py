"""The health watcher on the local backend: real supervised processes, killed, hung (SIGSTOP) or stopped.

The components are `StandInEngine`s (tests/inference/health_standins.py: a process that answers /health and
/model_info, no model), started and restarted by the real `LocalBackend`; the weight-update group is a
callback that records what it was asked (the real rejoin is tests/loop/test_engine_restart.py). Also: the
client's one retry of a request cut by a server that went away, against a stand-in server killed and
started again on its port.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from rl360cli import procinfo
from rl360cli.backends.base import ComponentSpec
from rl360cli.backends.local import LocalBackend
from rl360cli.inference.client import EngineClient, EngineError
from rl360cli.inference.health import probe, served_version
from rl360cli.run.control import HealthPolicy, HealthWatcher
from rl360cli.inference.router import with_worker_urls
from rl360cli.state import transitions
from rl360cli.state.schema import now_iso
from rl360cli.state.store import StateFile
from tests.conftest import REPO

RUN = "r1"
FAST = HealthPolicy(interval_s=0.1, probe_timeout_s=0.5, num_failures=2, ready_timeout_s=30, max_restarts=2)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def standin_argv(port: int) -> tuple[str, ...]:
    return (sys.executable, "-m", "tests.inference.health_standins", "--port", str(port))


class Cluster:
    """A state file with one running run and stand-in engines started through the local backend."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.state = StateFile(folder / "state.json")
        self.backend = LocalBackend(None)
        self.rejoined: list[str] = []
        self.forgotten: list[str] = []
        self.fail_rejoins = 0
        with self.state.update() as doc:
            doc["runs"][RUN] = {"name": "t", "recipe": "-", "run_dir": str(folder), "metrics_path": "-",
                                "started_at": now_iso(), "num_steps": 1, "step": 0, "policy_version": 7,
                                "status": "running", "resumed": False}

    def start(self, name: str) -> str:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        spec = ComponentSpec(name=name, tier="rollout", stage="serve", kind="engine-local", argv=standin_argv(port),
                             env={"PYTHONPATH": str(REPO)}, ports={"http": port}, run=RUN, url=url,
                             health_url=url + "/health")
        record = self.backend.launch(spec, str(self.folder / f"{name}.log"))
        record.update(stage="serve", tier="rollout", name=name, kind=spec.kind, run=RUN, ports=spec.ports, url=url,
                      health_url=spec.health_url, started_at=now_iso(), status="running", exit_code=None,
                      reason=None, env=spec.env)
        with self.state.update() as doc:
            doc["components"][spec.id] = record
        wait_until(lambda: probe(url + "/health", timeout_s=0.5) is None)
        return spec.id

    def record(self, cid: str) -> dict:
        return self.state.read()["components"][cid]

    def rejoin(self, url: str) -> int:
        if self.fail_rejoins:
            self.fail_rejoins -= 1
            raise RuntimeError("the group did not form")
        self.rejoined.append(url)
        return 7

    def watcher(self, policy: HealthPolicy = FAST) -> HealthWatcher:
        return HealthWatcher(state=self.state, run_id=RUN, backend=self.backend, rejoin=self.rejoin, policy=policy,
                             forget=self.forgotten.append, log=lambda message: None)

    def stop_all(self) -> None:
        self.backend.stop(self.state.read()["components"], grace_s=2.0)


def wait_until(condition, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def rounds_until_restart(watcher: HealthWatcher, num_rounds: int = 100) -> list[str]:
    for _ in range(num_rounds):
        done = watcher.check_once()
        if done:
            return done
        time.sleep(watcher.policy.interval_s)
    return []


@pytest.fixture
def cluster(tmp_path: Path):
    c = Cluster(tmp_path)
    yield c
    c.stop_all()


def test_a_killed_engine_is_started_again_rejoins_and_serves_on(cluster):
    cid = cluster.start("engine-0")
    other = cluster.start("engine-1")
    old = cluster.record(cid)
    watcher = cluster.watcher()
    assert watcher.check_once() == []  # all healthy: nothing to do

    os.kill(old["pid"], signal.SIGKILL)
    assert rounds_until_restart(watcher) == [cid]
    new = cluster.record(cid)
    assert new["pid"] != old["pid"] and procinfo.is_alive(new["pid"], new["start_time"])
    assert (new["status"], new["restarts"], new["served_version"]) == ("running", 1, 7)
    assert "SIGKILL" in new["restart_reason"]
    assert new["url"] == old["url"] and new["ports"] == old["ports"] and new["log_path"] == old["log_path"]
    assert cluster.rejoined == [old["url"]]
    assert served_version(new["url"], api_key=None) == 0  # the stand-in's own; the real one is the trainer's
    # The one that did not die was left alone.
    assert cluster.record(other)["pid"] == cluster.state.read()["components"][other]["pid"]
    assert "restarts" not in cluster.record(other)
    events = [json.loads(line) for line in cluster.state.events_path.read_text().splitlines()]
    assert [(e["action"], e["subject"]) for e in events if e["stage"] == "serve"] == [("health", cid),
                                                                                       ("restart", cid)]


def test_a_hung_engine_counts_as_dead_and_is_killed_before_its_restart(cluster):
    cid = cluster.start("engine-0")
    old = cluster.record(cid)
    watcher = cluster.watcher()
    os.kill(old["pid"], signal.SIGSTOP)  # alive, but /health never answers
    try:
        assert rounds_until_restart(watcher) == [cid]
    finally:
        if procinfo.is_alive(old["pid"], old["start_time"]):
            os.kill(old["pid"], signal.SIGKILL)
    new = cluster.record(cid)
    assert new["restart_reason"].startswith("hung: /health no answer in 0.5s, 2 probes in a row")
    assert not procinfo.is_alive(old["pid"], old["start_time"])
    assert new["status"] == "running" and probe(new["url"] + "/health", timeout_s=1) is None


def test_nothing_is_restarted_once_stopped_or_once_the_run_is_over(cluster):
    stopped, ended = cluster.start("engine-0"), cluster.start("engine-1")
    with cluster.state.update() as doc:
        doc["components"][stopped]["status"] = "stopped"  # as `rl360 down` leaves it
    watcher = cluster.watcher()
    os.kill(cluster.record(stopped)["pid"], signal.SIGKILL)
    assert [watcher.check_once() for _ in range(5)] == [[]] * 5
    with cluster.state.update() as doc:
        doc["runs"][RUN]["status"] = "finished"
    os.kill(cluster.record(ended)["pid"], signal.SIGKILL)
    time.sleep(0.3)
    assert [watcher.check_once() for _ in range(5)] == [[]] * 5
    assert "restarts" not in cluster.record(stopped) and "restarts" not in cluster.record(ended)


def test_a_restart_that_meets_rl360_down_leaves_no_process_behind(cluster):
    from rl360cli.errors import Rl360Error
    from rl360cli.run.restarts import relaunch_component

    cid = cluster.start("engine-0")
    old = cluster.record(cid)
    os.kill(old["pid"], signal.SIGKILL)
    with cluster.state.update() as doc:  # what `rl360 down` does before it stops anything
        doc["runs"][RUN]["status"] = "stopped"
    with pytest.raises(Rl360Error, match="was stopped while it restarted"):
        relaunch_component(cluster.backend, cluster.state, cid, reason="test", while_run_active=True)
    assert probe(old["url"] + "/health", timeout_s=0.5) is not None  # nothing answers on its port
    assert "restarts" not in cluster.record(cid)
    # The process it had started (its supervisor's status file names it) is gone again.
    started = json.loads(Path(old["status_path"]).read_text())["pid"]
    assert started != old["pid"] and not procinfo.is_alive(started)


def test_past_max_restarts_an_engine_stays_failed(cluster):
    cid = cluster.start("engine-0")
    watcher = cluster.watcher(HealthPolicy(interval_s=0.1, probe_timeout_s=0.5, num_failures=2, max_restarts=0))
    os.kill(cluster.record(cid)["pid"], signal.SIGKILL)
    wait_until(lambda: (watcher.check_once(), cluster.record(cid)["status"] == "failed")[1])
    rec = cluster.record(cid)
    assert "max_restarts 0 reached" in rec["reason"] and "restarts" not in rec
    assert [watcher.check_once() for _ in range(3)] == [[]] * 3


def test_an_engine_whose_rejoin_fails_is_kept_back_until_it_succeeds(cluster):
    cid = cluster.start("engine-0")
    watcher = cluster.watcher()
    cluster.fail_rejoins = 1
    os.kill(cluster.record(cid)["pid"], signal.SIGKILL)
    wait_until(lambda: (watcher.check_once(), cluster.record(cid).get("restarts") == 1)[1])
    assert cluster.rejoined == [] and cluster.record(cid)["served_version"] is None
    assert watcher.check_once() == [cid]  # alive: only the rejoin is tried again
    assert cluster.rejoined == [cluster.record(cid)["url"]] and cluster.record(cid)["served_version"] == 7
    assert cluster.record(cid)["restarts"] == 1


def test_the_watcher_thread_restarts_on_its_own(cluster):
    cid = cluster.start("engine-0")
    watcher = cluster.watcher()
    watcher.start()
    try:
        os.kill(cluster.record(cid)["pid"], signal.SIGKILL)
        wait_until(lambda: cluster.record(cid).get("served_version") == 7)
    finally:
        watcher.stop()
    assert [what for _, c, what in watcher.history if c == cid][-1] == "back at policy version 7"


# What the state may say of a component whose node was lost, before the backend starts it again: the requeue's
# `restart` mark (backends/slurm_requeue.py `mark_for_restart`); or only Slurm's observation, `cause` node_lost,
# which comes first (CI, 2026-12-07: the watcher restarted the engine on the lost node in between, five times,
# and left it failed over the one the requeue started); or the tier's `lost_nodes` naming its node.
LOST_NODE_RECORDS = {
    "restart": {"status": "failed", "reason": "node_lost", "restart": True},
    "cause": {"status": "failed", "reason": "node_lost", "cause": "node_lost"},
    "lost_nodes": {"status": "failed", "reason": "its process ended"},
}


@pytest.mark.parametrize("recorded", LOST_NODE_RECORDS)
def test_a_component_whose_node_was_lost_is_left_to_its_backend_then_adopted(cluster, recorded):
    # Slurm's requeue starts a lost node's components on the node that replaced it, at a URL naming that node.
    # The watcher must not start them on the lost node itself, and must bring the one the backend started back
    # to the trainer's version before it serves.
    cid = cluster.start("engine-0")
    old = cluster.record(cid)
    watcher = cluster.watcher()
    os.kill(old["pid"], signal.SIGKILL)
    with cluster.state.update() as doc:
        doc["components"][cid].update(LOST_NODE_RECORDS[recorded])
        if recorded == "lost_nodes":
            rec = doc["components"][cid]
            rec["node"] = rec.get("node") or "n3"
            doc.setdefault("tiers", {})[rec["tier"]] = {"status": "ready", "lost_nodes": [rec["node"]]}
    assert [watcher.check_once() for _ in range(5)] == [[]] * 5
    assert cluster.forgotten == [old["url"]] and cluster.rejoined == []
    assert "restarts" not in cluster.record(cid) and cluster.record(cid)["status"] == "failed"

    # The backend starts it again elsewhere (here: another port on this machine), as `_restart_components`.
    moved = cluster.start("engine-0")
    new = cluster.record(moved)
    assert moved == cid and new["url"] != old["url"]
    with cluster.state.update() as doc:
        doc["components"][cid].update(status="starting", restarts=1)
        if recorded == "lost_nodes":
            doc["components"][cid]["node"] = "n4"  # the node that took the lost one's place
    wait_until(lambda: watcher.check_once() == [cid])
    assert cluster.rejoined == [new["url"]] and cluster.record(cid)["served_version"] == 7
    assert cluster.record(cid)["status"] == "running" and cluster.record(cid)["pid"] == new["pid"]
    assert watcher.check_once() == []  # in sync: nothing more to do


class RequeueRacesTheRestart:
    """The local backend, with a tier's requeue that starts the engine again "on another node" (another port,
    recorded as backends/slurm_requeue.py `_restart_components` records it: `record_restart`, no generation)
    at the worst moment for the watcher's own restart: as it launches (`launch`: before the watcher records
    its start) or while it waits for it (`observe`: after). The watcher's own start fails, as a step on the
    lost node does."""

    def __init__(self, cluster: Cluster, cid: str, moment: str):
        self.cluster, self.cid, self.moment = cluster, cid, moment
        self.own: list[dict] = []
        self.requeued: dict | None = None

    def launch(self, spec: ComponentSpec, log_path: str) -> dict:
        launched = self.cluster.backend.launch(replace(spec, argv=(sys.executable, "-c", "raise SystemExit(3)")),
                                               log_path)
        self.own.append(launched)
        if self.moment == "launch":
            self._requeue()
        return launched

    def observe(self, records):
        if self.moment == "wait" and self.own and self.requeued is None:
            self._requeue()
        return self.cluster.backend.observe(records)

    def stop(self, records, *, grace_s: float) -> None:
        self.cluster.backend.stop(records, grace_s=grace_s)

    def _requeue(self) -> None:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        spec = ComponentSpec(name="engine-0", tier="rollout", stage="serve", kind="engine-local",
                             argv=standin_argv(port), env={"PYTHONPATH": str(REPO)}, ports={"http": port}, run=RUN,
                             url=url, health_url=url + "/health")
        launched = self.cluster.backend.launch(spec, str(self.cluster.folder / "requeued.log"))
        self.requeued = transitions.record_restart(self.cluster.state, self.cid, launched, command=spec.argv,
                                                   env=spec.env, url=url, health_url=spec.health_url,
                                                   reason="node_lost")


@pytest.mark.parametrize("moment", ["launch", "wait"])
def test_a_requeue_that_overtakes_the_watchers_restart_stands(cluster, moment):
    # The node-loss run's lost update (docs/development.md): the watcher found the engine hung and began its
    # restart on the old node; the tier's requeue started it on the new node meanwhile. The watcher's write must
    # not replace the requeue's record, nor its failure (on the lost node) be marked on the requeue's start:
    # its restart is abandoned, and it adopts the requeue's engine.
    cid = cluster.start("engine-0")
    backend = RequeueRacesTheRestart(cluster, cid, moment)
    watcher = HealthWatcher(state=cluster.state, run_id=RUN, backend=backend, rejoin=cluster.rejoin, policy=FAST,
                            forget=cluster.forgotten.append, log=lambda message: None)
    os.kill(cluster.record(cid)["pid"], signal.SIGKILL)
    try:
        wait_until(lambda: watcher.check_once() == [cid])
        requeued = backend.requeued
        assert requeued is not None and len(backend.own) == 1
        assert any(c == cid and what.startswith("restart abandoned") for _, c, what in watcher.history)
        rec = cluster.record(cid)
        assert rec["pid"] == requeued["pid"] and rec["url"] == requeued["url"] and rec["restart_reason"] == "node_lost"
        assert rec["status"] == "running" and rec["served_version"] == 7
        assert cluster.rejoined == [requeued["url"]]
        own = json.loads(Path(backend.own[0]["status_path"]).read_text())["pid"]
        assert not procinfo.is_alive(own)
        assert watcher.check_once() == []
    finally:  # the requeue's process, whichever record names it at the end (the lost update left it unnamed)
        if backend.requeued is not None:
            cluster.backend.stop({cid: backend.requeued}, grace_s=2.0)


def test_a_restart_that_fails_waits_longer_each_time(cluster):
    cid = cluster.start("engine-0")
    watcher = cluster.watcher(HealthPolicy(interval_s=0.1, probe_timeout_s=0.5, num_failures=2, ready_timeout_s=10,
                                           max_restarts=3))
    with cluster.state.update() as doc:  # its next start fails at once
        doc["components"][cid]["command"] = [sys.executable, "-c", "raise SystemExit(3)"]
    os.kill(cluster.record(cid)["pid"], signal.SIGKILL)

    def failures() -> list[tuple[float, str]]:
        return [(t, what) for t, c, what in watcher.history if c == cid and what.startswith("restart failed")]

    wait_until(lambda: (watcher.check_once(), len(failures()) == 2)[1])
    (first, why), (second, _) = failures()
    assert "ended as it restarted" in why
    assert second - first >= 2.0  # 2 s after the first failure, not the next round's 0.1 s
    assert cluster.record(cid)["restarts"] == 2


def test_serve_restart_starts_one_again_by_hand_through_the_same_path(cluster):
    from rl360cli.config import load_profile
    from rl360cli.errors import Rl360Error
    from rl360cli.stages.base import Context
    from rl360cli.stages.serve import restart

    cid = cluster.start("engine-0")
    old = cluster.record(cid)
    ctx = Context(state=cluster.state, profile=load_profile(REPO / "cluster" / "local.toml"),
                  profile_path=REPO / "cluster" / "local.toml", run_id=RUN)
    rec = restart(ctx, cid)  # the old process still runs: it is stopped first
    assert rec["pid"] != old["pid"] and not procinfo.is_alive(old["pid"], old["start_time"])
    assert (rec["status"], rec["restarts"], rec["restart_reason"]) == ("running", 1, "restarted by hand")
    with pytest.raises(Rl360Error, match="no engine or router 'rollout/nope' is recorded"):
        restart(ctx, "rollout/nope")


def test_status_shows_the_version_each_engine_serves_and_its_restarts(cluster):
    from rl360cli.commands.status import component_rows

    cid = cluster.start("engine-0")
    with cluster.state.update() as doc:
        doc["components"][cid]["restarts"] = 2
    rows = component_rows(cluster.state.read()["components"], versions={cid: 5})
    assert rows[0][0] == cid and rows[0][-1] == "serves v5, 2 restarts"
    assert component_rows(cluster.state.read()["components"], versions={cid: None})[0][-1] == "version ?, 2 restarts"


def test_a_restarted_router_starts_with_the_live_engines():
    argv = ["python", "-m", "sglang_router.launch_router", "--host", "127.0.0.1", "--worker-urls", "http://a:1",
            "http://b:2", "--policy", "cache_aware"]
    assert with_worker_urls(argv, ["http://b:2"]) == ["python", "-m", "sglang_router.launch_router", "--host",
                                                      "127.0.0.1", "--worker-urls", "http://b:2", "--policy",
                                                      "cache_aware"]
    assert with_worker_urls(argv[:-2], ["http://c:3"])[-2:] == ["--worker-urls", "http://c:3"]


# ----------------------------------------------------------------------------- a request cut by a restart


def start_standin(port: int) -> subprocess.Popen:
    proc = subprocess.Popen(standin_argv(port), cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_until(lambda: probe(f"http://127.0.0.1:{port}/health", timeout_s=0.5) is None)
    return proc


def test_a_request_cut_by_a_server_restart_is_sent_once_more():
    port = free_port()
    server = start_standin(port)

    async def go():
        async with EngineClient(f"http://127.0.0.1:{port}", reconnect_wait_s=30) as client:
            pending = asyncio.ensure_future(client.request("POST", "/generate", {"sleep_s": 2.0}))
            await asyncio.sleep(0.5)
            server.kill()  # the request is cut; then nothing listens on the port for a while
            server.wait()
            await asyncio.sleep(1.0)
            restarted.append(await asyncio.to_thread(start_standin, port))
            return await pending

    restarted: list[subprocess.Popen] = []
    try:
        answer = asyncio.run(go())
    finally:
        for proc in [server, *restarted]:
            proc.kill()
            proc.wait()
    assert answer["output_ids"] == [1] and len(restarted) == 1


def test_a_cut_while_the_server_still_listens_is_an_engine_error():
    port = free_port()
    server = start_standin(port)

    async def go():
        async with EngineClient(f"http://127.0.0.1:{port}") as client:
            return await client.request("POST", "/cut", {})

    try:
        with pytest.raises(EngineError) as lost:
            asyncio.run(go())
    finally:
        server.kill()
        server.wait()
    assert lost.value.cause == "disconnected" and lost.value.infra_cause == "engine_error"


def test_a_cut_server_that_does_not_come_back_in_time_is_an_engine_error():
    port = free_port()
    server = start_standin(port)

    async def go():
        async with EngineClient(f"http://127.0.0.1:{port}", reconnect_wait_s=1.0, retry_backoff_s=0.1) as client:
            pending = asyncio.ensure_future(client.request("POST", "/generate", {"sleep_s": 5.0}))
            await asyncio.sleep(0.5)
            server.kill()
            return await pending

    with pytest.raises(EngineError) as lost:
        asyncio.run(go())
    server.wait()
    assert lost.value.cause == "connect"


# ----------------------------------------------------------------------------- rejoining the weight-update group


def relaunch_engine(model: Path, port: int, folder: Path):
    """A real engine again on `port` (what the watcher's relaunch does, without the backend)."""
    from .conftest import EngineProcess, wait_http_ok

    log = folder / f"engine-{port}-again.log"
    proc = subprocess.Popen([sys.executable, "-m", "rl360cli.inference.server", "--model", str(model), "--port",
                             str(port), "--num-threads", "1"], stdout=open(log, "wb"), stderr=subprocess.STDOUT)
    engine = EngineProcess(proc=proc, port=port, log=log)
    wait_http_ok(engine.url + "/health", proc, log)
    return engine


@pytest.mark.slow
def test_a_restarted_engine_is_taken_back_into_the_weight_update_group(start_engine, tiny_model, tmp_path):
    """Real engines, real gloo: an engine restarted on its port holds v0 and no group; the next sync re-forms
    the group with it by itself, and `rejoin` brings one restarted later to the trainer's version at once."""
    import torch
    from transformers import AutoModelForCausalLM

    from rl360cli.trainer.broadcast import WeightBroadcaster

    from .conftest import free_port as any_port

    def params_of(url: str) -> list[float]:
        request = urllib_request(url + "/get_weights_by_name", {"name": "model.embed_tokens.weight",
                                                                "truncate_size": 2})
        with __import__("urllib.request").request.urlopen(request, timeout=10) as reply:
            return json.load(reply)

    def perturb(seed: int) -> None:
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn(p.shape, generator=gen) * 0.05)

    a, b = start_engine(tiny_model, count=2)
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()
    expected = lambda: model.get_input_embeddings().weight[:2].tolist()
    sync = WeightBroadcaster([a.url, b.url], backend="gloo", master_port=any_port(), bucket_mb=1, timeout_s=30)
    again: list = []
    try:
        sync.connect()
        perturb(1)
        sync.broadcast(model.named_parameters(), version=1)
        b.kill()
        again.append(relaunch_engine(tiny_model, b.port, tmp_path))
        assert served_version(b.url, api_key=None) == 0

        perturb(2)  # nobody told the broadcaster: the sync finds it outside the group and re-forms the group
        stats = sync.broadcast(model.named_parameters(), version=2)
        assert stats.failed == {} and stats.num_engines == 2
        assert {u: served_version(u, api_key=None) for u in (a.url, b.url)} == {a.url: 2, b.url: 2}
        assert params_of(a.url) == params_of(b.url) == expected()

        again[-1].kill()
        sync.mark_restarting(b.url)  # as the watcher does when it finds the engine dead
        perturb(3)
        assert sync.broadcast(model.named_parameters(), version=3).failed == {b.url: "restarting (health watcher)"}
        again.append(relaunch_engine(tiny_model, b.port, tmp_path))
        stats = sync.rejoin(b.url, model.named_parameters(), 3)  # what the health watcher calls
        assert stats.failed == {} and sorted(sync.engines) == sorted([a.url, b.url]) and sync.failed_engines == {}
        assert {u: served_version(u, api_key=None) for u in (a.url, b.url)} == {a.url: 3, b.url: 3}
        assert params_of(b.url) == expected()
    finally:
        sync.close()
        for engine in again:
            engine.stop()


def urllib_request(url: str, body: dict):
    import urllib.request

    return urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
