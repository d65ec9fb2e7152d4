"""`rl360 status` output: many engines of one tier collapse into one row, failures stay visible."""

from __future__ import annotations

from rl360cli.commands.status import component_rows


def comp(kind: str, tier: str, status: str, port: int, node: str = "n1") -> dict:
    return {"kind": kind, "tier": tier, "status": status, "ports": {"http": port}, "node": node, "pid": 1,
            "started_at": "2026-11-29T10:00:00.000+00:00"}


def test_ninety_six_running_engines_are_one_row_and_a_failed_one_its_own():
    comps = {f"rollout/engine-{i}": comp("engine-sglang", "rollout", "running", 30000 + i, f"n{i // 4}")
             for i in range(96)}
    comps["rollout/engine-7"]["status"] = "failed"
    comps["rollout/engine-7"]["reason"] = "node_lost"
    comps["service/router"] = comp("router", "service", "running", 29000)
    rows = component_rows(comps)
    assert rows[0] == ("rollout/engine-sglang ×95", "running", "24 node(s)", "30000–30095", "10:00:00", "")
    assert ("rollout/engine-7", "failed") == rows[1][:2] and rows[1][-1] == "node_lost"
    assert [r[0] for r in rows[2:]] == ["service/router"]


def test_a_few_components_keep_their_own_rows():
    comps = {f"rollout/engine-{i}": comp("engine-local", "rollout", "running", 31000 + i) for i in range(3)}
    assert [r[0] for r in component_rows(comps)] == [f"rollout/engine-{i}" for i in range(3)]
