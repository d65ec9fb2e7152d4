"""Stage `prewarm-images`: fill the nodes' image caches in waves, keyed by digest, and record them in the state.

1. Load the image list (`images/images.toml`, or `--images`) and select nodes (`--nodes`).
2. Resolve every reference to its manifest digest once (a HEAD to the registry).
3. Read each selected node's cache from its Docker daemon (unix://, ssh:// or tcp://).
4. Plan the pin map (rl360cli/images/pinmap.py): enough warm capacity per image, every disk budget kept.
5. Pull what is missing in waves of at most `--wave-size` (default: the profile's
   `registry.max_concurrent_pulls`), skipping nodes that hold the digest, with retries and back-off;
   the state's node caches are updated after every wave, so it records exactly what succeeded. Nodes
   reached through job steps (Slurm) pull all their images in one step each, a wave spanning nodes
   whose steps share the registry's capacity (rl360cli/images/puller.py `run_node_steps`).
6. With `--prune`, remove the images rl360 prewarmed earlier that are no longer listed (and digests a
   moved tag left behind), never one a running container uses.

Every problem with the input (image list, unknown image, registry that does not answer, node not in
the profile, disk budget) is raised before anything is pulled or written. A node that cannot be reached
or whose pulls fail is reported failed with its reason; the others finish.

`rl360 up` runs this between provision and serve when the recipe's sandboxes are docker and the
profile lists nodes; `rl360 prewarm-images` runs it alone (rl360cli/commands/prewarm_images.py).
Test: tests/images/test_prewarm_*.py.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from rl360cli.errors import Rl360Error
from rl360cli.images.config import ImageList, ImageRef, load_images
from rl360cli.images.pinmap import EXPANSION, Demand, PinMap, Placement, Where, plan_pins
from rl360cli.images.puller import (BatchPuller, PullResult, PullTask, RetryPolicy, SilentListener, WaveListener,
                                    make_node_waves, make_waves, run_node_steps, run_waves)
from rl360cli.images.registry import ImageNotInRegistry, RegistryClient, RegistryUnreachable
from rl360cli.nodes.base import NodeError
from rl360cli.nodes.config import NodeSpec
from rl360cli.nodes.cleanup import clean_nodes
from rl360cli.nodes.daemon import rollout_daemon_specs
from rl360cli.nodes.runtime import connect
from rl360cli.nodes.selector import select_nodes
from rl360cli.stages.base import Action, Context
from rl360cli.stages.prewarm_prune import PruneItem, kept_unlisted, prune_candidates, prune_images
from rl360cli.state import queries
from rl360cli.state.images import (FoundImage, ImagePull, NodeFacts, NodeScan, record_prewarm, record_pulls,
                                   record_scans)
from rl360cli.state.queries import node_images
from rl360cli.state.recovery import prewarm_done
from rl360cli.state.schema import RUN_FINAL, StateDoc, now_iso

NAME = "prewarm-images"
# `rl360 up` sweeps the rollout nodes' daemons for the latest this many ended runs of the state file.
MAX_SWEPT_RUNS = 20


@dataclass(frozen=True, kw_only=True, slots=True)
class PrewarmOptions:
    # The image list (None: the profile's `images`).
    images_path: Path | None = None
    # Which nodes (None: all the profile lists); see rl360cli/nodes/selector.py.
    selector: str | None = None
    # Pulls in flight at once (None: the profile's registry.max_concurrent_pulls).
    wave_size: int | None = None
    prune: bool = False
    retry: RetryPolicy = field(default_factory=RetryPolicy)

    def __post_init__(self) -> None:
        if self.wave_size is not None and self.wave_size < 1:
            raise Rl360Error(f"--wave-size {self.wave_size}: must be at least 1",
                             "pass a positive number, or leave it out to use the profile's registry capacity")


@dataclass(frozen=True, kw_only=True, slots=True)
class Cell:
    """One (node, image) pair of the final table."""

    node: str
    image: str
    status: str  # warm | pulled | failed
    seconds: float = 0.0
    reason: str | None = None


@dataclass(kw_only=True)
class Prepared:
    """What apply will do, found without changing anything (registry HEADs and cache reads only)."""

    images_path: Path
    images: ImageList
    refs: dict[str, ImageRef]
    pins: PinMap
    # Every daemon the pin map planned for (`docker_nodes`), and those this run works on.
    nodes: list[NodeSpec]
    selected: list[NodeSpec]
    wave_size: int
    runtimes: dict[str, Any]
    scans: dict[str, list]
    unreachable: dict[str, str]
    warm: list[Cell]
    retag: list[tuple[str, str, str]]  # (node, image name, image id)
    failed_upfront: list[Cell]
    tasks: list[PullTask]
    prune: list[PruneItem]

    @property
    def by_node_step(self) -> bool:
        """Whether every node to pull on is reached by job steps: then each node's pulls are one step."""
        nodes = {t.node for t in self.tasks}
        return bool(nodes) and all(isinstance(self.runtimes.get(n), BatchPuller) for n in nodes)

    @property
    def waves(self) -> list[list[PullTask]]:
        if self.by_node_step:
            return make_node_waves(self.tasks, self.wave_size)
        return make_waves(self.tasks, self.wave_size)

    def close(self) -> None:
        for runtime in self.runtimes.values():
            try:
                runtime.close()
            except Exception:  # noqa: BLE001 - closing a broken connection must not hide the result
                pass


