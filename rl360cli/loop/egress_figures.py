"""A step's figures of the sandboxes' way out (the profile's `[egress]`, rl360cli/egress/proxy.py): per host the
bytes that crossed the node's egress proxy (`egress/bytes/<host>`), the requests it refused
(`egress/denied/<host>`: hosts off the allow-list, the model's doing) and those it could not serve
(`egress/failed/<host>`: allowed hosts that could not be reached, each an infra failure `egress`), and the GETs
its per-node cache answered (`egress/cache_hits`).

Each attempt's counts travel in its session's metadata (`egress`, rl360cli/agent/session.py), once per session
(its first segment). A step whose sandboxes went out through no proxy has none of these keys.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from rl360cli.rl.trajectory import Trajectory


def egress_figures(trajectories: Sequence[Trajectory]) -> dict[str, int]:
    reports = [t.metadata["egress"] for t in trajectories if t.segment == 0 and t.metadata.get("egress")]
    figures: dict[str, int] = {}
    for kind in ("bytes", "denied", "failed"):
        total: Counter = Counter()
        for report in reports:
            total.update(report.get(kind) or {})
        figures.update((f"egress/{kind}/{host}", n) for host, n in sorted(total.items()))
    # Only where something went through a proxy: a task that wanted the internet under `[egress] mode = "none"`
    # has a report too (its one line), and a step of those has nothing to count.
    if any(r.get(kind) for r in reports for kind in ("bytes", "denied", "failed", "cache_hits")):
        figures["egress/cache_hits"] = sum(int(r.get("cache_hits") or 0) for r in reports)
    return figures
