"""The run's session actors and the services they use: join (or start) Ray, launch the actors on the rollout
tier, wait for them; the engines and router of the run from the state file. The trainer component
(driver.py) and a calibration run (calibrate.py) set up the same way.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import time
from pathlib import Path

from rl360cli.backends.slurm_placement import actors_per_node
from rl360cli.backends.slurm_ray import node_share
from rl360cli.config import ClusterProfile, Recipe
from rl360cli.egress.client import EGRESS_KIND, EgressRoute
from rl360cli.errors import RunFailed
from rl360cli.images.config import RegistrySpec
from rl360cli.images.mirrors import MirrorRefused, through_mirrors
from rl360cli.inference.router import generations_in_flight
from rl360cli.nodes.config import NodeDaemonConfig
from rl360cli.rollout.routing import NodeImages, RouteTable, pins_by_ref
from rl360cli.sandbox.task_loader import TaskError, load_task_set
from rl360cli.state import queries
from rl360cli.state.schema import StateDoc


def egress_route(doc: StateDoc, profile: ClusterProfile | None) -> EgressRoute:
    """Where the run's network tasks go: the profile's `[egress]`, through the proxies the `egress` stage recorded
    (each session actor keeps its own node's: `EgressRoute.on_node`)."""
    if profile is None:
        return EgressRoute()
    return EgressRoute.of(profile.egress, queries.components_of_kind(doc, EGRESS_KIND).values())


def engine_urls(doc: StateDoc, run_id: str) -> tuple[list[str], str]:
    """The run's live engines (direct URLs, for the weight broadcast) and its router."""
    engines, router = [], None
    for rec in queries.live_components(doc, run=run_id).values():
        if rec["kind"].startswith("engine"):
            engines.append(rec["url"])
        elif rec["kind"] == "router":
            router = rec["url"]
    if not engines or router is None:
        raise RuntimeError(f"run {run_id} has no running engines or router; start them with `rl360 serve`")
    return sorted(engines), router


def launch_ray_and_actors(recipe: Recipe, profile: ClusterProfile | None, *, run_id: str, policy_dir: Path,
                          router: str, node_images: dict[str, dict[str, str | None]], ray_address: str | None,
                          api_key_file: str | None, egress: EgressRoute | None = None) -> list:
    """Join the tiers' Ray cluster (or start a private one here) and launch the run's session actors;
    `wait_actors_ready` waits for them."""
    import ray

    if ray_address:
        # ray.init waits for a head that never answers without end (its `ray start` failed, say).
        wait_for_ray_head(ray_address, recipe.rollout.actor_start_timeout_s)
    # Ray reports usage to its makers unless told not to: a run talks to its own cluster only.
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    # "local" starts a private Ray instance even when another one runs on this machine.
    ray.init(address=ray_address or "local", num_cpus=None if ray_address else max(2, os.cpu_count() or 2),
             include_dashboard=False, log_to_driver=True, configure_logging=False)
    return launch_session_actors(recipe, profile, run_id=run_id, policy_dir=policy_dir, router=router,
                                 node_images=node_images, in_cluster=ray_address is not None,
                                 api_key_file=api_key_file, egress=egress)


def wait_for_ray_head(address: str, timeout_s: float) -> None:
    """Return once the Ray head's GCS at `host:port` takes connections; `RunFailed` after `timeout_s`."""
    host, _, port = address.rpartition(":")
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            socket.create_connection((host, int(port)), timeout=2).close()
            return
        except OSError as e:
            if time.monotonic() > deadline:
                raise RunFailed(f"the Ray head at {address} does not answer after {timeout_s:g}s ({e})",
                                fix="see `rl360 logs` for service/ray-head") from None
            time.sleep(0.5)


def launch_session_actors(recipe: Recipe, profile: ClusterProfile | None, *, run_id: str, policy_dir: Path,
                          router: str, node_images: dict[str, dict[str, str | None]], in_cluster: bool,
                          api_key_file: str | None = None, egress: EgressRoute | None = None) -> list:
    """The run's Ray session actors, launched, each given its configuration as plain data."""
    import ray

    from rl360cli.rollout.session_actor import ActorSetup, SessionActor

    remote_actor = ray.remote(SessionActor)
    # In a Ray cluster across the tiers the actors go to the rollout tier's nodes, the same number on each
    # (at least one): each node's Ray worker offers one NODE_RESOURCE, and every actor takes its share of it.
    # Here, without a cluster, all of them are on this one node.
    wanted = recipe.rollout.num_session_actors
    per_node = actors_per_node(wanted, num_rollout_nodes(profile)) if in_cluster else wanted
    num_actors = per_node * num_rollout_nodes(profile) if in_cluster else wanted
    placement = {"resources": node_share(per_node), "scheduling_strategy": "SPREAD"} if in_cluster else {}
    # The recipe's concurrency and pull cap, split among the actors there are.
    rollout = dataclasses.replace(recipe.rollout, num_session_actors=num_actors)
    in_flight = generations_in_flight(recipe.engine, recipe.rollout.max_concurrent_sessions)
    node_cpus, node_memory_mb = rollout_request(profile)
    setup = ActorSetup(run_id=run_id, policy_dir=str(policy_dir), router_url=router, actor_index=0,
                       tasks_path=recipe.tasks.path, tasks_include=recipe.tasks.include,
                       tasks_tags=recipe.tasks.tags, rollout=rollout,
                       node_daemon=profile.sandbox if profile else NodeDaemonConfig(), actors_per_node=per_node,
                       node_cpus=node_cpus, node_memory_mb=node_memory_mb,
                       agent=recipe.agent,
                       eval_tasks_path=recipe.eval.path if recipe.eval.active else None,
                       eval_tasks_include=recipe.eval.include,
                       sandbox=recipe.sandbox, nodes=profile.nodes if profile else (), node_images=node_images,
                       registry=profile.registry if profile else RegistrySpec(), egress=egress or EgressRoute(),
                       # A local tier may be pinned to some CPUs: the actors and their sandboxes keep to them.
                       cpu_list=profile.tiers["rollout"].cpu_list if profile else (), api_key_file=api_key_file,
                       max_generate_connections=-(-in_flight // num_actors))
    # A dead actor (its node lost, its process killed) is started again by Ray on the rollout tier. The groups
    # it held are not run again (no task retries): they come back as Ray's actor error, and the rollouts mask
    # their sessions (`node_lost`: rl360cli/rollout/rollouts.py `lost_group`), then send no new group before
    # the tier is live again (`Rollouts.when_live`).
    return [remote_actor.options(num_cpus=0, max_concurrency=10_000,
                                 max_restarts=recipe.rollout.actor_max_restarts, max_task_retries=0, **placement)
            .remote(dataclasses.replace(setup, actor_index=i))
            for i in range(num_actors)]


def num_rollout_nodes(profile: ClusterProfile | None) -> int:
    return profile.tiers["rollout"].num_nodes if profile else 1


def rollout_request(profile: ClusterProfile | None) -> tuple[float | None, int | None]:
    """The CPUs and MB the rollout tier asks per node (None: not said; the node's own then)."""
    tier = profile.tiers["rollout"] if profile else None
    if tier is None:
        return None, None
    return tier.cpus_per_node, int(tier.memory_gb_per_node * 1024) if tier.memory_gb_per_node else None


def wait_actors_ready(actors: list, recipe: Recipe, *, in_cluster: bool) -> None:
    """Until every session actor is built; `RunFailed` past `[rollout] actor_start_timeout_s`."""
    import ray

    # Ray waits for resources without end: an actor no node can take (the rollout tier's Ray worker
    # never joined) would hang the run's first step. Fail it here instead, naming what to look at.
    started = time.monotonic()
    timeout_s = recipe.rollout.actor_start_timeout_s
    ready, waiting = ray.wait([a.ready.remote() for a in actors], num_returns=len(actors), timeout=timeout_s)
    ray.get(ready)  # an actor whose constructor raised raises here, with its own error
    if waiting:
        where = "the rollout tier's Ray nodes (see `rl360 logs` for its ray-worker)" if in_cluster else "this machine"
        raise RunFailed(f"{len(waiting)} of {len(actors)} session actors did not start within {timeout_s:g}s "
                         f"on {where}", fix="check that the tier's Ray worker runs, or raise "
                                            "[rollout] actor_start_timeout_s")
    log(f"{len(actors)} session actors ready ({time.monotonic() - started:.1f}s waited for them)")


def run_task_ids(tasks_path: str, include: tuple[str, ...]) -> list[str]:
    """The ids of the run's tasks, as the session actors load them; a task rl360 refuses is said in the run's
    log, one line each, and left out: it never stops the others."""
    refused: dict[str, TaskError] = {}
    tasks = load_task_set(Path(tasks_path), include=include, refused=refused)
    for name, error in refused.items():
        log(f"task {name} left out: {error.problem}" + (f" ({error.fix})" if error.fix else ""))
    return [t.id for t in tasks]


def route_table(doc: StateDoc, recipe: Recipe, profile: ClusterProfile | None, actors: list, *,
                in_cluster: bool) -> RouteTable | None:
    """Where each group should go by its task's image (rl360cli/rollout/routing.py): each actor's node, each
    task's image as the nodes' caches key it, the caches and pins the last prewarm recorded. None (round robin)
    unless the sandboxes are docker on each rollout node's own daemon, in a cluster: elsewhere every actor
    reaches the same daemons."""
    import ray

    if not (in_cluster and profile and profile.sandbox.docker_host and recipe.sandbox.provider == "docker"):
        return None
    images: dict[str, str] = {}
    for task in load_task_set(Path(recipe.tasks.path), include=recipe.tasks.include, refused={}):
        if task.docker_image:
            try:
                images[task.id] = through_mirrors(task.image_ref, profile.registry)
            except MirrorRefused:
                continue  # its start fails, wherever it goes
    nodes = tuple(ray.get([actor.node_of.remote() for actor in actors]))
    per_actor = -(-recipe.rollout.max_concurrent_sessions // max(1, len(actors)))
    return RouteTable(actor_nodes=nodes, task_images=images, images=recorded_images(doc), capacity=per_actor)


def recorded_images(doc: StateDoc) -> NodeImages:
    """The nodes' caches, and the pins and digests of the last prewarm, as the state file records them."""
    last = queries.prewarm(doc)
    return NodeImages(caches=queries.image_digests(doc), pins=pins_by_ref(last["images"]) if last else {},
                      digests=queries.expected_digests(doc))


def close_actors(actors: list) -> None:
    """Close the session actors (their sandboxes go with them) and leave Ray."""
    import ray

    for actor in actors:
        try:
            ray.get(actor.close.remote(), timeout=30)
        except Exception as e:  # noqa: BLE001 — closing is best effort; the supervisor ends what is left
            log(f"a session actor did not close ({type(e).__name__}: {e})")
    ray.shutdown()


def log(message: str) -> None:
    print(f"[driver] {message}", flush=True)