@dataclass(kw_only=True)
class PrewarmReport:
    images_path: str
    nodes: list[str]
    placements: dict[str, Placement]
    cells: list[Cell]
    waves: list[list[str]]
    wave_size: int
    pulled: int
    results: list[PullResult] = field(default_factory=list)
    failed_nodes: dict[str, str] = field(default_factory=dict)
    pruned: list[dict] = field(default_factory=list)
    dry_run: bool = False

    @property
    def ok(self) -> bool:
        return not self.failed_nodes

    def to_dict(self) -> dict[str, Any]:
        return {
            "images_file": self.images_path, "dry_run": self.dry_run, "nodes": self.nodes,
            "wave_size": self.wave_size, "waves": self.waves, "pulled": self.pulled,
            "images": {name: {"ref": p.ref, "digest": p.digest, "size": p.size, "size_known": p.size_known,
                              "nodes": list(p.nodes), "capacity": p.capacity, "rule": p.rule}
                       for name, p in self.placements.items()},
            "cells": [{"node": c.node, "image": c.image, "status": c.status, "seconds": c.seconds,
                       "reason": c.reason} for c in self.cells],
            "pulls": [{"node": r.task.node, "image": r.task.image, "outcome": r.outcome, "wave": r.wave,
                       "started_at": r.started_at, "finished_at": r.finished_at, "seconds": r.seconds,
                       "attempts": r.attempts, "reason": r.reason} for r in self.results],
            "failed_nodes": self.failed_nodes, "pruned": self.pruned, "ok": self.ok,
        }


# ----------------------------------------------------------------------------- stage interface


def applies(ctx: Context) -> bool:
    """In `rl360 up`: when the recipe's sandboxes run in Docker, on the profile's nodes or each rollout node's own
    daemon (`[sandbox] docker_host`)."""
    return ctx.recipe is not None and ctx.recipe.sandbox.provider == "docker" and bool(
        ctx.profile.nodes or ctx.profile.sandbox.docker_host)


def docker_nodes(ctx: Context, doc: StateDoc) -> list[NodeSpec]:
    """The daemons to warm: the profile's [[nodes]], and with `[sandbox] docker_host` each node the rollout tier
    holds (its daemon reached through a job step on that node)."""
    tier = ctx.profile.tiers["rollout"]
    memory = int(tier.memory_gb_per_node * 1024) if tier.memory_gb_per_node else None
    return [*ctx.profile.nodes, *rollout_daemon_specs(ctx.profile.sandbox, queries.tier_nodes(doc, "rollout"),
                                                      tier_cpus=tier.cpus_per_node, tier_memory_mb=memory)]


