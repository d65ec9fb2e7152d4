"""Stage `egress`: the egress proxies of the sandboxes' nodes, when the profile's `[egress] mode` is "allow".

A proxy (`python -m rl360cli.egress.proxy`) serves the sandboxes of its own node only: it enters their network
namespaces, as root there, by the pid a node-local daemon (a unix:// socket) or process provider gives. So:
- local backend: one proxy for the machine, `rollout/egress`. It serves this machine's process sandboxes and the
  containers of the Docker daemons that run here (the dev nodes). Its control socket is a short path under /tmp
  (a unix socket's path is at most 107 bytes), its cache (and CA) under the state file's folder.
- Slurm: one proxy per rollout node, `rollout/egress-<node>`, a job step on that node (pinned there, as `serve`
  pins engines). Its control socket, cache and CA are in a node-local folder, /tmp/rl360-egress-<hash>-{node}/,
  `{node}` filled in on the node with its name (SLURMD_NODENAME; hashed past 32 characters, a unix socket's path
  holding at most 107 bytes): the dev cluster's fake nodes share one machine's /tmp. The session actors run on
  the rollout nodes (Ray workers started as steps there) and each fills in its own node the same way
  (`EgressRoute.on_node`), so an actor and its node's proxy meet also once a requeue has moved both to a node
  that replaced theirs. An actor on a node whose proxy does not answer fails its network tasks' starts (infra
  cause `sandbox_start`, one line naming the node), never opening the network.
- Docker nodes reached over ssh:// (or tcp://) are on no proxy's node: their network tasks get no network
  (`network_denied`); `rl360 plan` says so in one line.

A proxy belongs to the cluster, not to a run: recorded like every component (`start_component`, through
rl360cli/state/transitions.py), kept across runs, stopped by `rl360 down`. Idempotent: a proxy that runs is left
alone, unless the profile's `[egress]` changed since it started (it reads the table once, at start; its record
keeps a digest of it): then it is started again with the new one, except while another run or another command
that runs may use it: that is refused in one line (restarting it cut the first command's apt-get in an image build).
Ready once it has written its ready file (beside its log, in the run root every node sees) after its control socket
listens: a node's socket is out of this machine's reach. `route(ctx)` is what providers are given. A command that
needs the proxy only while it runs (`rl360 tasks check`, `rl360 agents try`; local backend only: its sandboxes are
this machine's) uses `for_one_command`: it holds the proxy (its pid and start time in the proxy's record, so a dead
holder counts for nothing), and the last live holder to leave stops a proxy that was started for commands, unless a
run is under way; one `rl360 up` started or took is left running. Commands start, join, leave and stop it one at a
time (an flock beside the state file).

Test: tests/egress/test_egress_stage.py; tests/slurm/test_slurm_egress.py (a proxy per rollout node of the dev
Slurm cluster, a sandbox on one going out through it).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from rl360cli import procinfo
from rl360cli.backends.base import ComponentSpec
from rl360cli.egress.client import EGRESS_COMPONENT, EGRESS_KIND, NODE_FIELD, EgressRoute, on_node_path
from rl360cli.egress.config import EgressConfig
from rl360cli.errors import Rl360Error
from rl360cli.stages.base import Action, Context, component_is_live, log_path, python_argv, start_components
from rl360cli.state import queries, transitions
from rl360cli.state.schema import HolderRecord, now_iso

NAME = "egress"
READY_TIMEOUT_S = 60.0
CONTROL = "control.sock"
# Where a proxy on a Slurm node keeps its socket, cache and CA: on the node itself.
NODE_TMP = "/tmp"
# In a proxy's environment (so in its record): the digest of the [egress] table it was started with.
SETTINGS_ENV = "RL360_EGRESS_SETTINGS"


def applies(ctx: Context) -> bool:
    """Under `[egress] mode = "allow"`, for sandboxes of this machine's (process, docker): Daytona's cloud and the
    simulated provider reach no node's proxy, and `[sandbox] network = "none"` lets no sandbox out at all."""
    recipe = ctx.recipe
    return ctx.profile.egress.mode == "allow" and (recipe is None or (
        recipe.sandbox.provider in ("process", "docker") and recipe.sandbox.network == "task"))


def proxy_folder(home: Path, *, on_nodes: bool = False) -> Path:
    """The folder of a proxy's control socket: `rl360-egress-<hash of the state file's folder>` in this machine's
    temp folder; for the proxies of the nodes, `-{node}` more, in the node's own /tmp (`{node}` is filled in on the
    node: `on_node_path`)."""
    digest = hashlib.sha256(str(home.absolute()).encode()).hexdigest()[:12]
    if on_nodes:
        return Path(NODE_TMP) / f"rl360-egress-{digest}-{NODE_FIELD}"
    return Path(tempfile.gettempdir()) / f"rl360-egress-{digest}"


