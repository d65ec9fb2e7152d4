"""When the loop's new groups wait for the rollout tier after a lost node (rl360cli/run/tier_watch.py), on a real
state file and a stand-in router's `/workers` on loopback: a requeue under way, a new node not prewarmed, an engine
the router does not serve yet; a failed tier fails the run at once; past the deadline, one line naming what it
waited for."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from rl360cli.errors import RunFailed
from rl360cli.run.tier_watch import RolloutTierWatch, TierFailed, not_live, requeue_under_way
from rl360cli.state.store import StateFile


class RouterStandIn:
    """Answers `/workers` with the engines it is told, each healthy."""

    def __init__(self):
        served = self.served = []

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                body = json.dumps({"workers": [{"url": u, "is_healthy": True} for u in served]}).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"


@pytest.fixture
def router():
    stand_in = RouterStandIn()
    yield stand_in
    stand_in.server.shutdown()


def seed(state: StateFile, router_url: str, *, tier: dict, engine: dict) -> None:
    with state.update() as doc:
        doc["tiers"]["rollout"] = {"backend": "slurm", "status": "ready", "job_id": "7", "nodes": ["n3"], **tier}
        doc["components"]["service/router"] = {"tier": "service", "name": "router", "kind": "router", "run": "r1",
                                               "status": "running", "url": router_url}
        doc["components"]["rollout/engine-0"] = {"tier": "rollout", "name": "engine-0", "kind": "engine", "run": "r1",
                                                 "status": "running", "url": "http://n3:31302", **engine}


@pytest.mark.parametrize(("tier", "engine", "served", "why"), [
    ({"status": "requeueing"}, {}, [], "tier rollout is requeued after a lost node"),
    ({"prewarm_pending": ["n3"]}, {}, [], "tier rollout's new nodes n3 are not prewarmed yet"),
    ({}, {"status": "failed", "restart": True}, [], "rollout/engine-0 waits to be started on the node"),
    ({}, {"status": "starting"}, [], "rollout/engine-0 is starting"),
    ({}, {}, [], "the router does not serve http://n3:31302 yet"),
    ({}, {}, ["http://n3:31302/"], None),
])
def test_the_tier_is_live_once_requeued_prewarmed_and_its_engines_served(tmp_path, router, tier, engine, served, why):
    state = StateFile(tmp_path / "state.json")
    seed(state, router.url, tier=tier, engine=engine)
    router.served[:] = served
    found = not_live(state.read(), "r1", api_key=None)
    assert (found or None) == why or (why and found.startswith(why)), found


def test_a_requeue_since_the_last_wait_is_waited_for_and_past_the_deadline_the_run_fails_in_one_line(tmp_path,
                                                                                                     router):
    state = StateFile(tmp_path / "state.json")
    seed(state, router.url, tier={}, engine={})
    router.served[:] = ["http://n3:31302"]
    said: list[str] = []
    watch = RolloutTierWatch(state=state, run_id="r1", api_key=None, route=lambda actors: None, log=said.append,
                             poll_s=0.01)
    assert not watch.recovering()
    with state.update() as doc:  # a requeue came and went between two submits
        doc["tiers"]["rollout"].update(requeues=1, lost_nodes=["n1"], prewarm_pending=["n3"])
    assert watch.recovering() and watch.lost_nodes() == {"n1"}
    with pytest.raises(RunFailed, match="not prewarmed yet") as caught:
        watch.wait_live(time.monotonic())
    assert "\n" not in str(caught.value) and "recovery_timeout_s" in caught.value.fix
    with state.update() as doc:
        doc["tiers"]["rollout"]["prewarm_pending"] = None
    watch.wait_live(time.monotonic() + 30)  # live at once: nothing more said
    assert not watch.recovering() and said == ["new groups wait for the rollout tier: tier rollout's new nodes n3 "
                                               "are not prewarmed yet"]


def test_a_failed_tier_fails_the_run_at_once(tmp_path, router):
    state = StateFile(tmp_path / "state.json")
    seed(state, router.url, tier={"status": "failed", "reason": "lost n3; all 1 requeues used"}, engine={})
    with pytest.raises(TierFailed, match="tier rollout failed \\(lost n3; all 1 requeues used\\)"):
        requeue_under_way(state.read(), "r1")