def node_step_actions(ctx: Context) -> list[Action]:
    """The plan before the rollout tier holds its nodes: one prewarm step on each rollout node, named by its index
    (the images and their digests are read once the nodes are known)."""
    profile = ctx.profile
    count = profile.tiers["rollout"].num_nodes
    span = "rollout[0]" if count == 1 else f"rollout[0-{count - 1}]"
    return [Action(stage=NAME, verb="prewarm", subject=f"{span} image caches", detail=(
        f"a job step on each of the {count} rollout node{'s' if count > 1 else ''} pulls the images of "
        f"{profile.images} pinned to it into its own daemon ({profile.sandbox.docker_host}), in waves of at most "
        f"{profile.registry.max_concurrent_pulls} pulls across the nodes; each node's cache is recorded in the "
        "state file; first a step removes what ended runs left there"))]


def sweep_ended_runs(ctx: Context) -> None:
    """With `[sandbox] docker_host`: a step on each rollout node removes what the latest ended runs of this state
    file left on its daemon (a session actor that died removed nothing), before the node is warmed for the next."""
    if not ctx.profile.sandbox.docker_host:
        return
    doc = ctx.state.read()
    ended = [rid for rid, run in queries.runs(doc).items() if run.get("status") in RUN_FINAL][-MAX_SWEPT_RUNS:]
    nodes = queries.tier_nodes(doc, "rollout")
    removed, failed = clean_nodes(ctx.backend.docker_steps(doc, nodes), ctx.profile.sandbox, runs=ended,
                                  slurm_conf=ctx.profile.slurm.slurm_conf if ctx.profile.slurm else "")
    for node, count in removed.items():
        if count:
            ctx.event(NAME, "sweep", node, containers=count)
            ctx.say(f"{node}: {count} containers of ended runs removed")
    for node, reason in failed.items():
        ctx.say(f"{node}: what ended runs left there was not swept ({reason})")


def plan(ctx: Context, options: PrewarmOptions | None = None) -> list[Action]:
    if ctx.profile.sandbox.docker_host and not queries.tier_nodes(ctx.state.read(), "rollout"):
        return node_step_actions(ctx)
    prepared = prepare(ctx, options or PrewarmOptions())
    try:
        return actions_of(prepared)
    finally:
        prepared.close()


def apply(ctx: Context, options: PrewarmOptions | None = None,
          listener: WaveListener | None = None) -> PrewarmReport:
    options = options or PrewarmOptions()
    sweep_ended_runs(ctx)
    prepared = prepare(ctx, options)
    try:
        report = _apply(ctx, prepared, options, listener or _SayListener(ctx))
    finally:
        prepared.close()
    if listener is None and not report.ok:
        # In `rl360 up` a node that could not be warmed is not fatal: its sandboxes pull on demand.
        ctx.say("prewarm failed on " + "; ".join(f"{n} ({r})" for n, r in report.failed_nodes.items())
                + "; sandboxes placed there will pull their image; rerun `rl360 prewarm-images` once it is back")
    return report


