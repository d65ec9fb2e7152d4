"""The pin map: which nodes hold each image warm, with enough capacity for its sandboxes and within every disk budget.

Each image of the list is placed on nodes of its tiers:

- `pin = ["n1", "n2"]`: exactly those nodes;
- `pin_count = k`: k of the tiers' nodes;
- `expected_concurrency = c`: the fewest nodes whose room for its sandboxes
  (min(node cpus / image cpus, node memory / image memory), each node counted
  for each image on its own) adds up to c;
- none of these: every node of its tiers.

Nodes that already hold the image's digest are chosen first (no pull), then
those with the most room, then the most free disk, then by name, so the map is
deterministic. Explicit pins are placed first, then the other images largest
first. Every node's planned bytes (the images placed on it, plus the images
rl360 put there earlier that are no longer listed, unless they are being
pruned) must fit its `disk_budget_gb`; when they cannot, the error names the
node, the images and the fix.

    pins = plan_pins(demands, profile.nodes, where=Where(profile="cluster/x.toml", images="images/images.toml"))

Test: tests/images/test_pinmap.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from rl360cli.nodes.config import NodeSpec
from rl360cli.errors import Rl360Error
from rl360cli.images.config import ImageSpec

# On-disk (uncompressed) bytes per compressed byte, used only before any node holds an image: the dev images
# measured 1.9x (busybox) and 2.6x (Debian + python3); 3 errs toward refusing rather than overfilling a disk.
EXPANSION = 3.0
GB = 10**9
MB = 10**6


class PinMapError(Rl360Error):
    """The images cannot be placed as the list asks within the nodes' capacity and disk budgets."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Where:
    """The files to name in error messages."""

    profile: str
    images: str


@dataclass(frozen=True, kw_only=True, slots=True)
class Demand:
    """One image to place: its spec, the digest it resolved to, its size and where it is already warm."""

    name: str
    spec: ImageSpec
    ref: str
    digest: str
    size: int
    # True when the size was measured on a node or given as disk_mb; False when estimated from the registry.
    size_known: bool
    warm_on: frozenset[str] = frozenset()


@dataclass(frozen=True, kw_only=True, slots=True)
class Placement:
    name: str
    ref: str
    digest: str
    size: int
    size_known: bool
    nodes: tuple[str, ...]
    # How many of its sandboxes the chosen nodes can run at once.
    capacity: int
    rule: str


@dataclass(frozen=True, kw_only=True, slots=True)
class PinMap:
    placements: dict[str, Placement]
    # Planned bytes on each node, and each node's budget.
    disk: dict[str, int] = field(default_factory=dict)
    budget: dict[str, int] = field(default_factory=dict)


