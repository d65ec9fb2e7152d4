"""The run's control plane: its engines and router that die or hang come back, on their node, at the trainer's version.

    python -m rl360cli.run.control --state .rl360/state.json --run RUN_ID

`rl360 serve` starts it beside the router (component `service/control`, kind `control`); it runs until the
run's serving components are stopped (the run's end, `rl360 down`). It is a component of its own, not a
thread of the trainer, because what it starts again must outlive the trainer: on Slurm a job step ends with
the step that launched its `srun`, so an engine or router restarted from inside the trainer's step would end
with it. Restarted from here, each is a job step of its own that runs until the run's serving stops.

Each engine and the router of the run is watched on its own (`HealthWatcher`): its process as the backend
sees it, and its `/health` with a timeout. A process that ended is dead at once; one whose `/health` did not
answer 200 within `probe_timeout_s` for `num_failures` probes in a row is hung, and counts as dead (it is
killed first). One thread does it all: probes go out at once, restarts happen one after the other (the router
first), so a second death waits for the restart under way (up to `ready_timeout_s`).

A dead engine:
  1. is marked failed in the state file (its in-flight requests fail back to their rollouts through the
     router, which record them as `engine_error` infra failures: masked, never trained on); the trainer
     leaves it out of its weight syncs from then on (rl360cli/run/rejoin.py reads the record);
  2. is taken out of the router (`DELETE /workers/{id}`), so the router's own health check cannot put it back
     into rotation while it still holds policy v0;
  3. is started again from its recorded launch (restarts.py `start_again`: the same argv, env, ports and
     node, through the backend's `launch`), same URL;
  4. is taken back into the weight-update group at the trainer's version: the control plane asks for it in
     the engine's record, the trainer does it (it holds the weights: rl360cli/run/rejoin.py) and records the
     version the engine then serves (`StateRejoin`), so it serves the trainer's version before any rollout
     reaches it;
  5. is registered with the router again (`POST /workers`, with the run's key) and waited for there.
A dead router is started again with the engines that are live now as its `--worker-urls`; rollouts whose
request it cut retry that request once (inference/client.py). Each component has `max_restarts`; past it,
it stays failed and the run goes on without it (the engines left serve on).

A component whose node was lost is the backend's to start again (Slurm requeues its tier and starts it
on the node that replaced the lost one: backends/slurm_requeue.py): while its record is marked `restart`,
its node is lost, or its tier is requeueing, the watcher only takes it out of the router and counts no
restart of its own. Once it was started again by someone else (its record's generation changed), the watcher
adopts it: its new URL, a `ready_timeout_s` grace to come up, then the rejoin and the router as after a
restart of its own. The watcher's own marks and restart are compare-and-set on the generation it read: the
node may be found lost only after its restart began, and the requeue's start then stands (the restart is
abandoned, its process stopped), never the other way round. A restart that fails waits 2, 4, 8 ... seconds
before the next.

A watcher never restarts anything of a run that is no longer running, nor a component `rl360 down` stopped.
The record keeps `restarts`, `restarted_at`, `restart_reason` and `served_version`; `rl360 status` shows
them.

Tested by tests/inference/test_health.py (stand-in servers, real processes, the local backend),
tests/loop/test_engine_restart.py (a real run: real engines, the real router, a kill by pid) and
tests/slurm/test_slurm_restart_outlives_trainer.py (the dev Slurm).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import signal
import sys
import threading
import time
import urllib.error
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from rl360cli import events
from rl360cli.backends.base import Observation
from rl360cli.config import load_profile, load_run_recipe
from rl360cli.configload import check_at_least, check_non_negative, check_positive
from rl360cli.errors import Rl360Error
from rl360cli.inference.apikey import optional_api_key
from rl360cli.inference.health import ROUTER_WORKER_TIMEOUT_S, probe, router_forget, router_register
from rl360cli.inference.router import wait_router_workers, with_worker_urls
from rl360cli.outcome import InfraCause
from rl360cli.run.backends import backend_for
from rl360cli.run.restarts import Launcher, RestartedElsewhere, start_again, wait_restarted
from rl360cli.state import queries, transitions
from rl360cli.state.queries import Generation
from rl360cli.state.schema import COMPONENT_FINAL, RUN_ACTIVE, ComponentRecord, ComponentStatus, StateDoc, TierStatus
from rl360cli.state.store import StateFile


@dataclass(frozen=True, kw_only=True, slots=True)
class HealthPolicy:
    """How the watcher tells a dead or hung component, and how often it restarts one."""

    # Seconds between two rounds of probes.
    interval_s: float = 1.0
    # A `/health` that does not answer 200 within this many seconds is a failed probe.
    probe_timeout_s: float = 2.0
    # Failed probes in a row of a process that is still alive before it counts as hung (and is restarted).
    num_failures: int = 3
    # How long a restarted component may take to answer its health URL.
    ready_timeout_s: float = 120.0
    # Restarts of one component in one run; past it, it stays failed.
    max_restarts: int = 5

    def __post_init__(self) -> None:
        check_positive(self, "interval_s", "probe_timeout_s", "ready_timeout_s")
        check_at_least(self, 1, "num_failures")
        check_non_negative(self, "max_restarts")


@dataclass
class Watched:
    """What the watcher knows of one component between two probes."""

    cid: str
    kind: str
    url: str
    failures: int = 0
    last_problem: str = ""
    # An engine started again but not yet at the trainer's version (kept out of the router); a router
    # started again by its backend that has not yet been given the live engines.
    needs_rejoin: bool = False
    given_up: bool = False
    restarts: int = 0
    # Which start of its record it watches (`queries.generation`): another one means someone else started
    # it again.
    generation: Generation | None = None
    # Its node was lost: the backend starts it again (it was taken out of the router and the syncs).
    moving: bool = False
    # Until then a starting process's unanswered probes do not count (monotonic seconds; adopted ones).
    grace_until: float = 0.0
    # No restart of its own before then (monotonic seconds): failed restarts back off.
    next_restart_at: float = 0.0


def restarted_by_backend(doc: StateDoc, rec: ComponentRecord, seen: Observation | None) -> str | None:
    """Why the backend, not the watcher, starts this component again (its node was lost), else None."""
    tier = queries.tier(doc, rec["tier"]) or {}
    if rec.get("restart"):
        return f"{rec.get('reason') or InfraCause.NODE_LOST.value}: the {rec['tier']} tier's recovery starts it again"
    if tier.get("status") == TierStatus.REQUEUEING:
        return f"the {rec['tier']} tier is requeued after {InfraCause.NODE_LOST.value}"
    if rec["status"] == ComponentStatus.STOPPED:
        return None
    # Seen lost now, or recorded so before the tier's requeue began: a restart here would go to the lost node
    # (and, failing, leave a failed record over the one the requeue starts on the new node).
    if (seen is not None and seen.cause == InfraCause.NODE_LOST) or rec.get("cause") == InfraCause.NODE_LOST:
        return f"{InfraCause.NODE_LOST.value}: its tier's recovery starts it again"
    if rec.get("node") and rec["node"] in (tier.get("lost_nodes") or ()):
        return f"its node {rec['node']} was lost: the {rec['tier']} tier's recovery starts it again"
    return None


@dataclass
class HealthWatcher:
    """Watches the run's engines and router; see the module docstring. `check_once()` is one round (tests
    call it directly); `start()` runs rounds on a daemon thread until `stop()`."""

    state: StateFile
    run_id: str
    backend: Launcher
    # The restarted engine's URL in; the policy version it serves once back in the weight-update group out.
    rejoin: Callable[[str], int]
    api_key: str | None = None
    # Told a dead engine's URL at once (the weight broadcast's `mark_restarting`: no sync waits for it).
    forget: Callable[[str], None] | None = None
    policy: HealthPolicy = field(default_factory=HealthPolicy)
    log: Callable[[str], None] = print
    # What it did, in order (for the run's log and for tests): (seconds since start, cid, what).
    history: list[tuple[float, str, str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._watched: dict[str, Watched] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._started = time.monotonic()
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="rl360-health")
        self._watch_the_run()

    # ------------------------------------------------------------------ public

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="rl360-health-watcher", daemon=True)
        self._thread.start()

    def stop(self, *, timeout_s: float = 180.0) -> None:
        """Stop after the round under way (a restart in progress completes, so its engine ends up back)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=timeout_s)
        self._pool.shutdown(wait=False, cancel_futures=True)

    def check_once(self) -> list[str]:
        """One round: probe everything, restart what is dead (the router first: engines register with it)."""
        if not self._run_is_active():
            return []
        done: list[str] = []
        problems, healthy = self._probe_all()
        order = sorted(self._watched.values(), key=lambda w: (w.kind != "router", w.cid))
        for watched in order:
            dead = problems.get(watched.cid)
            if watched.given_up or watched.moving:
                continue
            if dead is not None:
                done += self._restart(watched, dead)
            elif watched.cid in healthy and watched.needs_rejoin:
                done += self._bring_back_engine(watched, reason=None) if watched.kind == "engine" \
                    else self._router_takes_engines(watched)
        return done

    @property
    def watched(self) -> list[str]:
        """The components it watches."""
        return list(self._watched)

    @property
    def router(self) -> Watched | None:
        return next((w for w in self._watched.values() if w.kind == "router"), None)

    # ------------------------------------------------------------------ rounds

    def _run(self) -> None:
        while not self._stop.wait(self.policy.interval_s):
            try:
                self.check_once()
            except Exception as e:  # noqa: BLE001 - the watcher must outlive one bad round; the next one retries
                self.log(f"health watcher: round failed ({type(e).__name__}: {e})")

    def _watch_the_run(self) -> None:
        for cid, rec in queries.run_components(self.state.read(), self.run_id).items():
            if not rec.get("url"):
                continue
            kind = "router" if rec["kind"] == "router" else "engine" if rec["kind"].startswith("engine") else None
            if kind is None or (kind == "engine" and rec["kind"] == "engine-simulated"):
                continue  # simulated engines share processes: one restart would be many
            self._watched[cid] = Watched(cid=cid, kind=kind, url=rec["url"].rstrip("/"),
                                         restarts=int(rec.get("restarts") or 0), generation=queries.generation(rec))

    def _run_is_active(self) -> bool:
        run = queries.run(self.state.read(), self.run_id)
        return run is not None and run["status"] in RUN_ACTIVE

    def _probe_all(self) -> tuple[dict[str, str], set[str]]:
        """cid -> why it is dead, for those that are (their process ended, or it hangs); and the cids whose
        /health answered. A component the backend starts again itself is neither (see `_moving`)."""
        doc = self.state.read()
        records = queries.components(doc)
        live = {cid: records[cid] for cid in self._watched if cid in records}
        seen = self.backend.observe({cid: rec for cid, rec in live.items() if rec["status"] not in COMPONENT_FINAL})
        # Liveness is `/health` for engines and the router alike (the router's `/readiness`, its start-up
        # check, fails while every engine is away: that is no reason to restart the router).
        health_urls = {cid: self._watched[cid].url + "/health" for cid in live}
        answers = dict(zip(health_urls, self._pool.map(
            lambda u: probe(u, timeout_s=self.policy.probe_timeout_s), health_urls.values())))
        dead: dict[str, str] = {}
        healthy: set[str] = set()
        for cid, watched in self._watched.items():
            rec = live.get(cid)
            if rec is None or rec["status"] == ComponentStatus.STOPPED:
                watched.given_up = True  # gone from the state or stopped by `rl360 down`: not ours to restart
                continue
            obs = seen.get(cid)
            why_moving = restarted_by_backend(doc, rec, obs)
            if why_moving is not None:
                self._moving(watched, why_moving)
                continue
            if queries.generation(rec) != watched.generation:
                self._adopt(watched, rec)
                continue  # probed at its old URL this round
            if rec["status"] in COMPONENT_FINAL or (obs is not None and obs.status in COMPONENT_FINAL):
                dead[cid] = (obs.reason if obs is not None and obs.status in COMPONENT_FINAL else rec.get("reason")) \
                    or "its process ended"
                continue
            problem = answers.get(cid)
            if problem is None:
                watched.failures = 0
                healthy.add(cid)
                if rec["status"] == ComponentStatus.STARTING:
                    transitions.mark_ready(self.state, cid, of_generation=watched.generation)
                continue
            if time.monotonic() < watched.grace_until:
                continue  # started again by the backend a moment ago: still loading
            watched.failures += 1
            watched.last_problem = problem
            if watched.failures >= self.policy.num_failures:
                dead[cid] = f"hung: /health {problem}, {watched.failures} probes in a row"
        return dead, healthy

    def _moving(self, watched: Watched, why: str) -> None:
        """Its node was lost: out of the router and the syncs until the backend has started it again."""
        if watched.moving:
            return
        watched.moving = True
        self._note(watched.cid, f"{why}; not restarted here")
        events.record(self.state, stage="serve", action="health", subject=watched.cid, outcome="moving", reason=why)
        if watched.kind == "engine":
            if self.forget is not None:
                self.forget(watched.url)
            self._leave_router(watched)
            watched.needs_rejoin = True

    def _adopt(self, watched: Watched, rec: ComponentRecord) -> None:
        """Started again by someone else (the backend's recovery, `rl360 serve --restart`): watch the new
        process at its (maybe new) URL; an engine rejoins and a router takes the live engines once it answers."""
        if not watched.moving and watched.kind == "engine":  # not seen dead: it may still be in the router
            if self.forget is not None:
                self.forget(watched.url)
            self._leave_router(watched)
        watched.url = (rec.get("url") or watched.url).rstrip("/")
        watched.generation = queries.generation(rec)
        watched.moving = False
        watched.failures = 0
        watched.needs_rejoin = True
        watched.grace_until = time.monotonic() + self.policy.ready_timeout_s
        self._note(watched.cid, f"started again by its backend on {rec.get('node')} ({watched.url})")

    # ------------------------------------------------------------------ restarts

    def _restart(self, watched: Watched, why: str) -> list[str]:
        if not self._run_is_active():  # `rl360 down` (or the run's end) came during this round
            return []
        if time.monotonic() < watched.next_restart_at:
            return []
        if watched.restarts >= self.policy.max_restarts:
            watched.given_up = True
            self._note(watched.cid, f"dead ({why}); {watched.restarts} restarts already, left failed")
            transitions.mark_failed(self.state, watched.cid, of_generation=watched.generation,
                                    reason=f"{why}; not restarted: max_restarts {self.policy.max_restarts} reached")
            return []
        # Compare-and-set from here on: a record started again since this round read it (the tier's requeue
        # after a node loss) is not this watcher's to mark or restart; the next round adopts it.
        if not transitions.mark_failed(self.state, watched.cid, reason=why, of_generation=watched.generation):
            return []
        self._note(watched.cid, f"dead ({why}): restarting")
        events.record(self.state, stage="serve", action="health", subject=watched.cid, outcome="dead", reason=why)
        if watched.kind == "engine":
            if self.forget is not None:
                self.forget(watched.url)
            self._leave_router(watched)
        argv = self._router_argv(watched) if watched.kind == "router" else None
        watched.restarts += 1
        try:
            record = start_again(self.backend, self.state, watched.cid, reason=why, argv=argv, while_run_active=True)
            watched.generation = queries.generation(record)  # its own start, not one to adopt
            wait_restarted(self.backend, self.state, watched.cid, record, timeout_s=self.policy.ready_timeout_s)
        except RestartedElsewhere as e:
            self._note(watched.cid, f"restart abandoned: {e.problem}")
            return []
        except Rl360Error as e:
            watched.next_restart_at = time.monotonic() + 2.0 ** watched.restarts
            self._note(watched.cid, f"restart failed: {e}")
            return []
        watched.failures = 0
        if watched.kind == "router":
            return self._router_back(watched)
        return self._bring_back_engine(watched, reason=why)

    def _bring_back_engine(self, watched: Watched, *, reason: str | None) -> list[str]:
        """Rejoin the weight-update group (the trainer's version), then the router."""
        try:
            version = self.rejoin(watched.url)
        except Exception as e:  # noqa: BLE001 - kept out of rotation; the next round tries again
            watched.needs_rejoin = True
            self._note(watched.cid, f"back, but not in the weight-update group yet ({type(e).__name__}: {e})")
            return []
        watched.needs_rejoin = False
        transitions.record_served_version(self.state, watched.cid, version=version)
        router = self.router
        if router is not None:
            try:
                router_register(self._url_of(router), watched.url, api_key=self.api_key)
            except (Rl360Error, urllib.error.URLError, OSError, ValueError) as e:
                # The router is down: its own restart takes this engine in with the other live ones.
                self._note(watched.cid, f"not registered with the router ({e})")
        self._note(watched.cid, f"back at policy version {version}")
        return [watched.cid]

    def _router_takes_engines(self, router: Watched) -> list[str]:
        """A router started again by its backend (with its recorded engines): it gets the live engines."""
        engines = self._live_engines()
        try:
            for url in engines:
                router_register(self._url_of(router), url, api_key=self.api_key)
        except (Rl360Error, urllib.error.URLError, OSError, ValueError) as e:
            self._note(router.cid, f"back, but not with every engine: {e}")
            return []
        router.needs_rejoin = False
        self._note(router.cid, f"back with {len(engines)} engines")
        return [router.cid]

    def _live_engines(self) -> list[str]:
        return [w.url for w in self._watched.values() if w.kind == "engine" and not w.needs_rejoin
                and not w.given_up and not w.moving and w.failures == 0]

    def _leave_router(self, watched: Watched) -> None:
        router = self.router
        if router is None:
            return
        try:
            router_forget(self._url_of(router), watched.url, api_key=self.api_key)
        except (urllib.error.URLError, OSError, ValueError, KeyError) as e:
            self._note(watched.cid, f"could not take it out of the router ({e})")

    def _router_argv(self, router: Watched) -> list[str] | None:
        """The router's recorded argv with the engines that are live now (and at the trainer's version)."""
        rec = queries.component(self.state.read(), router.cid)
        if rec is None:
            return None
        live = self._live_engines()
        if not live:
            return None
        return with_worker_urls(rec["command"], live)

    def _router_back(self, router: Watched) -> list[str]:
        engines = self._live_engines()
        try:
            wait_router_workers(self._url_of(router), engines, api_key=self.api_key, timeout_s=ROUTER_WORKER_TIMEOUT_S)
        except Rl360Error as e:
            self._note(router.cid, f"back, but not with every engine: {e}")
            return [router.cid]
        self._note(router.cid, f"back with {len(engines)} engines")
        return [router.cid]

    def _url_of(self, watched: Watched) -> str:
        return watched.url

    def _note(self, cid: str, what: str) -> None:
        self.history.append((time.monotonic() - self._started, cid, what))
        self.log(f"health: {cid}: {what}")


