"""Stage `egress`: the egress proxy of the sandboxes' nodes, when the profile's `[egress] mode` is "allow".

On the local backend, one proxy for the machine (`rollout/egress`, `python -m rl360cli.egress.proxy`): it
serves this machine's process sandboxes and the containers of the Docker daemons that run here (the dev
nodes). Its control socket is a short path under /tmp (a unix socket's path is at most 107 bytes), its
per-node cache under the state file's folder. It belongs to the cluster, not to a run: recorded like every
component (`start_component`, through rl360cli/state/transitions.py), kept across runs, stopped by `rl360
down`. Idempotent: a proxy that runs is left alone. `route(ctx)` is what providers are given. A command that
needs the proxy only while it runs (`rl360 tasks check`) uses `for_one_command`: it stops the proxy at its end
when it started it, and leaves one that `rl360 up` (or another command) started running.

On Slurm, a proxy per rollout node is not built yet: the plan refuses `allow` there in one line.

Test: tests/egress/test_egress_stage.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from rl360cli.backends.base import ComponentSpec
from rl360cli.egress.client import EGRESS_COMPONENT, EgressRoute, EgressUnavailable
from rl360cli.errors import Rl360Error, RunFailed
from rl360cli.stages.base import Action, Context, component_is_live, python_argv, start_component
from rl360cli.state import queries, transitions

NAME = "egress"
READY_TIMEOUT_S = 30.0


def applies(ctx: Context) -> bool:
    """Under `[egress] mode = "allow"`, for sandboxes of this machine's (process, docker): Daytona's cloud and the
    simulated provider reach no node's proxy, and `[sandbox] network = "none"` lets no sandbox out at all."""
    recipe = ctx.recipe
    return ctx.profile.egress.mode == "allow" and (recipe is None or (
        recipe.sandbox.provider in ("process", "docker") and recipe.sandbox.network == "task"))


def control_path(ctx: Context) -> Path:
    """The proxy's control socket: /tmp/rl360-egress-<hash of the state file's folder>/control.sock."""
    digest = hashlib.sha256(str(ctx.state.home.absolute()).encode()).hexdigest()[:12]
    return Path(tempfile.gettempdir()) / f"rl360-egress-{digest}" / "control.sock"


def component_spec(ctx: Context) -> ComponentSpec:
    tier, name = EGRESS_COMPONENT.split("/")
    control = control_path(ctx)
    argv = python_argv(ctx, "rl360cli.egress.proxy", "--profile", str(ctx.profile_path), "--control", str(control),
                       "--cache", str(ctx.state.home.absolute() / "egress" / "cache"))
    return ComponentSpec(name=name, tier=tier, stage=NAME, kind="egress", argv=argv, url=f"unix://{control}")


def _check_backend(ctx: Context) -> None:
    if not ctx.backend.on_this_machine:
        raise Rl360Error('[egress] mode = "allow" runs one egress proxy for this machine: the local backend only, '
                         "for now", f'set [egress] mode = "none" (or "open") in {ctx.profile_path}')


def plan(ctx: Context) -> list[Action]:
    _check_backend(ctx)
    spec = component_spec(ctx)
    egress = ctx.profile.egress
    return [Action(stage=NAME, verb="start", subject=spec.id, command=spec.argv,
                   detail=f"the sandboxes' egress proxy: {len(egress.allow)} allowed host patterns, "
                          f"{len(egress.mirrors)} mirrors, a {egress.cache_mb} MB cache, control {spec.url}"
                          + (f", PyPI as of {egress.pypi_as_of}" if egress.pypi_as_of else ""))]


def apply(ctx: Context) -> dict:
    """Start the proxy unless it runs; return its record once its control socket answers."""
    _check_backend(ctx)
    spec = component_spec(ctx)
    record = start_component(ctx, spec)
    way = route(ctx)
    deadline = time.monotonic() + READY_TIMEOUT_S
    while True:
        try:
            asyncio.run(way.stats())
            return record
        except EgressUnavailable as e:
            if time.monotonic() > deadline:
                raise RunFailed(f"{spec.id} did not answer on {way.control} within {READY_TIMEOUT_S:g}s ({e})",
                                f"see its log {record.get('log_path')}") from None
            time.sleep(0.1)


def stop(ctx: Context) -> None:
    """Stop the proxy and forget its record (what `rl360 down` does to every component)."""
    record = queries.component(ctx.state.read(), EGRESS_COMPONENT)
    if record is None:
        return
    for backend, records in queries.by_backend({EGRESS_COMPONENT: record}).items():
        ctx.backend_named(backend).stop(records, grace_s=5.0)
    transitions.forget(ctx.state, components=[EGRESS_COMPONENT])
    ctx.event(NAME, "stop", EGRESS_COMPONENT)


@contextlib.contextmanager
def for_one_command(ctx: Context) -> Iterator[None]:
    """The proxy while one command runs: started unless it runs, stopped at the end only if started here."""
    started_here = not component_is_live(ctx, EGRESS_COMPONENT)
    apply(ctx)
    try:
        yield
    finally:
        if started_here:
            stop(ctx)


def route(ctx: Context) -> EgressRoute:
    """How the profile's sandboxes go out: its `[egress]`, through the proxy the state file records."""
    return EgressRoute.of(ctx.profile.egress, queries.component(ctx.state.read(), EGRESS_COMPONENT))
