"""Stage `serve`: the run's policy version 0, its engines on the rollout tier, the router in front.

The policy is prepared once per run (a tiny model is built and warmed up; a
pretrained one is converted or linked) into `<run>/policy/v0`. The engines —
rl360's CPU engine or real SGLang servers — load it and answer SGLang's HTTP
API; the real sglang-router on the service tier spreads the rollouts over
them. Idempotent: components of this run that already run are left alone.

No open doors: every engine and the router require the run's API key, made
here once (`<run>/api-key`, mode 0600, see rl360cli.inference.apikey) and
never printed — commands show `<api-key file>` where it goes. They listen on
the profile's `bind_host`; a wildcard there (0.0.0.0, ::) means each node's own
cluster address, filled in on the node (`<node address>` in the plan), never
every interface of the node.

Coming back: each record keeps what started it (argv, env, ports, node), so a dead
engine or router can be started again exactly so. The run's control plane, started
here beside the router, does that by itself (rl360cli/run/control.py); `restart(ctx,
cid)` does it by hand, through the same `relaunch_component` and the same backend
`launch` (a supervised subprocess locally, a job step on Slurm).
"""

from __future__ import annotations

import contextlib
import dataclasses
import socket
from pathlib import Path

from rl360cli.backends.base import ComponentSpec
from rl360cli.backends.slurm_placement import placement
from rl360cli.config import run_policy_dir
from rl360cli.errors import Rl360Error
from rl360cli.inference.apikey import api_key_path, create_api_key, optional_api_key, read_api_key
from rl360cli.inference.health import router_forget, router_register
from rl360cli.inference.keyed_launch import NODE_ADDRESS, WILDCARD_HOSTS, node_address
from rl360cli.inference.launch import engine_spec, router_spec, serve_ports
from rl360cli.inference.router import check_router_open_files, wait_router_workers
from rl360cli.run.policy import prepare_policy
from rl360cli.run.restarts import relaunch_component
from rl360cli.stages.base import Action, Context, component_is_live, python_argv, start_component, start_components
from rl360cli.stages.train import thread_env
from rl360cli.state import queries

NAME = "serve"


def applies(ctx: Context) -> bool:
    return ctx.recipe is not None


def policy_dir(ctx: Context) -> Path:
    return run_policy_dir(ctx.run_dir)


def api_key_file(ctx: Context) -> Path:
    return api_key_path(ctx.run_dir)


def listen_host(ctx: Context) -> str:
    """The address engines and the router bind: `bind_host`, or for a wildcard each node's own address."""
    host = ctx.profile.bind_host
    if host not in WILDCARD_HOSTS:
        return host
    # One machine: its address now. A cluster: the node's, once the component starts there.
    return node_address() if ctx.backend.on_this_machine else NODE_ADDRESS


def _node_names(ctx: Context) -> tuple[list[str], str, bool]:
    """Per engine the node it runs on, the router's node, and whether those are real node names: Slurm's
    once the tiers hold their nodes, else their places (`rollout[3]`, `service[0]`), as `rl360 plan` shows."""
    slots = placement(ctx.profile, ctx.need_recipe()).engines
    doc = ctx.state.read()
    rollout, service = queries.tier_nodes(doc, "rollout"), queries.tier_nodes(doc, "service")
    known = bool(service) and all(s.node_index < len(rollout) for s in slots)
    if not known:
        return [f"rollout[{s.node_index}]" for s in slots], "service[0]", False
    return [rollout[s.node_index] for s in slots], service[0], True


