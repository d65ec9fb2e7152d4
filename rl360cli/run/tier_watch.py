"""The rollout tier as the loop's new groups need it after a lost node: requeued, its engines back, its new nodes
prewarmed.

    watch = RolloutTierWatch(state=state, run_id=run_id, api_key=key, route=lambda actors: route_table(...))
    rollouts.use_tier_watch(watch)       # Rollouts.when_live asks it before it sends new groups

A Slurm tier that lost a node is requeued (backends/slurm_requeue.py): its components are started again on the
node that took the lost one's place, the run's control plane (run/control.py) adopts each engine there, the
trainer takes it back into the weight sync (run/rejoin.py) and the control plane gives it back to the router.
Until then a session finds no engine (`engine_error`), so a step generated meanwhile is masked whole. The
rollouts therefore wait before they send new groups, while `recovering()` says so (a tier requeueing, a
component waiting for its restart, or a requeue since the last wait: fields of the state file, read once a
submit; only what a requeue does, so an engine the control plane restarts on its own node holds nothing up) or a
group came back lost with its actor, until `wait_live` sees:

1. no tier of the cluster requeueing, and none failed (then the run fails at once, naming it);
2. no component of the run waiting for its restart (`restart`), none of its engines still starting;
3. no tier's new node waiting for its prewarm (`prewarm_pending`: the reconcile that finished the requeue runs
   `prewarm-images` on it, stages/status.py);
4. the router (the run's, where it is now) counting every engine of the run that is not final as healthy.

Past the deadline the run fails in one line naming what it waited for (`[rollout] recovery_timeout_s`).

Test: tests/slurm/test_slurm_docker_run.py (the node-loss test); tests/run/test_tier_watch.py (the rules).
"""

from __future__ import annotations

import time
import urllib.error
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from rl360cli.errors import RunFailed
from rl360cli.inference.router import router_workers
from rl360cli.state import queries
from rl360cli.state.schema import COMPONENT_FINAL, ComponentStatus, StateDoc, TierStatus
from rl360cli.state.store import StateFile

if TYPE_CHECKING:
    from rl360cli.rollout.routing import RouteTable


class TierFailed(RunFailed):
    """A tier of the run failed (no requeue left, or its requeue failed): it will not be live again."""


def requeues(doc: StateDoc) -> int:
    """How many requeues the cluster's tiers have had, all together."""
    return sum(int(t.get("requeues") or 0) for t in queries.tiers(doc).values())


def requeue_under_way(doc: StateDoc, run_id: str) -> str | None:
    """Why the state file says a requeue after a lost node is not through yet (None: none is under way). Raises
    `TierFailed` for a tier that failed."""
    for name, tier in sorted(queries.tiers(doc).items()):
        if tier["status"] == TierStatus.FAILED:
            raise TierFailed(f"tier {name} failed ({tier.get('reason') or 'no reason recorded'}): the run's rollouts "
                             "cannot go on", fix="see `rl360 status`; raise [slurm] max_requeues")
        if tier["status"] == TierStatus.REQUEUEING:
            return f"tier {name} is requeued after a lost node"
        if tier.get("prewarm_pending"):
            return f"tier {name}'s new nodes {', '.join(tier['prewarm_pending'])} are not prewarmed yet"
    for cid, rec in sorted(queries.run_components(doc, run_id).items()):
        if rec.get("restart") and rec["status"] != ComponentStatus.STOPPED:
            return f"{cid} waits to be started on the node that took its node's place"
    return None


def not_live(doc: StateDoc, run_id: str, *, api_key: str | None) -> str | None:
    """Why the rollout tier does not serve new groups yet (None: it does): a requeue under way, an engine of the
    run starting, or one the router does not serve. Raises `TierFailed` for a tier that failed."""
    why = requeue_under_way(doc, run_id)
    if why is not None:
        return why
    for cid, rec in sorted(queries.run_components(doc, run_id).items()):
        if rec["kind"].startswith("engine") and rec["status"] == ComponentStatus.STARTING:
            return f"{cid} is starting"
    return engines_not_served(doc, run_id, api_key=api_key)


def engines_not_served(doc: StateDoc, run_id: str, *, api_key: str | None) -> str | None:
    """Why the run's router does not serve every engine of the run that is not final (None: it does)."""
    router = queries.run_router(doc, run_id)
    engines = sorted((rec.get("url") or "").rstrip("/") for rec in queries.run_components(doc, run_id).values()
                     if rec["kind"].startswith("engine") and rec["status"] not in COMPONENT_FINAL and rec.get("url"))
    if router is None or not router.get("url") or router["status"] in COMPONENT_FINAL:
        return "the run's router is not running"
    if not engines:
        return "no engine of the run is running"
    try:
        seen = {url.rstrip("/"): healthy for url, healthy in router_workers(router["url"], api_key=api_key).items()}
    except (urllib.error.URLError, OSError, ValueError) as e:
        return f"the router does not answer ({e})"
    missing = [url for url in engines if not seen.get(url)]
    return f"the router does not serve {', '.join(missing)} yet" if missing else None


@dataclass
class RolloutTierWatch:
    """See the module docstring; `rollouts.TierWatch` is its protocol."""

    state: StateFile
    run_id: str
    api_key: str | None
    # The groups' routes with each actor's node now (run/session_actors.py `route_table`); None: round robin.
    route: Callable[[list], RouteTable | None]
    log: Callable[[str], None] = print
    poll_s: float = 1.0
    # The requeues the last wait saw: one more since means a tier was requeued meanwhile.
    seen_requeues: int | None = None
    waits: list[tuple[str, float]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.seen_requeues is None:
            self.seen_requeues = requeues(self.state.snapshot())

    def recovering(self) -> bool:
        doc = self.state.snapshot()
        return requeues(doc) != self.seen_requeues or requeue_under_way(doc, self.run_id) is not None

    def wait_live(self, deadline: float) -> None:
        started, said = time.monotonic(), None
        while True:
            doc = self.state.snapshot()
            why = not_live(doc, self.run_id, api_key=self.api_key)
            if why is None:
                break
            if why != said:
                self.log(f"new groups wait for the rollout tier: {why}")
                said = why
            if time.monotonic() >= deadline:
                raise RunFailed(f"the rollout tier is not live {time.monotonic() - started:.0f}s after a lost node: "
                                f"{why}", fix="see `rl360 status` and `rl360 logs` (`rl360 up` attached or "
                                "`rl360 watch` advances a requeue and prewarms its new nodes); raise "
                                "[rollout] recovery_timeout_s")
            time.sleep(self.poll_s)
        self.seen_requeues = requeues(doc)
        waited = time.monotonic() - started
        self.waits.append((said or "live", waited))
        if said is not None:
            self.log(f"the rollout tier is live again ({waited:.1f}s waited)")

    def lost_nodes(self) -> frozenset[str]:
        return frozenset(n for t in queries.tiers(self.state.snapshot()).values() for n in t.get("lost_nodes") or [])

    def actor_nodes(self, actors: list) -> tuple[str, ...]:
        import ray

        return tuple(ray.get([actor.node_of.remote() for actor in actors]))

    def route_table(self, actors: list) -> RouteTable | None:
        return self.route(actors)