def control_path(ctx: Context) -> Path:
    """The machine's proxy's control socket (local backend)."""
    return proxy_folder(ctx.state.home) / CONTROL


def _nodes(ctx: Context) -> tuple[list[str], bool]:
    """The rollout tier's nodes and whether they are real names: Slurm's once the tier holds them, else their
    places (`rollout[1]`), as `rl360 plan` shows them."""
    nodes = queries.tier_nodes(ctx.state.read(), "rollout")
    if nodes:
        return nodes, True
    return [f"rollout[{i}]" for i in range(ctx.profile.tiers["rollout"].num_nodes)], False


def component_specs(ctx: Context) -> list[ComponentSpec]:
    """The machine's proxy (local backend), or one per rollout node (Slurm), all with the same command: its paths
    name `{node}`, which each fills in with its own."""
    home = ctx.state.home.absolute()
    env = {SETTINGS_ENV: settings_digest(ctx.profile.egress)}
    if ctx.backend.on_this_machine:
        tier, name = EGRESS_COMPONENT.split("/")
        return [_spec(ctx, tier=tier, name=name, node=None, control=control_path(ctx),
                      cache=home / "egress" / "cache", env=env)]
    nodes, known = _nodes(ctx)
    folder = proxy_folder(home, on_nodes=True)
    return [_spec(ctx, tier="rollout", name=f"{NAME}-{node}", node=node if known else None, control=folder / CONTROL,
                  cache=folder / "cache", env=env) for node in nodes]


def _spec(ctx: Context, *, tier: str, name: str, node: str | None, control: Path, cache: Path,
          env: dict[str, str]) -> ComponentSpec:
    ready = log_path(ctx, tier=tier, name=name, run=None).with_suffix(".ready.json")
    argv = python_argv(ctx, "rl360cli.egress.proxy", "--profile", str(ctx.profile_path.absolute()), "--control",
                       str(control), "--cache", str(cache), "--ready", str(ready))
    return ComponentSpec(name=name, tier=tier, stage=NAME, kind=EGRESS_KIND, argv=argv, url=f"unix://{control}",
                         node=node, ready_file=str(ready), env=env)