def slots(node: NodeSpec, spec: ImageSpec) -> int:
    """How many sandboxes of `spec` fit on `node` by CPUs and memory."""
    return max(0, min(math.floor(node.cpus / spec.cpus + 1e-9), node.memory_mb // spec.memory_mb))


def plan_pins(demands: list[Demand], nodes: list[NodeSpec] | tuple[NodeSpec, ...], *, where: Where,
              other_usage: dict[str, int] | None = None,
              other_images: dict[str, list[str]] | None = None) -> PinMap:
    """Place every demand; `other_usage[node]` bytes are taken by kept images outside the list
    (`other_images[node]` names them for messages)."""
    by_name = {n.name: n for n in nodes}
    budget = {n.name: int(n.disk_budget_gb * GB) for n in nodes}
    used = {n.name: int((other_usage or {}).get(n.name, 0)) for n in nodes}
    held: dict[str, list[str]] = {n.name: list((other_images or {}).get(n.name, [])) for n in nodes}
    placements: dict[str, Placement] = {}

    pinned = [d for d in demands if d.spec.pin]
    free_choice = sorted((d for d in demands if not d.spec.pin), key=lambda d: (-d.size, d.name))
    for d in pinned:
        unknown = [n for n in d.spec.pin if n not in by_name]
        if unknown:
            raise PinMapError(f"{where.images}: [images.{d.name}] pins node '{unknown[0]}', "
                              f"which is not in {where.profile}",
                              f"use one of: {', '.join(by_name) or '(the profile lists no nodes)'}")
        chosen = list(d.spec.pin)
        _check_capacity(d, [by_name[n] for n in chosen], where)
        for n in chosen:
            _take(n, d, used, budget, held, where)
        placements[d.name] = _placement(d, chosen, by_name, "pin")

    for d in free_choice:
        eligible = [n for n in nodes if n.tier in d.spec.tiers]
        if not eligible:
            raise PinMapError(f"image {d.name} is for tier {'/'.join(d.spec.tiers)}, but {where.profile} "
                              f"has no node in it",
                              f"add nodes with tier = \"{d.spec.tiers[0]}\" to the profile, or change `tiers` of "
                              f"[images.{d.name}] in {where.images}")
        if d.spec.pin_count is None and d.spec.expected_concurrency is None:
            for n in eligible:
                _take(n.name, d, used, budget, held, where)
            placements[d.name] = _placement(d, [n.name for n in eligible], by_name, "every node of its tier")
            continue
        fits = [n for n in eligible if used[n.name] + d.size <= budget[n.name]]
        fits.sort(key=lambda n: (n.name not in d.warm_on, -slots(n, d.spec), -(budget[n.name] - used[n.name]),
                                 n.name))
        chosen: list[NodeSpec] = []
        if d.spec.pin_count is not None:
            if d.spec.pin_count > len(eligible):
                raise PinMapError(f"[images.{d.name}] pin_count = {d.spec.pin_count}, but {where.profile} has "
                                  f"{len(eligible)} node(s) in tier {'/'.join(d.spec.tiers)}",
                                  f"lower pin_count in {where.images} or add nodes to the profile")
            chosen = fits[: d.spec.pin_count]
            if len(chosen) < d.spec.pin_count:
                _no_room(d, eligible, used, budget, held, where, wanted=f"{d.spec.pin_count} nodes")
            rule = f"pin_count {d.spec.pin_count}"
        if d.spec.expected_concurrency is not None:
            room = sum(slots(n, d.spec) for n in chosen)
            for n in fits:
                if room >= d.spec.expected_concurrency:
                    break
                if n not in chosen:
                    chosen.append(n)
                    room += slots(n, d.spec)
            if room < d.spec.expected_concurrency:
                total = sum(slots(n, d.spec) for n in eligible)
                if total < d.spec.expected_concurrency:
                    raise PinMapError(
                        f"image {d.name} expects {d.spec.expected_concurrency} sandboxes at once, but the nodes of "
                        f"tier {'/'.join(d.spec.tiers)} have room for {total} "
                        f"({d.spec.cpus:g} CPUs, {d.spec.memory_mb} MB each)",
                        f"lower expected_concurrency (or cpus/memory_mb) of [images.{d.name}] in {where.images}, "
                        f"or add nodes to {where.profile}")
                _no_room(d, eligible, used, budget, held, where,
                         wanted=f"room for {d.spec.expected_concurrency} sandboxes")
            rule = f"expected_concurrency {d.spec.expected_concurrency}"
        for n in chosen:
            _take(n.name, d, used, budget, held, where)
        placements[d.name] = _placement(d, [n.name for n in chosen], by_name, rule)
    ordered = {d.name: placements[d.name] for d in demands}  # the list's order, for tables and reports
    return PinMap(placements=ordered, disk=used, budget=budget)


def _placement(d: Demand, chosen: list[str], by_name: dict[str, NodeSpec], rule: str) -> Placement:
    ordered = tuple(sorted(chosen, key=lambda n: list(by_name).index(n)))
    return Placement(name=d.name, ref=d.ref, digest=d.digest, size=d.size, size_known=d.size_known, nodes=ordered,
                     capacity=sum(slots(by_name[n], d.spec) for n in ordered), rule=rule)


def _check_capacity(d: Demand, chosen: list[NodeSpec], where: Where) -> None:
    if d.spec.expected_concurrency is None:
        return
    room = sum(slots(n, d.spec) for n in chosen)
    if room < d.spec.expected_concurrency:
        raise PinMapError(f"image {d.name} expects {d.spec.expected_concurrency} sandboxes at once, but its pinned "
                          f"nodes {', '.join(n.name for n in chosen)} have room for {room}",
                          f"pin more nodes for [images.{d.name}] in {where.images} or lower expected_concurrency")


def _take(node: str, d: Demand, used: dict[str, int], budget: dict[str, int], held: dict[str, list[str]],
          where: Where) -> None:
    if used[node] + d.size > budget[node]:
        names = held[node] + [d.name]
        raise PinMapError(
            f"node {node}'s disk budget ({_mb(budget[node])}) cannot hold {', '.join(names)} "
            f"({_mb(used[node] + d.size)}{'' if d.size_known else ', estimated'})",
            f"raise disk_budget_gb of {node} in {where.profile}, pin fewer images to it in {where.images}, "
            f"or add --prune to drop images no longer listed")
    used[node] += d.size
    held[node].append(d.name)


def _no_room(d: Demand, eligible: list[NodeSpec], used: dict[str, int], budget: dict[str, int],
             held: dict[str, list[str]], where: Where, *, wanted: str) -> None:
    fullest = min(eligible, key=lambda n: budget[n.name] - used[n.name])
    raise PinMapError(
        f"image {d.name} ({_mb(d.size)}) needs {wanted} in tier {'/'.join(d.spec.tiers)}, but not enough of them "
        f"have that much disk budget left (e.g. {fullest.name}: {_mb(budget[fullest.name] - used[fullest.name])} "
        f"free of {_mb(budget[fullest.name])})",
        f"raise disk_budget_gb in {where.profile}, lower the pins of [images.{d.name}] in {where.images}, "
        f"or add --prune to drop images no longer listed")


def _mb(size: int) -> str:
    if size >= 10 * GB:
        return f"{size / GB:.0f} GB"
    if size >= GB:
        return f"{size / GB:.1f} GB"
    return f"{size / MB:.1f} MB"
