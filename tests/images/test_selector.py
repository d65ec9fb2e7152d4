"""`--nodes`: names, ranges, globs and tiers, and the errors for what the profile does not have."""

from __future__ import annotations

import pytest

from rl360cli.errors import Rl360Error
from rl360cli.nodes.config import NodeSpec
from rl360cli.nodes.selector import select_nodes

NODES = tuple(NodeSpec(name=n, tier="service" if n == "s1" else "rollout", docker_host=f"unix:///tmp/{n}.sock")
              for n in ("n1", "n2", "n3", "n10", "s1"))


@pytest.mark.parametrize("selector, expected", [
    (None, ["n1", "n2", "n3", "n10", "s1"]),
    ("n2", ["n2"]),
    ("n3,n1", ["n1", "n3"]),
    ("n[1-2]", ["n1", "n2"]),
    ("n[1-3,10]", ["n1", "n2", "n3", "n10"]),
    ("n*", ["n1", "n2", "n3", "n10"]),
    ("tier:service", ["s1"]),
    ("tier:service,n[2-3]", ["n2", "n3", "s1"]),
])
def test_selection(selector, expected):
    assert [n.name for n in select_nodes(NODES, selector, profile="t")] == expected


@pytest.mark.parametrize("selector, message", [
    ("n42", "node 'n42' is not in profile 't' (p.toml); use one of: n1, n2, n3, n10, s1"),
    ("n[1-4]", "node 'n4' is not in profile 't'"),
    ("gpu*", "matches no node"),
    ("tier:training", "use one of: tier:rollout, tier:service"),
    ("n1,,n2", "not a valid selector"),
    ("n[3-1]", "bad range"),
])
def test_bad_selectors(selector, message):
    with pytest.raises(Rl360Error) as caught:
        select_nodes(NODES, selector, profile="t", where="p.toml")
    assert message in str(caught.value)


def test_a_profile_without_nodes():
    with pytest.raises(Rl360Error, match="lists no nodes; add \\[\\[nodes\\]\\]"):
        select_nodes((), None, profile="empty")
