"""`--nodes SELECTOR`: which of the profile's nodes a command touches.

A selector is a comma-separated list of items; each item is a node name
(`n1`), a Slurm-style range (`n[1-3,5]`), a shell glob (`gpu-*`) or a tier
(`tier:rollout`). A name or range that names a node the profile does not list
is an error naming the profile's nodes; so is a glob or tier that matches none.

    nodes = select_nodes(profile.nodes, "n[1-2],tier:service", profile=profile.name, where="cluster/dev-docker.toml")

Test: tests/images/test_selector.py.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Sequence

from rl360cli.errors import Rl360Error
from rl360cli.nodes.config import NodeSpec

_RANGE = re.compile(r"^([^\[\]]*)\[([0-9,\-]+)\]([^\[\]]*)$")


def select_nodes(nodes: Sequence[NodeSpec], selector: str | None, *, profile: str, where: str = "") -> list[NodeSpec]:
    """The selected ones of a profile's `nodes`, in the profile's order (`profile` names it in errors)."""
    source = f"profile '{profile}'" + (f" ({where})" if where else "")
    if not nodes:
        raise Rl360Error(f"{source} lists no nodes",
                         "add [[nodes]] tables with name and docker_host (see cluster/dev-docker.toml)")
    if selector is None or not selector.strip():
        return list(nodes)
    names = [n.name for n in nodes]
    chosen: set[str] = set()
    for item in _split(selector):
        if item.startswith("tier:"):
            tier = item[len("tier:"):]
            hit = {n.name for n in nodes if n.tier == tier}
            if not hit:
                tiers = sorted({n.tier for n in nodes})
                raise Rl360Error(f"--nodes {item}: no node of {source} is in tier '{tier}'",
                                 f"use one of: {', '.join('tier:' + t for t in tiers)}")
        elif _RANGE.match(item) or not any(c in item for c in "*?["):
            wanted = _expand(item)
            unknown = [w for w in wanted if w not in names]
            if unknown:
                raise Rl360Error(f"node '{unknown[0]}' is not in {source}", f"use one of: {', '.join(names)}")
            hit = set(wanted)
        else:
            hit = {n for n in names if fnmatch.fnmatchcase(n, item)}
            if not hit:
                raise Rl360Error(f"--nodes {item}: matches no node of {source}", f"use one of: {', '.join(names)}")
        chosen |= hit
    return [n for n in nodes if n.name in chosen]


def _split(selector: str) -> list[str]:
    """Split on commas outside brackets: `n[1-2,4],n7` -> [`n[1-2,4]`, `n7`]."""
    items, depth, current = [], 0, ""
    for ch in selector:
        depth += (ch == "[") - (ch == "]")
        if ch == "," and depth == 0:
            items.append(current.strip())
            current = ""
        else:
            current += ch
    items.append(current.strip())
    if depth != 0 or any(not i for i in items):
        raise Rl360Error(f"--nodes {selector!r} is not a valid selector",
                         "use names, ranges, globs or tier:NAME separated by commas, e.g. n[1-3],n7")
    return items


def _expand(item: str) -> list[str]:
    match = _RANGE.match(item)
    if not match:
        return [item]
    prefix, body, suffix = match.groups()
    out = []
    for part in body.split(","):
        if "-" in part:
            lo, _, hi = part.partition("-")
            if not lo or not hi or int(lo) > int(hi):
                raise Rl360Error(f"--nodes {item}: bad range {part!r}", "write ranges low-high, e.g. n[1-3]")
            width = len(lo) if lo.startswith("0") else 0
            out += [f"{prefix}{i:0{width}d}{suffix}" for i in range(int(lo), int(hi) + 1)]
        elif part:
            out.append(f"{prefix}{part}{suffix}")
    return out
