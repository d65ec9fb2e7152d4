"""Where the Slurm tiers' Ray nodes listen: the head on the profile's port, Ray's workers on a range that
holds none of the profile's ports (`ray start --head` refuses a GCS port among them), sockets and logs
in a temp dir per node. No Slurm needed."""

from __future__ import annotations

import pytest

from rl360cli.backends.slurm_ray import ray_cluster_specs, worker_ports
from rl360cli.errors import Rl360Error


@pytest.mark.parametrize(("base_port", "sync_port", "expected"), [
    (31000, 29600, (10002, 19999)),   # the default profile: Ray's own default range
    (17000, 29600, (20002, 29499)),   # the chaos bench's random block met Ray's default range
    (19950, 29600, (40002, 49999)),   # a block across the first two ranges
    (31000, 15000, (20002, 29499)),   # the rendezvous port in the first
])
def test_the_worker_ports_miss_the_profiles_ports(base_port, sync_port, expected):
    low, high = worker_ports(base_port, sync_port)
    assert (low, high) == expected
    assert not set(range(base_port, base_port + 100)) & set(range(low, high + 1))
    assert not low <= sync_port <= high


def test_no_range_left_is_one_line_naming_the_fix():
    with pytest.raises(Rl360Error, match="move base_port or sync_port in the cluster profile"):
        worker_ports(19950, 45000)


def test_every_ray_node_gets_the_range_and_a_temp_dir_of_its_own(tmp_path):
    doc = {"tiers": {"service": {"nodes": ["n1"]}, "training": {"nodes": ["n2"]}, "rollout": {"nodes": ["n3", "n4"]}},
           "nodes": {"n1": {"address": "10.0.0.1"}}}
    specs = ray_cluster_specs(doc=doc, run="r", token_path=tmp_path / "token", port=17090,
                              python="/shared/venv/bin/python",
                              worker_port_range=worker_ports(17000, 29600))
    assert [s.node for s in specs] == ["n1", "n2", "n3", "n4"]
    # `ray` is the one beside the nodes' interpreter, not beside the one that rendered the command.
    assert {s.argv[0] for s in specs} == {"/shared/venv/bin/ray"}
    for spec in specs:
        assert "--min-worker-port=20002" in spec.argv and "--max-worker-port=29499" in spec.argv
        assert f"--temp-dir=/tmp/ray/{spec.node}" in spec.argv
    assert "--port=17090" in specs[0].argv and "--address=10.0.0.1:17090" in specs[1].argv