def component_specs(ctx: Context) -> list[ComponentSpec]:
    recipe = ctx.need_recipe()
    engine = recipe.engine
    host = listen_host(ctx)
    ports = serve_ports(ctx.profile.base_port, engine.num_engines)
    if host == NODE_ADDRESS:
        engine_nodes, router_node, on_nodes = _node_names(ctx)
    else:
        engine_nodes, router_node, on_nodes = [host] * engine.num_engines, host, False
    key_file = str(api_key_file(ctx))
    # Every command runs on its node: it starts with the interpreter the backend starts components with there.
    python = ctx.backend.python
    sessions = recipe.rollout.max_concurrent_sessions  # the router's launcher checks its node's open-files limit
    if engine.kind == "simulated":
        # --- simulated engines (issue 11): stand-ins, many engines per process, on this machine.
        from rl360cli.inference.sim_engine import sim_engine_specs

        urls = [f"http://{host}:{port}" for port in ports.engines]
        router = router_spec(engine, worker_urls=urls, host=host, port=ports.router,
                             prometheus_port=ports.router_metrics, run=ctx.run_id, api_key_file=key_file, url_host=host,
                             max_concurrent_sessions=sessions, python=python)
        return [*sim_engine_specs(engine, ports=ports.engines, host=host, tokenizer=str(policy_dir(ctx)),
                                  api_key_file=key_file, run=ctx.run_id, seed=recipe.run.seed, python=python),
                dataclasses.replace(router, url=f"http://{host}:{ports.router}")]
        # --- end of simulated engines
    engines = [
        engine_spec(engine, index=i, model_path=str(policy_dir(ctx)), host=host, port=port, run=ctx.run_id,
                    dtype=recipe.model.dtype, seed=recipe.run.seed, api_key_file=key_file, url_host=engine_nodes[i],
                    python=python)
        for i, port in enumerate(ports.engines)
    ]
    urls = [f"http://{node}:{port}" for node, port in zip(engine_nodes, ports.engines)]
    router = router_spec(engine, worker_urls=urls, host=host, port=ports.router, prometheus_port=ports.router_metrics,
                         run=ctx.run_id, api_key_file=key_file, url_host=router_node, max_concurrent_sessions=sessions,
                         python=python)
    specs = [dataclasses.replace(s, url=f"http://{node}:{s.ports['http']}")
             for s, node in zip([*engines, router], [*engine_nodes, router_node])]
    if on_nodes:
        # Start each where its URL says: it binds that node's address (keyed_launch fills it in there).
        specs = [dataclasses.replace(s, node=node) for s, node in zip(specs, [*engine_nodes, router_node])]
    if ctx.backend.on_this_machine:  # the engines share the rollout tier's CPUs of this machine
        engine_env = thread_env(ctx, "rollout", sharing=engine.num_engines)
        specs = [dataclasses.replace(s, env={**engine_env, **s.env}) if s.kind.startswith("engine") else s
                 for s in specs]
    return [*specs, control_spec(ctx, node=router_node if on_nodes else None)]


def control_spec(ctx: Context, *, node: str | None) -> ComponentSpec:
    """The run's control plane (rl360cli/run/control.py) beside the router: it starts again the engines and the
    router that die, from a process that outlives the trainer (on Slurm, a job step of its own)."""
    argv = python_argv(ctx, "rl360cli.run.control", "--state", str(ctx.state.path.absolute()), "--run", ctx.run_id or "")
    return ComponentSpec(name="control", tier="service", stage=NAME, kind="control", argv=argv, run=ctx.run_id,
                         node=node)


def plan(ctx: Context) -> list[Action]:
    recipe = ctx.need_recipe()
    model = recipe.model
    what = {"tiny": f"build a {model.num_layers}-layer, {model.hidden_size}-wide model and its tokenizer, "
                    f"{model.warmup_steps} warm-up steps",
            "gguf-package": f"dequantise {model.gguf_file} from the {model.package} package",
            "huggingface": f"use {model.path}"}[model.kind]
    actions = [Action(stage=NAME, verb="prepare", subject="policy v0", detail=what),
               Action(stage=NAME, verb="prepare", subject="api key",
                      detail=f"the run's key in {api_key_file(ctx)}, made if missing (mode 0600, never "
                             "printed); every engine and the router require it")]
    for spec in component_specs(ctx):
        detail = f"{spec.url or 'watches the engines and the router'} on the {spec.tier} tier"
        if spec.kind.startswith("engine"):
            detail += f", {recipe.engine.kind} engine, batch ≤ {recipe.engine.max_batch_size}"
        actions.append(Action(stage=NAME, verb="start", subject=spec.id, detail=detail, command=spec.argv))
    return actions