def prewarm_replaced_nodes(ctx: Context) -> list[str]:
    """After a requeue: the nodes that took lost ones' places and wait for the prewarm those had
    (`prewarm_pending`, state/recovery.py) get it, the same step on each node as `rl360 prewarm-images`, their
    caches recorded; the loop sends their session actors no group before (run/tier_watch.py). A prewarm that fails
    is said and ends the wait all the same: their sandboxes pull their images. The nodes warmed (none: none
    waited)."""
    pending = queries.prewarm_pending(ctx.state.read())
    if not pending:
        return []
    ctx.say(f"prewarming {', '.join(pending)}, which took lost nodes' places, before their actors take sessions")
    try:
        report = apply(ctx, PrewarmOptions(selector=",".join(pending)))
        if report.ok:
            ctx.say(f"{', '.join(pending)} prewarmed: {report.pulled} pulls")
    except (Rl360Error, NodeError, OSError) as e:
        ctx.say(f"prewarm of {', '.join(pending)} failed ({getattr(e, 'problem', e)}); their sandboxes pull their "
                "images")
    finally:
        prewarm_done(ctx.state, pending)
    return pending


def dry_run(ctx: Context, options: PrewarmOptions | None = None) -> PrewarmReport:
    """The report apply would start from: every pull it would make, nothing pulled or written."""
    prepared = prepare(ctx, options or PrewarmOptions())
    try:
        cells = prepared.warm + prepared.failed_upfront + [
            Cell(node=t.node, image=t.image, status="to pull") for t in prepared.tasks]
        return _report(prepared, cells, [], [
            {"node": p.node, "reference": p.reference, "digest": p.digest, "why": p.why,
             "outcome": "kept" if p.keep_reason else "to remove", "reason": p.keep_reason} for p in prepared.prune],
            dry_run=True)
    finally:
        prepared.close()


# ----------------------------------------------------------------------------- prepare (read-only)


def prepare(ctx: Context, options: PrewarmOptions) -> Prepared:
    profile = ctx.profile
    images_path = options.images_path or images_file(ctx)
    image_list = load_images(images_path)
    doc = ctx.state.read()
    nodes = docker_nodes(ctx, doc)
    if not nodes and profile.sandbox.docker_host:
        raise Rl360Error("the images go to the rollout nodes' own daemons ([sandbox] docker_host), and the rollout "
                         "tier holds no node yet", "provision the tiers first (`rl360 provision` or `rl360 up`)")
    selected = select_nodes(nodes, options.selector, profile=profile.name, where=str(ctx.profile_path))
    wave_size = options.wave_size or profile.registry.max_concurrent_pulls
    where = Where(profile=str(ctx.profile_path), images=str(images_path))
    refs = _parse_refs(image_list, profile.registry.address, images_path)
    digests, registries = _resolve(ctx, image_list, refs, images_path)

    slurm_conf = profile.slurm.slurm_conf if profile.slurm else ""
    runtimes, scans, unreachable = _scan(selected, options.retry, _docker_steps(ctx, doc, selected), slurm_conf)
    selected_names = [n.name for n in selected]

    demands = []
    for name, spec in image_list.images.items():
        ref, digest = refs[name], digests[name]
        warm_on = {n for n, imgs in scans.items() if any(i.has_digest(ref.name, digest) for i in imgs)}
        recorded = {n.name: node_images(doc, n.name).get(str(ref)) for n in nodes if n.name not in scans}
        warm_on |= {node for node, entry in recorded.items() if entry is not None and entry["digest"] == digest}
        size, known = _size(ctx, spec, ref, digest, scans, doc, registries)
        demands.append(Demand(name=name, spec=spec, ref=str(ref), digest=digest, size=size, size_known=known,
                              warm_on=frozenset(warm_on)))

    listed = {str(r) for r in refs.values()}
    other_usage, other_images = kept_unlisted(nodes, doc, scans, listed, options.prune)
    pins = plan_pins(demands, nodes, where=where, other_usage=other_usage, other_images=other_images)

    warm, retag, failed_upfront, tasks = [], [], [], []
    for name, placement in pins.placements.items():
        ref, digest = refs[name], digests[name]
        for node in placement.nodes:
            if node not in selected_names:
                continue
            if node in unreachable:
                failed_upfront.append(Cell(node=node, image=name, status="failed", reason=unreachable[node]))
                continue
            held = next((i for i in scans[node] if i.has_digest(ref.name, digest)), None)
            if held is None:
                tasks.append(PullTask(node=node, image=name, ref=ref, digest=digest))
                continue
            warm.append(Cell(node=node, image=name, status="warm"))
            if ref.tag and str(ref) not in held.tags:
                retag.append((node, name, held.id))
    prune = prune_candidates(selected_names, runtimes, scans, doc, refs, digests, pins) if options.prune else []
    return Prepared(images_path=images_path, images=image_list, refs=refs, pins=pins, nodes=nodes, selected=selected,
                    wave_size=wave_size, runtimes=runtimes, scans=scans, unreachable=unreachable, warm=warm,
                    retag=retag, failed_upfront=failed_upfront, tasks=tasks, prune=prune)