def settings_digest(config: EgressConfig) -> str:
    """A digest of an `[egress]` table as loaded: what tells that a running proxy's settings are not the profile's."""
    text = json.dumps(dataclasses.asdict(config), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def ssh_note(ctx: Context) -> str | None:
    """What `rl360 plan` says of the profile's Docker nodes that no proxy can hold (reached over ssh:// or tcp://),
    when the sandboxes may be containers."""
    remote = [n.name for n in ctx.profile.nodes if not n.docker_host.startswith("unix://")]
    if not remote or (ctx.recipe is not None and ctx.recipe.sandbox.provider != "docker"):
        return None
    return (f"Docker node{'s' if len(remote) > 1 else ''} {', '.join(remote)}: reached over ssh:// or tcp://, on no "
            "proxy's node (a proxy enters the namespaces of its own node's containers), so network tasks there get "
            "no network (network_denied)")


def plan(ctx: Context) -> list[Action]:
    egress = ctx.profile.egress
    what = (f"{len(egress.allow)} allowed host patterns, {len(egress.mirrors)} mirrors, a {egress.cache_mb} MB cache"
            + (f", PyPI as of {egress.pypi_as_of}" if egress.pypi_as_of else ""))
    actions = []
    for spec in component_specs(ctx):
        node = spec.name.removeprefix(f"{NAME}-")
        whose = "the sandboxes' egress proxy" if ctx.backend.on_this_machine else \
            f"the egress proxy of {node}'s sandboxes, on {node}"
        actions.append(Action(stage=NAME, verb="start", subject=spec.id, command=spec.argv,
                              detail=f"{whose}: {what}, control {on_node_path(spec.url or '', node)}"))
    if note := ssh_note(ctx):
        actions.append(Action(stage=NAME, verb="note", subject="ssh:// nodes", detail=note))
    return actions


def apply(ctx: Context) -> list[dict]:
    """Start each proxy that does not run (on Slurm, once the rollout tier holds its nodes); return their records
    once each listens on its control socket. They are the cluster's from now on: kept until `rl360 down`, whichever
    command that holds them leaves."""
    if not ctx.backend.on_this_machine and not _nodes(ctx)[1]:
        raise Rl360Error("the egress proxies run on the rollout tier's nodes, and it holds none",
                         "provision the tiers first (`rl360 provision` or `rl360 up`)")
    specs = component_specs(ctx)
    with _one_command_at_a_time(ctx):
        _stop_if_settings_changed(ctx)
        records = start_components(ctx, specs, ready_timeout_s=READY_TIMEOUT_S)
        transitions.keep_for_cluster(ctx.state, [spec.id for spec in specs])
    return records


@contextlib.contextmanager
def _one_command_at_a_time(ctx: Context) -> Iterator[None]:
    """Commands start, join, leave and stop the proxies one at a time (an flock beside the state file): a command
    that finds the proxy live never meets it stopped by one that saw itself as its last holder a moment before."""
    lock = ctx.state.path.with_name("egress.lock")
    lock.parent.mkdir(parents=True, exist_ok=True)
    with lock.open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def _stop_if_settings_changed(ctx: Context) -> bool:
    """Stop the running proxies that were started with another `[egress]` (the caller starts them again with this
    one); True if it did. Refused while another run is under way or another command that runs holds them: their
    sandboxes may be attached to them, an apt-get in their build going through."""
    digest = settings_digest(ctx.profile.egress)
    doc = ctx.state.read()
    changed = {cid: rec for cid, rec in queries.components_of_kind(doc, EGRESS_KIND).items()
               if (rec.get("env") or {}).get(SETTINGS_ENV) != digest and component_is_live(ctx, cid)}
    if not changed:
        return False
    users = [f"run {run}" for run in sorted(queries.active_runs(doc)) if run != ctx.run_id]
    users += [f"`{h['command']}` (pid {h['pid']})" for rec in changed.values() for h in queries.live_holders(rec)]
    if users:
        raise Rl360Error(f"the egress proxy runs with another [egress] than {ctx.profile_path.name}'s, for "
                         f"{users[0]}, which still uses it",
                         f"wait for it to end, give this command its own state file (RL360_STATE=/other/"
                         f"state.json), or the same [egress]")
    ctx.say("egress: the profile's [egress] changed since the proxies started; starting them again with it")
    _stop(ctx, changed, reason="[egress] changed")
    return True


def stop(ctx: Context) -> None:
    """Stop every proxy and forget their records (what `rl360 down` does to every component)."""
    _stop(ctx, queries.components_of_kind(ctx.state.read(), EGRESS_KIND))


def _stop(ctx: Context, records: dict[str, dict], **detail) -> None:
    for backend, mine in queries.by_backend(records).items():
        ctx.backend_named(backend).stop(mine, grace_s=5.0)
    transitions.forget(ctx.state, components=list(records))
    for cid in records:
        ctx.event(NAME, "stop", cid, **detail)


@contextlib.contextmanager
def for_one_command(ctx: Context, *, command: str) -> Iterator[None]:
    """The machine's proxy while `command` runs: started unless it runs, and held (its pid in the proxy's record)
    until the command ends. A proxy started for commands is stopped when the last live one that holds it leaves and
    no run is under way; one `rl360 up` started or took is left running. Local backend only: the command's
    sandboxes are this machine's, and on Slurm no proxy runs here."""
    if not ctx.backend.on_this_machine:
        raise Rl360Error('this command runs its sandboxes on this machine, and under [egress] mode = "allow" a Slurm '
                         "profile runs egress proxies on its rollout nodes only",
                         f"use a local profile with the same [egress] and [[nodes]], or set [egress] mode = "
                         f'"none" (or "open") in {ctx.profile_path}')
    pid = os.getpid()
    holder: HolderRecord = {"pid": pid, "start_time": procinfo.start_time(pid), "command": command, "since": now_iso()}
    with _one_command_at_a_time(ctx):
        started = not component_is_live(ctx, EGRESS_COMPONENT) or _stop_if_settings_changed(ctx)
        start_components(ctx, component_specs(ctx), ready_timeout_s=READY_TIMEOUT_S)
        transitions.hold_component(ctx.state, EGRESS_COMPONENT, holder, started=started)
    try:
        yield
    finally:
        with _one_command_at_a_time(ctx):
            if (transitions.release_component(ctx.state, EGRESS_COMPONENT, holder)
                    and not queries.active_runs(ctx.state.read())):
                stop(ctx)


def route(ctx: Context) -> EgressRoute:
    """How the profile's sandboxes go out: its `[egress]`, through the proxies the state file records."""
    return EgressRoute.recorded(ctx.profile.egress, ctx.state.read())
