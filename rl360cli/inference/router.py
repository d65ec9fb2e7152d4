"""The exact command line of the real sglang-router (pip `sglang-router` 0.3.x, the Rust "SMG") in front of N engines.

Rollouts talk only to the router. It runs on a CPU in the service tier, in
front of real SGLang servers or rl360's local engines alike. Its template is
`stages/sglang-router.toml`: dead engines are taken out of rotation by a
health probe every `router_health_check_interval_s` seconds (one failure is
enough) and by its circuit breaker; a request lost with its engine is not
retried elsewhere (`router_max_retries = 1`) but fails back to the rollout,
which records an `engine_error` infra failure. A dead router is started again by
the trainer's health watcher (health.py) with the engines that are live then
(`with_worker_urls`), and engines it restarted are added back through the
router's worker API (`POST /workers`, `DELETE /workers/{id}`).

When the package is missing this says how to install it; there is no fallback.

    cmd = router_command(engine, worker_urls=["http://127.0.0.1:31001"], host="127.0.0.1", port=31000,
                         prometheus_port=31099, python=sys.executable)

The router's own `/health` answers 200 as soon as it runs; `/readiness` answers
200 once at least one engine is registered and healthy; `/workers` lists the
engines it knows with `is_healthy` (see `router_workers`).

Tested by tests/inference/test_launch.py (golden strings) and test_router.py (the real router).
"""

from __future__ import annotations

import importlib.util
import json
import resource
import time
import urllib.error
import urllib.request
from collections.abc import Sequence

from rl360cli.errors import Rl360Error
from rl360cli.inference.apikey import KEY_PLACEHOLDER
from rl360cli.inference.config import EngineConfig
from rl360cli.inference.keyed_launch import keyed_command
from rl360cli.inference.templates import LaunchCommand, render

ROUTER_MODULE = "sglang_router.launch_router"
# Besides two per request in flight (the client's connection and its own to the engine) and one per
# engine (its health probe), the router's listeners, logs and runtime hold a few dozen file descriptors.
ROUTER_SPARE_FILES = 256


def require_router() -> None:
    """Raise Rl360Error naming the install command when sglang-router is not importable here."""
    if importlib.util.find_spec("sglang_router") is None:
        raise Rl360Error("the sglang-router package is not installed (rollouts reach the engines through it)",
                         "install it with: pip install 'rl360[rollout]'")


def router_command(engine: EngineConfig, *, worker_urls: Sequence[str], host: str, port: int, prometheus_port: int,
                   python: str, api_key_file: str | None = None, worker_startup_timeout_s: int = 600,
                   check_installed: bool = True, max_concurrent_sessions: int | None = None) -> LaunchCommand:
    """The router on host:port in front of `worker_urls`, started by `python` (the interpreter of the node it
    runs on). `check_installed=False` builds it for another machine.

    With `api_key_file` the router requires the run's key from every client (and sends it to the engines):
    `--api-key` of sglang-router 0.3.x does both; `keyed_launch` fills it in from the file on the node.
    With `max_concurrent_sessions`, `keyed_launch` also checks on that node that the router may open the
    files those sessions' generations need (`router_open_files_needed`)."""
    if check_installed:
        require_router()
    if not worker_urls:
        raise Rl360Error("the router needs at least one engine URL", "set [engine] num_engines >= 1")
    values = {
        "python": python,
        "host": host,
        "port": port,
        "worker_urls": list(worker_urls),
        "policy": engine.router_policy,
        "api_key": KEY_PLACEHOLDER if api_key_file else None,
        "prometheus_port": prometheus_port,
        "health_check_interval_s": engine.router_health_check_interval_s,
        "health_check_timeout_s": max(1, min(5, engine.router_health_check_interval_s)),
        "max_retries": engine.router_max_retries,
        "request_timeout_s": engine.router_request_timeout_s,
        "worker_startup_timeout_s": worker_startup_timeout_s,
    }
    need = None if max_concurrent_sessions is None else router_open_files_needed(engine, max_concurrent_sessions)
    return keyed_command(render("sglang-router", values), api_key_file=api_key_file, python=python,
                         min_open_files=need)