def images_file(ctx: Context) -> Path:
    """The profile's image list: relative to the profile's folder (so it means the same from any working
    folder), else to the working folder (the default `images/images.toml` from the repository root)."""
    path = Path(ctx.profile.images)
    if path.is_absolute():
        return path
    beside = ctx.profile_path.parent / path
    if beside.exists():
        return beside
    if not path.exists():
        raise Rl360Error(f"the image list {path} is neither beside profile {ctx.profile_path} nor in the working "
                         f"folder {Path.cwd()}", "pass --images FILE, or set `images = ...` in the profile")
    return path


def _parse_refs(image_list: ImageList, registry: str, images_path: Path) -> dict[str, ImageRef]:
    refs = {}
    for name, spec in image_list.images.items():
        try:
            refs[name] = ImageRef.parse(spec.ref, default_registry=registry)
        except ValueError as e:
            raise Rl360Error(f"{images_path}: [images.{name}] ref: {e}",
                             "write it as [host/]repository[:tag]") from None
    return refs


def _resolve(ctx: Context, image_list: ImageList, refs: dict[str, ImageRef],
             images_path: Path) -> tuple[dict[str, str], dict[str, RegistryClient]]:
    """Each reference's digest, asked once per reference; errors name the file to fix."""
    registry = ctx.profile.registry
    clients: dict[str, RegistryClient] = {}
    digests: dict[str, str] = {}
    for name in image_list.images:
        ref = refs[name]
        if ref.registry not in clients:
            insecure = registry.insecure if ref.registry == registry.address else False
            clients[ref.registry] = RegistryClient(ref.registry, insecure=insecure)
        try:
            resolved = clients[ref.registry].resolve(ref)
        except RegistryUnreachable as e:
            fix = (f"start it (dev machine: `bash cluster/dev/docker-nodes.sh up`) or fix [registry] address in "
                   f"{ctx.profile_path}" if ref.registry == registry.address
                   else f"start it, or fix `ref` of [images.{name}] in {images_path}")
            raise Rl360Error(e.problem, fix) from None
        except ImageNotInRegistry as e:
            raise Rl360Error(f"image {name}: {e.problem}",
                             f"push it first, or fix `ref` of [images.{name}] in {images_path}") from None
        digests[name] = resolved.digest
    return digests, clients


def _docker_steps(ctx: Context, doc: StateDoc, nodes: list[NodeSpec]) -> dict[str, tuple[str, int | None] | None]:
    """The nodes whose unix:// Docker socket is reached through a job step of the allocation holding them (the
    backend's say: none locally)."""
    return ctx.backend.docker_steps(doc, [node.name for node in nodes if node.docker_host.startswith("unix://")])


