"""A step's scale figures (issue 11 item 5), merged from the session actors' running counters.

    gauges = StepGauges(rollouts.actors)      # the first interval starts here
    row.update(gauges.take())                 # once a step: the figures since the last take

Each actor counts as things happen (rl360cli/rollout/session_actor.py `take_gauges`, with its
admission controller's rl360cli/sandbox/waves.py `take_gauges`) and hands over one small dict of
counters; `take` asks every actor at once (one `ray.get` over one ref each), adds the dicts up, and
reads the router's own request counter from its Prometheus listener. Its cost is O(actors) plus one
HTTP GET, whatever the number of sessions; no trajectory crosses.

An interval runs from one take to the next: with overlap it holds the end of one step's generation and
the start of the next. The figures (docs/operations.md, "Scale figures"):

- `sessions_in_flight_max` / `_mean`: sessions holding a slot. The max adds up each actor's peak (an
  upper bound of the peak at one instant: the actors start a step's sessions together); the mean is
  time-weighted, exact.
- `admission_queue_max` / `_mean`: sandbox starts waiting for admission (peaks added up likewise);
  `admission_wait_mean_s` / `_p99_s` / `_max_s`: how long the starts admitted in the interval waited
  (the p99 to within 5%, from merged histograms).
- `pulls_in_flight_max` against `pull_cap`: image pulls in flight, each actor's peak (sampled every
  `PULL_SAMPLE_S`) added up, against the caps the actors' providers enforce added up; None from a
  provider that does not report its pulls.
- `warm_start_ratio`: sandbox starts whose node's cache held the image, of all that started.
- `actor_cpu_s` and `actor_cpu_s_per_1k_sessions` (per 1,000 sessions ended), `actor_memory_peak_mb`
  and `actor_memory_mb_per_1k_in_flight` (per 1,000 of `sessions_in_flight_max`): the session actors;
  `driver_cpu_s`: this process (the loop).
- `router_requests_per_s`, with `router_rps_source`: "router" (its Prometheus counter
  `smg_router_requests_total`, the generate requests it routed) or "actors" (the generate requests the
  actors sent, when the router's metrics cannot be read); `actor_requests_per_s` always.
- `gauges_take_s`: what this collection cost the loop (the actors' round trip and the router's GET).
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from rl360cli.inference.launch import serve_ports
from rl360cli.metrics import merged_quantile
from rl360cli.rollout.session_actor import cpu_seconds

# The router's request counter: sglang-router 0.3.x's "SMG" names (older routers used `sgl_router_`).
ROUTER_COUNTERS = ("smg_router_requests_total", "sgl_router_requests_total")


class StepGauges:
    """See the module docstring. `router_metrics_url` defaults to where `rl360 serve` puts the router's
    Prometheus listener (its port + 1, rl360cli/inference/launch.py `serve_ports`)."""

    def __init__(self, actors: list, *, router_metrics_url: str | None = None, timeout_s: float = 2.0):
        self.actors = list(actors)
        self.timeout_s = timeout_s
        first = self._ask_actors()  # resets their counters (once they are up): the first interval starts now
        self._since = time.monotonic()
        self._driver_cpu = cpu_seconds()
        router_url = next((f["router_url"] for f in first if f.get("router_url")), None)
        self.router_metrics_url = router_metrics_url or (metrics_url_of(router_url) if router_url else None)
        self._router_count = self._router_requests()

    def take(self) -> dict[str, Any]:
        """The figures since the last take (or since this object was made); {} without actors."""
        if not self.actors:
            return {}
        began = time.perf_counter()
        taken = self._ask_actors()
        now, driver_cpu, router_count = time.monotonic(), cpu_seconds(), self._router_requests()
        seconds = max(now - self._since, 1e-9)
        figures = merge(taken, seconds=seconds)
        figures["driver_cpu_s"] = driver_cpu - self._driver_cpu
        routed = router_count - self._router_count if None not in (router_count, self._router_count) else None
        # A counter that stood still while the actors sent requests is not the one this router keeps.
        if routed is not None and (routed > 0 or figures["actor_requests_per_s"] == 0):
            figures["router_requests_per_s"] = max(0.0, routed) / seconds
            figures["router_rps_source"] = "router"
        else:
            figures["router_requests_per_s"] = figures["actor_requests_per_s"]
            figures["router_rps_source"] = "actors"
        self._since, self._driver_cpu, self._router_count = now, driver_cpu, router_count
        figures["gauges_take_s"] = time.perf_counter() - began  # what collecting them cost the loop
        return figures

    def _ask_actors(self) -> list[dict]:
        """Each live actor's figures. One that died or is being started again (its process killed, its node
        lost: Ray restarts it) has none to give: its interval's figures are lost, and the step goes on."""
        import ray
        from ray.exceptions import ActorUnavailableError, RayActorError

        asked = [actor.take_gauges.remote() for actor in self.actors]
        figures = []
        for ref in asked:
            try:
                figures.append(ray.get(ref))
            except (RayActorError, ActorUnavailableError):
                continue
        return figures

    def _router_requests(self) -> float | None:
        if self.router_metrics_url is None:
            return None
        try:
            with urllib.request.urlopen(self.router_metrics_url, timeout=self.timeout_s) as reply:
                return router_requests(reply.read().decode(errors="replace"))
        except (OSError, urllib.error.URLError, ValueError):
            return None