def generations_in_flight(engine: EngineConfig, max_concurrent_sessions: int) -> int:
    """The most generate requests the rollout tier keeps open through the router: one per session, and no
    more than the engines run at once (more would only wait in the engines' queues, each holding two of
    the router's file descriptors all the while)."""
    return min(engine.num_engines * engine.max_batch_size, max_concurrent_sessions)


def router_open_files_needed(engine: EngineConfig, max_concurrent_sessions: int) -> int:
    """File descriptors the router needs: two per generation in flight, one per engine, and spares."""
    return 2 * generations_in_flight(engine, max_concurrent_sessions) + engine.num_engines + ROUTER_SPARE_FILES


def check_router_open_files(engine: EngineConfig, max_concurrent_sessions: int, *,
                            hard_limit: int | None = None) -> None:
    """Refuse a run whose generations in flight need more file descriptors than the router may open here.

    Past its limit the router cannot reach the engines: its circuit breakers open and every request
    fails as an engine error (masked, but the step is lost). `hard_limit` defaults to this process's
    (the components' supervisor raises their soft limit to it). On other nodes the router's launcher
    checks its own node (`keyed_launch --min-open-files`)."""
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1] if hard_limit is None else hard_limit
    in_flight = generations_in_flight(engine, max_concurrent_sessions)
    need = router_open_files_needed(engine, max_concurrent_sessions)
    if hard != resource.RLIM_INFINITY and hard < need:
        raise Rl360Error(f"the router needs ~{need:,} open files for {in_flight:,} generations in flight and "
                         f"this machine allows {hard:,}",
                         "raise the hard limit (`ulimit -Hn`, /etc/security/limits.conf), or lower "
                         "[rollout] max_concurrent_sessions or [engine] max_batch_size")


def router_ready_url(host: str, port: int) -> str:
    """200 once the router has at least one healthy engine (its /health only says the router process is up)."""
    return f"http://{host}:{port}/readiness"


def router_workers(router_url: str, *, api_key: str | None = None, timeout_s: float = 5.0) -> dict[str, bool]:
    """The engines the router knows, by URL, and whether it currently counts each as healthy."""
    request = urllib.request.Request(router_url.rstrip("/") + "/workers")
    if api_key:
        request.add_header("Authorization", f"Bearer {api_key}")
    with urllib.request.urlopen(request, timeout=timeout_s) as reply:
        data = json.load(reply)
    return {w["url"]: bool(w.get("is_healthy")) for w in data.get("workers", [])}


def wait_router_workers(router_url: str, healthy: Sequence[str], *, unhealthy: Sequence[str] = (),
                        api_key: str | None = None, timeout_s: float = 120.0) -> dict[str, bool]:
    """Wait until the router counts every URL of `healthy` as healthy and none of `unhealthy` as healthy."""
    deadline = time.monotonic() + timeout_s
    seen: dict[str, bool] = {}
    while True:
        try:
            seen = router_workers(router_url, api_key=api_key)
            if all(seen.get(u) for u in healthy) and not any(seen.get(u) for u in unhealthy):
                return seen
        except (urllib.error.URLError, OSError, ValueError):
            pass
        if time.monotonic() > deadline:
            raise Rl360Error(f"the router at {router_url} did not reach the expected engines in {timeout_s:g}s "
                             f"(it sees {seen})", "see the router's and the engines' logs")
        time.sleep(0.25)


def with_worker_urls(argv: Sequence[str], worker_urls: Sequence[str]) -> list[str]:
    """`argv` of a router launch with its `--worker-urls` values replaced by `worker_urls` (a router restarted by
    the health watcher starts with the engines that are live now, not with those it started with)."""
    if not worker_urls:
        raise Rl360Error("the router needs at least one engine URL", "restart an engine first")
    argv = list(argv)
    if "--worker-urls" not in argv:
        raise Rl360Error("the router's recorded command has no --worker-urls", "start it again with `rl360 serve`")
    start = argv.index("--worker-urls") + 1
    end = start
    while end < len(argv) and not argv[end].startswith("--"):
        end += 1
    return [*argv[:start], *worker_urls, *argv[end:]]