def _scan(nodes: list[NodeSpec], retry: RetryPolicy, slurm_jobs: dict[str, tuple[str, int | None] | None],
          slurm_conf: str = "") -> tuple[dict, dict, dict[str, str]]:
    """Connect to every node at once and read its cache; unreachable nodes get their reason."""
    def one(node: NodeSpec):
        if node.name in slurm_jobs and slurm_jobs[node.name] is None:
            return None, None, (f"no Slurm allocation holds {node.name}, so its Docker socket cannot be reached; "
                                f"run `rl360 provision` first")
        reason = ""
        for attempt in range(1, min(retry.max_attempts, 2) + 1):
            try:
                job, het_group = slurm_jobs.get(node.name) or (None, None)
                runtime = connect(node, slurm_job=job, het_group=het_group, slurm_conf=slurm_conf)
            except NodeError as e:
                reason = e.reason
                if attempt < 2:

                    time.sleep(retry.delay_s(attempt))
                continue
            try:
                return runtime, runtime.images(), None
            except NodeError as e:
                runtime.close()
                return None, None, e.reason
        return None, None, reason

    runtimes, scans, unreachable = {}, {}, {}
    with ThreadPoolExecutor(max_workers=min(16, len(nodes)) or 1, thread_name_prefix="scan") as pool:
        for node, (runtime, images, reason) in zip(nodes, pool.map(one, nodes), strict=True):
            if reason is not None:
                unreachable[node.name] = reason
            else:
                runtimes[node.name], scans[node.name] = runtime, images
    return runtimes, scans, unreachable


def _size(ctx: Context, spec, ref: ImageRef, digest: str, scans: dict, doc: StateDoc,
          registries: dict[str, RegistryClient]) -> tuple[int, bool]:
    """Bytes on disk: measured on a node that holds it, else given as disk_mb, else estimated."""
    for images in scans.values():
        for image in images:
            if image.has_digest(ref.name, digest) and image.size:
                return image.size, True
    for node in queries.nodes(doc):
        rec = node_images(doc, node).get(str(ref))
        if rec is not None and rec["digest"] == digest and rec.get("size"):
            return int(rec["size"]), True
    if spec.disk_mb is not None:
        return int(spec.disk_mb * 10**6), True
    try:
        return int(registries[ref.registry].compressed_size(ref, digest) * EXPANSION), False
    except RegistryUnreachable as e:
        raise Rl360Error(e.problem, f"start the registry or fix [registry] address in {ctx.profile_path}") from None


# ----------------------------------------------------------------------------- apply


def _apply(ctx: Context, prepared: Prepared, options: PrewarmOptions, listener: WaveListener) -> PrewarmReport:
    by_name = {n.name: n for n in prepared.nodes}
    for name, p in prepared.pins.placements.items():
        ctx.event(NAME, "resolve", name, ref=p.ref, digest=p.digest, nodes=list(p.nodes), rule=p.rule)
    _record_scans(ctx, prepared, by_name)
    warm = list(prepared.warm)
    for node, name, image_id in prepared.retag:
        try:
            prepared.runtimes[node].tag(image_id, prepared.refs[name])
        except NodeError as e:
            warm = [c for c in warm if (c.node, c.image) != (node, name)]
            prepared.failed_upfront.append(Cell(node=node, image=name, status="failed", reason=e.reason))
    for cell in prepared.failed_upfront:
        ctx.event(NAME, "pull", f"{cell.node}/{cell.image}", "failed", reason=cell.reason)
    for cell in warm:
        ctx.event(NAME, "pull", f"{cell.node}/{cell.image}", "skipped", reason="warm",
                  digest=prepared.pins.placements[cell.image].digest)

    waves = prepared.waves
    if not waves and isinstance(listener, _SayListener):
        ctx.say(f"nothing to pull: {len(warm)} node/image pair(s) already hold their digests")

    state_listener = _StateListener(ctx, by_name, listener, len(waves))
    if prepared.by_node_step:
        results = run_node_steps(waves, prepared.runtimes, wave_size=prepared.wave_size, retry=options.retry,
                                 listener=state_listener)
    else:
        results = run_waves(waves, prepared.runtimes, retry=options.retry, listener=state_listener)
    pruned = prune_images(ctx, prepared.prune, prepared.runtimes, stage=NAME) if options.prune else []

    cells = warm + prepared.failed_upfront + [
        Cell(node=r.task.node, image=r.task.image, status=r.outcome, seconds=r.seconds, reason=r.reason)
        for r in results]
    report = _report(prepared, cells, results, pruned, dry_run=False)
    record_prewarm(ctx.state, [node_facts(node) for node in prepared.selected], report.failed_nodes, {
        "at": now_iso(), "images_file": str(prepared.images_path), "wave_size": prepared.wave_size,
        "images": {name: {"ref": p.ref, "digest": p.digest, "nodes": list(p.nodes), "rule": p.rule,
                          "size": p.size, "capacity": p.capacity}
                   for name, p in prepared.pins.placements.items()},
        "failed_nodes": report.failed_nodes,
    })
    ctx.event(NAME, "finish", "cluster", "ok" if report.ok else "failed", pulled=report.pulled,
              warm=len(warm), failed_nodes=report.failed_nodes, waves=len(waves), wave_size=prepared.wave_size)
    return report