# ----------------------------------------------------------------------------- the rejoin, through the state file


@dataclass
class StateRejoin:
    """The control plane's side of a rejoin: the trainer holds the weights, so the control plane asks for the
    rejoin in the engine's record and waits until the trainer has recorded the version the engine serves
    (rl360cli/run/rejoin.py answers). Raises `Rl360Error` past `timeout_s` or when the trainer could not."""

    state: StateFile
    run_id: str
    timeout_s: float = 120.0
    poll_s: float = 0.1

    def __call__(self, url: str) -> int:
        cid = self._engine_at(url)
        transitions.request_rejoin(self.state, cid)
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            rec = queries.component(self.state.snapshot(), cid)
            if rec is None or rec["status"] == ComponentStatus.STOPPED:
                raise Rl360Error(f"{cid} was stopped before it rejoined", "start the run's engines with `rl360 serve`")
            if not rec.get("rejoin_requested_at"):
                if rec.get("served_version") is None:
                    raise Rl360Error(f"the trainer could not take {cid} back: {rec.get('rejoin_error')}",
                                     "see the trainer's log")
                return int(rec["served_version"])
            time.sleep(self.poll_s)
        raise Rl360Error(f"the trainer did not take {cid} back within {self.timeout_s:g}s",
                         "see the trainer's log (it rejoins restarted engines between train steps)")

    def _engine_at(self, url: str) -> str:
        for cid, rec in queries.run_components(self.state.read(), self.run_id).items():
            if (rec.get("url") or "").rstrip("/") == url.rstrip("/"):
                return cid
        raise Rl360Error(f"no engine of run {self.run_id} is at {url}", "see `rl360 status`")


# ----------------------------------------------------------------------------- the component


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rl360cli.run.control")
    parser.add_argument("--state", required=True)
    parser.add_argument("--run", required=True)
    args = parser.parse_args(argv)
    state = StateFile(args.state)
    doc = state.read()
    run, profile_path = queries.run(doc, args.run), queries.profile_path(doc)
    if run is None or profile_path is None:
        log(f"run {args.run} or its cluster profile is not in {args.state}; nothing to watch")
        return 2
    run_dir = Path(run["run_dir"])
    recipe = load_run_recipe(run_dir)
    policy = HealthPolicy(max_restarts=recipe.engine.max_restarts)
    watcher = HealthWatcher(state=state, run_id=args.run, backend=backend_for(load_profile(profile_path), state),
                            rejoin=StateRejoin(state, args.run, timeout_s=policy.ready_timeout_s),
                            api_key=optional_api_key(run_dir), policy=policy, log=log)
    ended = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: ended.set())
    log(f"watching run {args.run}: {', '.join(sorted(watcher.watched)) or 'nothing'}")
    watcher.start()
    ended.wait()
    watcher.stop(timeout_s=10)
    return 0


def log(message: str) -> None:
    print(f"[control] {message}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
