"""Stage `serve`: the run's policy version 0, its engines on the rollout tier, the router in front.

The policy is prepared once per run (a tiny model is built and warmed up; a
pretrained one is converted or linked) into `<run>/policy/v0`. The engines —
rl360's CPU engine or real SGLang servers — load it and answer SGLang's HTTP
API; the real sglang-router on the service tier spreads the rollouts over
them. Idempotent: components of this run that already run are left alone.
"""

from __future__ import annotations

import contextlib
import dataclasses
import socket
from pathlib import Path

from rl360cli.backends.base import ComponentSpec
from rl360cli.config import run_policy_dir
from rl360cli.errors import Rl360Error
from rl360cli.stages.base import Action, Context, component_is_live, start_component
from rl360cli.stages.train import thread_env

NAME = "serve"


def applies(ctx: Context) -> bool:
    return ctx.recipe is not None


def policy_dir(ctx: Context) -> Path:
    return run_policy_dir(ctx.run_dir)


def component_specs(ctx: Context) -> list[ComponentSpec]:
    from rl360cli.inference.launch import engine_spec, router_spec, serve_ports

    recipe = ctx.need_recipe()
    engine = recipe.engine
    host = ctx.profile.bind_host
    ports = serve_ports(ctx.profile.base_port, engine.num_engines)
    engines = [
        engine_spec(engine, index=i, model_path=str(policy_dir(ctx)), host=host, port=port, run=ctx.run_id,
                    dtype=recipe.model.dtype, seed=recipe.run.seed)
        for i, port in enumerate(ports.engines)
    ]
    urls = [f"http://{host}:{port}" for port in ports.engines]
    router = router_spec(engine, worker_urls=urls, host=host, port=ports.router, prometheus_port=ports.router_metrics,
                         run=ctx.run_id)
    specs = [dataclasses.replace(s, url=f"http://{host}:{s.ports['http']}") for s in [*engines, router]]
    if ctx.profile.backend == "local":
        engine_env = thread_env(ctx, "rollout", sharing=engine.num_engines)
        specs = [dataclasses.replace(s, env={**engine_env, **s.env}) if s.kind.startswith("engine") else s
                 for s in specs]
    return specs


def plan(ctx: Context) -> list[Action]:
    recipe = ctx.need_recipe()
    model = recipe.model
    what = {"tiny": f"build a {model.num_layers}-layer, {model.hidden_size}-wide model and its tokenizer, "
                    f"{model.warmup_steps} warm-up steps",
            "gguf-package": f"dequantise {model.gguf_file} from the {model.package} package",
            "huggingface": f"use {model.path}"}[model.kind]
    actions = [Action(stage=NAME, verb="prepare", subject="policy v0", detail=what)]
    for spec in component_specs(ctx):
        detail = f"{spec.url} on the {spec.tier} tier"
        if spec.kind.startswith("engine"):
            detail += f", {recipe.engine.kind} engine, batch ≤ {recipe.engine.max_batch_size}"
        actions.append(Action(stage=NAME, verb="start", subject=spec.id, detail=detail, command=spec.argv))
    return actions


def apply(ctx: Context) -> list[dict]:
    from rl360cli.inference.router import wait_router_workers
    from rl360cli.trainer.model import prepare_policy

    recipe = ctx.need_recipe()
    if recipe.engine.kind == "sglang" and ctx.profile.backend == "local":
        raise Rl360Error("SGLang engines need GPUs, which the local backend does not have",
                         "set [engine] kind = \"local\" in the recipe, or use a Slurm profile")
    specs = component_specs(ctx)
    for spec in specs:
        _check_port_free(ctx, spec)
    ctx.say(f"policy v0: preparing ({recipe.model.kind})")
    with _quiet_transformers():
        prepare_policy(recipe.model, tasks_dir=Path(recipe.tasks.path), out_dir=policy_dir(ctx),
                       seed=recipe.run.seed)
    ctx.event(NAME, "prepare", "policy v0", path=str(policy_dir(ctx)))
    # Engines first: the router is given their URLs and checks them as it starts.
    records = [start_component(ctx, spec, ready_timeout_s=300.0) for spec in specs]
    router = next(s for s in specs if s.kind == "router")
    engines = [s.url for s in specs if s.kind.startswith("engine")]
    # The router is ready once one engine is registered; rollouts should find all of them there.
    wait_router_workers(router.url, engines, timeout_s=120.0)
    return records


def _check_port_free(ctx: Context, spec: ComponentSpec) -> None:
    if ctx.profile.backend != "local" or component_is_live(ctx, spec.id):
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