def apply(ctx: Context) -> list[dict]:
    recipe = ctx.need_recipe()
    ctx.backend.check_engine(recipe.engine.kind)
    if ctx.backend.on_this_machine:  # the router runs on this machine, under its limits
        check_router_open_files(recipe.engine, recipe.rollout.max_concurrent_sessions)
    specs = component_specs(ctx)
    for spec in specs:
        _check_port_free(ctx, spec)
    ctx.say(f"policy v0: preparing ({recipe.model.kind})")
    with _quiet_transformers():
        prepare_policy(recipe.model, tasks_dir=Path(recipe.tasks.path), out_dir=policy_dir(ctx),
                       seed=recipe.policy_seed)
        if recipe.trainer.lora is not None:  # before any engine starts: a target the policy lacks ends here
            from rl360cli.trainer.lora import check_targets_of_folder

            check_targets_of_folder(policy_dir(ctx), recipe.trainer.lora.target_modules)
    ctx.event(NAME, "prepare", "policy v0", path=str(policy_dir(ctx)))
    # Before any engine starts: each one reads it as it starts. An existing key is kept (engines may run).
    key = read_api_key(create_api_key(ctx.run_dir))
    ctx.event(NAME, "prepare", "api key", path=str(api_key_file(ctx)))
    # Engines first, side by side: the router is given their URLs and checks them as it starts.
    router = next(s for s in specs if s.kind == "router")
    engine_specs = [s for s in specs if s.kind.startswith("engine")]
    records = [*start_components(ctx, engine_specs, ready_timeout_s=300.0),
               start_component(ctx, router, ready_timeout_s=300.0)]
    engines = [s.url for s in engine_specs]
    # The router is ready once one engine is registered; rollouts should find all of them there.
    wait_router_workers(router.url, engines, api_key=key, timeout_s=120.0)
    # Then what watches them all (stand-in engines, many per process, are never restarted one by one).
    return [*records, *(start_component(ctx, s) for s in specs if s.kind == "control")]


def restart(ctx: Context, cid: str) -> dict:
    """Start engine or router `cid` of the run again from its record, and put it back behind the router.

    An engine comes back serving policy v0 from its recorded command: with a trainer running, its next weight
    sync finds the engine outside the group and re-forms the group with it (trainer/broadcast.py); the
    run's control plane does all of this by itself when an engine dies."""

    doc = ctx.state.read()
    rec = queries.component(doc, cid)
    if rec is None or rec.get("stage") != NAME:
        known = sorted(c for c, r in queries.components(doc).items() if r.get("stage") == NAME)
        raise Rl360Error(f"no engine or router {cid!r} is recorded", f"name one of: {', '.join(known) or 'none'}")
    key = optional_api_key(ctx.run_root / rec["run"]) if rec.get("run") else None
    router = queries.run_router(doc, rec["run"])
    is_engine = rec["kind"].startswith("engine")
    if is_engine and router is not None:
        with contextlib.suppress(OSError, ValueError, KeyError):
            router_forget(router["url"], rec["url"], api_key=key)
    record = relaunch_component(ctx.backend_named(rec["backend"]), ctx.state, cid, reason="restarted by hand")
    if is_engine and router is not None:
        router_register(router["url"], rec["url"], api_key=key)
    ctx.say(f"{cid}: restarted ({record.get('restarts')} restarts)")
    return record


def _check_port_free(ctx: Context, spec: ComponentSpec) -> None:
    if not ctx.backend.on_this_machine or component_is_live(ctx, spec.id):
        return
    for port in spec.ports.values():
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((ctx.profile.bind_host, port))
            except OSError:
                raise Rl360Error(f"port {port} for {spec.id} is already in use",
                                 f"stop what holds it, or set base_port in {ctx.profile_path}") from None


@contextlib.contextmanager
def _quiet_transformers():
    """No progress bars or info chatter from transformers in the middle of the CLI's own output."""
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        hf_logging.enable_progress_bar()
