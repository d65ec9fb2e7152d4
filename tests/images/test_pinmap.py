"""The pin map: warm capacity per image and disk budgets, against hand-worked cluster layouts."""

from __future__ import annotations

import pytest

from rl360cli.nodes.config import NodeSpec
from rl360cli.images.config import ImageSpec
from rl360cli.images.pinmap import MB, Demand, PinMapError, Where, plan_pins, slots

WHERE = Where(profile="cluster/p.toml", images="images/images.toml")


def nodes(*names, tier="rollout", cpus=2.0, memory_mb=4096, disk_gb=1.0):
    return [NodeSpec(name=n, tier=tier, docker_host=f"unix:///tmp/{n}.sock", cpus=cpus, memory_mb=memory_mb,
                     disk_budget_gb=disk_gb) for n in names]


def demand(name, size_mb=100, warm_on=(), **spec):
    return Demand(name=name, spec=ImageSpec(ref=f"rl360/{name}:1", **spec), ref=f"r/rl360/{name}:1",
                  digest="sha256:" + "0" * 64, size=int(size_mb * MB), size_known=True, warm_on=frozenset(warm_on))


def test_default_is_every_node_of_the_images_tiers():
    cluster = nodes("n1", "n2") + nodes("s1", tier="service")
    pins = plan_pins([demand("a"), demand("b", tiers=("service", "rollout"))], cluster, where=WHERE)
    assert pins.placements["a"].nodes == ("n1", "n2")
    assert pins.placements["b"].nodes == ("n1", "n2", "s1")
    assert pins.disk == {"n1": 200 * MB, "n2": 200 * MB, "s1": 100 * MB}


def test_slots_are_the_tighter_of_cpus_and_memory():
    (node,) = nodes("n1", cpus=8.0, memory_mb=4096)
    assert slots(node, ImageSpec(ref="x", cpus=1.0, memory_mb=1024)) == 4
    assert slots(node, ImageSpec(ref="x", cpus=3.0, memory_mb=512)) == 2
    assert slots(node, ImageSpec(ref="x", cpus=0.5, memory_mb=3000)) == 1


def test_expected_concurrency_takes_the_fewest_nodes_and_prefers_warm_ones():
    cluster = nodes("n1", "n2", "n3", "n4")  # 2 CPUs each: 2 one-CPU sandboxes per node
    pins = plan_pins([demand("py", warm_on={"n3"}, expected_concurrency=3, cpus=1.0, memory_mb=512)], cluster,
                     where=WHERE)
    placed = pins.placements["py"]
    assert placed.nodes == ("n1", "n3") and placed.capacity == 4
    assert placed.rule == "expected_concurrency 3"


def test_pin_count_prefers_warm_then_free_disk():
    cluster = nodes("n1", "n2", "n3")
    pins = plan_pins([demand("big", size_mb=600, pin_count=1), demand("x", size_mb=50, pin_count=2, warm_on={"n3"})],
                     cluster, where=WHERE)
    assert pins.placements["big"].nodes == ("n1",)
    # n3 is warm; of n1 (400 MB free after big) and n2 (1000 MB free), n2 has more room left.
    assert pins.placements["x"].nodes == ("n2", "n3")


def test_explicit_pin_and_its_errors():
    cluster = nodes("n1", "n2", "n3")
    pins = plan_pins([demand("a", pin=("n3", "n1"))], cluster, where=WHERE)
    assert pins.placements["a"].nodes == ("n1", "n3") and pins.placements["a"].rule == "pin"
    with pytest.raises(PinMapError) as caught:
        plan_pins([demand("a", pin=("n1", "n9"))], cluster, where=WHERE)
    assert "images/images.toml: [images.a] pins node 'n9', which is not in cluster/p.toml" in caught.value.problem
    assert caught.value.fix == "use one of: n1, n2, n3"
    with pytest.raises(PinMapError, match="pinned nodes n1 have room for 2"):
        plan_pins([demand("a", pin=("n1",), expected_concurrency=3)], cluster, where=WHERE)


def test_too_much_concurrency_for_the_tier():
    with pytest.raises(PinMapError) as caught:
        plan_pins([demand("py", expected_concurrency=7, cpus=1.0, memory_mb=512)], nodes("n1", "n2", "n3"),
                  where=WHERE)
    assert "expects 7 sandboxes at once" in caught.value.problem and "have room for 6" in caught.value.problem
    assert "lower expected_concurrency" in caught.value.fix


def test_disk_budget_is_kept_and_the_error_names_the_node_and_the_fix():
    cluster = nodes("n1", "n2", disk_gb=0.5)
    with pytest.raises(PinMapError) as caught:
        plan_pins([demand("a", size_mb=300), demand("b", size_mb=300)], cluster, where=WHERE)
    assert caught.value.problem.startswith("node n1's disk budget (500.0 MB) cannot hold a, b (600.0 MB)")
    assert "raise disk_budget_gb of n1 in cluster/p.toml" in caught.value.fix and "--prune" in caught.value.fix
    # With one pinned per node they fit.
    pins = plan_pins([demand("a", size_mb=300, pin_count=1), demand("b", size_mb=300, pin_count=1)], cluster,
                     where=WHERE)
    assert {pins.placements["a"].nodes, pins.placements["b"].nodes} == {("n1",), ("n2",)}
    assert max(pins.disk.values()) <= 500 * MB


def test_kept_unlisted_images_count_against_the_budget():
    cluster = nodes("n1", "n2", disk_gb=0.5)
    pins = plan_pins([demand("a", size_mb=300, pin_count=1)], cluster, where=WHERE,
                     other_usage={"n1": 400 * MB}, other_images={"n1": ["old"]})
    assert pins.placements["a"].nodes == ("n2",)
    with pytest.raises(PinMapError, match="cannot hold old, a"):
        plan_pins([demand("a", size_mb=300)], cluster, where=WHERE, other_usage={"n1": 400 * MB},
                  other_images={"n1": ["old"]})


def test_pin_count_larger_than_the_tier_and_a_tier_without_nodes():
    with pytest.raises(PinMapError, match="pin_count = 3, but cluster/p.toml has 2 node"):
        plan_pins([demand("a", pin_count=3)], nodes("n1", "n2"), where=WHERE)
    with pytest.raises(PinMapError, match="is for tier training, but cluster/p.toml has no node in it"):
        plan_pins([demand("a", tiers=("training",))], nodes("n1"), where=WHERE)


def test_placements_keep_the_lists_order():
    pins = plan_pins([demand("small", size_mb=1), demand("large", size_mb=500)], nodes("n1"), where=WHERE)
    assert list(pins.placements) == ["small", "large"]