def _report(prepared: Prepared, cells: list[Cell], results: list[PullResult], pruned: list[dict], *,
            dry_run: bool) -> PrewarmReport:
    failed: dict[str, str] = {}
    for cell in cells:
        if cell.status == "failed":
            failed.setdefault(cell.node, cell.reason or "failed")
    for node, reason in prepared.unreachable.items():
        failed.setdefault(node, reason)
    order = {n.name: i for i, n in enumerate(prepared.selected)}
    images = list(prepared.pins.placements)
    cells.sort(key=lambda c: (order.get(c.node, 0), images.index(c.image)))
    return PrewarmReport(images_path=str(prepared.images_path), nodes=[n.name for n in prepared.selected],
                         placements=prepared.pins.placements, cells=cells,
                         waves=[[t.label for t in w] for w in prepared.waves], wave_size=prepared.wave_size,
                         pulled=sum(r.outcome == "pulled" for r in results), results=results, failed_nodes=failed,
                         pruned=pruned, dry_run=dry_run)


def _record_scans(ctx: Context, prepared: Prepared, by_name: dict[str, NodeSpec]) -> None:
    """Write what each reachable node holds now: listed images found warm, managed images that vanished dropped."""
    doc = ctx.state.read()
    scans = []
    for node, images in prepared.scans.items():
        recorded = node_images(doc, node)
        found = []
        for image_name, ref in prepared.refs.items():
            digest = prepared.pins.placements[image_name].digest
            held = next((i for i in images if i.has_digest(ref.name, digest)), None)
            if held is not None:
                tagged_at = None if str(ref) in recorded else _tag_time(prepared.runtimes[node], held.id)
                found.append(FoundImage(ref=str(ref), digest=digest, size=held.size, image_id=held.id,
                                        tagged_at=tagged_at))
        scans.append(NodeScan(node=node_facts(by_name[node]), repo_digests={d for i in images for d in i.digests},
                              found=found))
    record_scans(ctx.state, scans, {node_facts(by_name[node]): reason
                                    for node, reason in prepared.unreachable.items()})
    for node, reason in prepared.unreachable.items():
        ctx.event(NAME, "scan", node, "failed", reason=reason)


def _tag_time(runtime, image_id: str) -> str | None:
    """When the node's tag of the image was set (None if the daemon does not say)."""
    try:
        return runtime.last_tag_time(image_id)
    except Exception:  # noqa: BLE001 - only a timestamp
        return None


def node_facts(node: NodeSpec) -> NodeFacts:
    """What the profile says of `node`, for its record in the state file."""
    return NodeFacts(name=node.name, address=node_address(node), tier=node.tier, cpus=node.cpus,
                     memory_mb=node.memory_mb, docker_host=node.docker_host, disk_budget_gb=node.disk_budget_gb)


def node_address(node: NodeSpec) -> str:
    if node.docker_host.startswith("unix://"):
        return "127.0.0.1"
    return urlparse(node.docker_host).hostname or node.docker_host


