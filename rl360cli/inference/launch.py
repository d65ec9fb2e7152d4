"""What the `serve` stage starts: the engines and the router as ComponentSpecs, and where to probe them.

    ports = serve_ports(profile.base_port, engine.num_engines)
    specs = [engine_spec(engine, index=i, model_path=model_dir, host="127.0.0.1", port=p, run=run_id,
                         python=backend.python)
             for i, p in enumerate(ports.engines)]
    specs.append(router_spec(engine, worker_urls=[s.health_url.removesuffix("/health") for s in specs],
                             host="127.0.0.1", port=ports.router, prometheus_port=ports.router_metrics,
                             python=backend.python))

Each spec's `health_url` answers 200 once the component is ready (an engine
once its model is loaded; the router once it has a healthy engine; then
`rl360cli.inference.router.wait_router_workers` waits for all of them). The argv comes from the
launch templates in `stages/` (see templates.py). Every command starts with `python`, the interpreter of
the node it runs on (the backend's, `Backend.python`), never simply the one rendering it.
Tested by tests/inference/test_launch.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rl360cli.backends.base import ComponentSpec
from rl360cli.inference.config import DEFAULT_PREFIX_CACHE_MB, EngineConfig
from rl360cli.inference.keyed_launch import keyed_command
from rl360cli.inference.router import router_command, router_ready_url
from rl360cli.inference.sglang import sglang_server_command
from rl360cli.inference.templates import LaunchCommand, render


@dataclass(frozen=True, slots=True)
class ServePorts:
    router: int
    router_metrics: int
    engines: tuple[int, ...]


def serve_ports(base_port: int, num_engines: int) -> ServePorts:
    """The router on base_port, its metrics on base_port + 1, engines from base_port + 2 on."""
    return ServePorts(router=base_port, router_metrics=base_port + 1,
                      engines=tuple(base_port + 2 + i for i in range(num_engines)))


def http_url(host: str, port: int) -> str:
    return f"http://{host}:{port}"


def health_url(host: str, port: int) -> str:
    """Engines (local and SGLang) and the router all answer GET /health with 200 when ready."""
    return f"{http_url(host, port)}/health"


def engine_command(engine: EngineConfig, *, model_path: str, host: str, port: int, python: str,
                   weight_version: int = 0, api_key_file: str | None = None, dtype: str = "float32",
                   seed: int = 0) -> LaunchCommand:
    """The command line of one engine of `engine.kind` (local CPU engine or real SGLang).

    `api_key_file`: the engine requires the key in that file (`rl360cli.inference.apikey`); the command names
    the file, never the key."""
    if engine.kind == "sglang":
        return sglang_server_command(engine, model_path=model_path, host=host, port=port,
                                     weight_version=weight_version, api_key_file=api_key_file, dtype=dtype,
                                     seed=seed, python=python)
    values = {
        "python": python,
        "model_path": model_path,
        "host": host,
        "port": port,
        "max_batch_size": engine.max_batch_size,
        "max_wait_ms": engine.max_wait_ms,
        "weight_version": weight_version,
        "dtype": dtype,
        "seed": seed,
        "num_threads": engine.num_threads or None,
        "prefix_cache_mb": engine.prefix_cache_mb if engine.prefix_cache_mb != DEFAULT_PREFIX_CACHE_MB else None,
        # The CPU is the engine's default: the flag is written only for a GPU.
        "device": engine.device if engine.device != "cpu" else None,
        "static_kv": "" if engine.static_kv else None,  # a bare flag
        "dist_timeout_s": engine.weight_sync_timeout_s,
        # rl360's engine reads the key file itself: the key is never on its command line.
        "api_key_file": api_key_file,
        # Loopback engines keep their gloo traffic on lo.
        "gloo_ifname": "lo" if host.startswith("127.") else None,
    }
    # Only `<node address>` can need filling in on the node here.
    return keyed_command(render("local-engine", values), api_key_file=None, python=python)


def engine_spec(engine: EngineConfig, *, index: int, model_path: str, host: str, port: int, python: str,
                run: str | None = None, tier: str = "rollout", stage: str = "serve", node: str | None = None,
                weight_version: int = 0, api_key_file: str | None = None, dtype: str = "float32", seed: int = 0,
                url_host: str | None = None) -> ComponentSpec:
    """One engine listening on host:port; `url_host` is how others reach it when `host` is filled in on its node."""
    cmd = engine_command(engine, model_path=model_path, host=host, port=port, weight_version=weight_version,
                         api_key_file=api_key_file, dtype=dtype, seed=seed + index, python=python)
    return ComponentSpec(name=f"engine-{index}", tier=tier, stage=stage, kind=f"engine-{engine.kind}",
                         argv=cmd.argv, env=cmd.env, ports={"http": port}, run=run, node=node,
                         health_url=health_url(url_host or host, port))


def router_spec(engine: EngineConfig, *, worker_urls: Sequence[str], host: str, port: int, prometheus_port: int,
                python: str, run: str | None = None, tier: str = "service", stage: str = "serve",
                node: str | None = None, api_key_file: str | None = None, url_host: str | None = None,
                max_concurrent_sessions: int | None = None) -> ComponentSpec:
    cmd = router_command(engine, worker_urls=worker_urls, host=host, port=port, prometheus_port=prometheus_port,
                         api_key_file=api_key_file, max_concurrent_sessions=max_concurrent_sessions, python=python)
    # Ready once it has a healthy engine (its /health is up as soon as the process is);
    # `wait_router_workers` then waits for all of them.
    return ComponentSpec(name="router", tier=tier, stage=stage, kind="router", argv=cmd.argv, env=cmd.env,
                         ports={"http": port, "metrics": prometheus_port}, run=run, node=node,
                         health_url=router_ready_url(url_host or host, port))