def merge(taken: list[dict], *, seconds: float) -> dict[str, Any]:
    """The figures of an interval of `seconds` from each actor's `take_gauges()`."""
    sessions = [t["sessions"] for t in taken]
    admission = [t["admission"] for t in taken if t.get("admission")]
    waits = [a["queue_wait_s"] for a in admission]
    waited = sum(w["count"] for w in waits)
    warm = sum(a["warm_starts"] for a in admission)
    started = warm + sum(a["cold_starts"] for a in admission)
    pulls = [t for t in taken if t.get("pulls_in_flight_max") is not None]
    in_flight_max = sum(s["max"] for s in sessions)
    done = sum(t["sessions_done"] for t in taken)
    cpu = sum(t["cpu_s"] for t in taken)
    memory = [t["memory_peak_mb"] for t in taken if t.get("memory_peak_mb") is not None]
    requests = sum(t["generate_requests"] for t in taken)
    return {
        "gauge_interval_s": seconds,
        "sessions_in_flight_max": in_flight_max,
        "sessions_in_flight_mean": sum(s["mean"] for s in sessions),
        "sessions_done": done,
        "admission_queue_max": sum(a["queue"]["max"] for a in admission) if admission else None,
        "admission_queue_mean": sum(a["queue"]["mean"] for a in admission) if admission else None,
        "admission_wait_mean_s": sum(w["sum"] for w in waits) / waited if waited else None,
        "admission_wait_p99_s": merged_quantile(waits, 0.99),
        "admission_wait_max_s": max(w["max"] for w in waits) if waited else None,
        "pulls_in_flight_max": sum(t["pulls_in_flight_max"] for t in pulls) if pulls else None,
        "pull_cap": sum(t["pull_cap"] for t in pulls) if pulls else None,
        "sandbox_starts": started,
        "sandbox_failed_starts": sum(a["failed_starts"] for a in admission),
        "warm_start_ratio": warm / started if started else None,
        "actor_cpu_s": cpu,
        "actor_cpu_s_per_1k_sessions": cpu / done * 1000 if done else None,
        "actor_memory_peak_mb": sum(memory) if memory else None,
        "actor_memory_mb_per_1k_in_flight": sum(memory) / in_flight_max * 1000 if memory and in_flight_max else None,
        "actor_memory_peak_is_lifetime": any(t.get("memory_peak_is_lifetime") for t in taken),
        "actor_requests_per_s": requests / seconds,
    }


def metrics_url_of(router_url: str) -> str:
    """The router's Prometheus listener as `rl360 serve` starts it: its host, its port + 1 (`serve_ports`)."""
    parts = urlsplit(router_url)
    port = serve_ports(parts.port or 80, 0).router_metrics
    return urlunsplit((parts.scheme or "http", f"{parts.hostname}:{port}", "/metrics", "", ""))


def router_requests(text: str) -> float:
    """The generate requests the router counted (`smg_router_requests_total{endpoint="generate"}`, its
    other labels added up) in its Prometheus text: 0 when the text has no such counter (the router
    makes it on its first request). Other endpoints (the weight sync's pause and continue) are left out."""
    total = 0.0
    for line in text.splitlines():
        if (line.split("{", 1)[0].split(" ", 1)[0] in ROUTER_COUNTERS
                and ("endpoint=" not in line or 'endpoint="generate"' in line)):
            total += float(line.rsplit(" ", 1)[1])
    return total