class _StateListener:
    """Writes every wave's outcome into the state (under its lock) and the events log, then passes it on."""

    def __init__(self, ctx: Context, by_name: dict[str, NodeSpec], inner: WaveListener, total: int):
        self.ctx, self.by_name, self.inner, self.total = ctx, by_name, inner, total

    def wave_started(self, index: int, total: int, tasks: list[PullTask]) -> None:
        self.ctx.event(NAME, "wave", f"wave {index}/{total}", "started", pulls=[t.label for t in tasks])
        self.inner.wave_started(index, total, tasks)

    def task_started(self, task: PullTask) -> None:
        self.inner.task_started(task)

    def task_done(self, result: PullResult) -> None:
        t = result.task
        self.ctx.event(NAME, "pull", t.label, "ok" if result.outcome == "pulled" else "failed", ref=str(t.ref),
                       digest=t.digest, wave=result.wave, started_at=result.started_at,
                       finished_at=result.finished_at, seconds=result.seconds, attempts=result.attempts,
                       reason=result.reason)
        self.inner.task_done(result)

    def wave_done(self, index: int, results: list[PullResult]) -> None:
        record_pulls(self.ctx.state, {name: node_facts(node) for name, node in self.by_name.items()},
                     [ImagePull(node=r.task.node, ref=str(r.task.ref), digest=r.task.digest, size=r.size,
                                started_at=r.started_at, pulled_at=r.finished_at, seconds=r.seconds,
                                attempts=r.attempts, image_id=r.image_id)
                      for r in results if r.outcome == "pulled"])
        self.inner.wave_done(index, results)


class _SayListener(SilentListener):
    """Progress as one line per wave (for `rl360 up`, which has no progress bar)."""

    def __init__(self, ctx: Context):
        self.ctx = ctx

    def wave_done(self, index: int, results: list[PullResult]) -> None:
        pulled = sum(r.outcome == "pulled" for r in results)
        failed = [f"{r.task.label} ({r.reason})" for r in results if r.outcome == "failed"]
        self.ctx.say(f"prewarm wave {index}: {pulled} pulled" + (f", failed: {'; '.join(failed)}" if failed else ""))


def actions_of(prepared: Prepared) -> list[Action]:
    """The plan as actions: the pin map, each wave's pulls, what is already warm, what fails, what is pruned."""
    actions = []
    for name, p in prepared.pins.placements.items():
        size = f"{p.size / 1e6:.1f} MB" + ("" if p.size_known else " est.")
        actions.append(Action(stage=NAME, verb="pin", subject=name,
                              detail=f"{p.ref}@{p.digest[:19]} ({size}) on {', '.join(p.nodes)} [{p.rule}]"))
    for i, wave in enumerate(prepared.waves, start=1):
        nodes = ", ".join(dict.fromkeys(t.node for t in wave))
        steps = f"one step on each of {nodes}: " if prepared.by_node_step else ""
        actions.append(Action(stage=NAME, verb="pull", subject=f"wave {i}",
                              detail=steps + ", ".join(t.label for t in wave)))
    if prepared.warm:
        actions.append(Action(stage=NAME, verb="skip", subject=f"{len(prepared.warm)} warm",
                              detail=", ".join(f"{c.node}/{c.image}" for c in prepared.warm)))
    if not prepared.tasks:
        actions.append(Action(stage=NAME, verb="nothing to pull", subject="every node holds its images' digests"))
    for node, reason in prepared.unreachable.items():
        actions.append(Action(stage=NAME, verb="fail", subject=node, detail=reason))
    for item in prepared.prune:
        verb = "keep" if item.keep_reason else "remove"
        actions.append(Action(stage=NAME, verb=verb, subject=f"{item.node}/{item.reference}",
                              detail=item.keep_reason or item.why))
    return actions
