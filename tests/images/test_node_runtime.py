"""Reaching a node's Docker daemon: unix socket and ssh:// with paramiko, and how failures read."""

from __future__ import annotations

import subprocess

import pytest

from rl360cli.nodes.config import NodeSpec
from rl360cli.images.config import ImageRef
from rl360cli.nodes.base import NodeError
from rl360cli.nodes.runtime import connect

pytestmark = pytest.mark.docker


def _ssh_spec(ssh_node: dict, **override) -> NodeSpec:
    fields = {"name": ssh_node["name"], "docker_host": f"ssh://{ssh_node['user']}@{ssh_node['host']}:{ssh_node['port']}",
              "key_path": ssh_node["key_path"], "known_hosts": ssh_node["known_hosts"]}
    return NodeSpec(**{**fields, **override})


def test_unix_socket_that_is_not_there_reads_as_unreachable(tmp_path):
    with pytest.raises(NodeError) as caught:
        connect(NodeSpec(name="gone", docker_host=f"unix://{tmp_path}/nothing.sock"))
    assert caught.value.transient
    assert caught.value.reason.startswith(f"cannot reach the Docker daemon at unix://{tmp_path}/nothing.sock")
    assert "No such file" in caught.value.reason


@pytest.mark.sshd
def test_ssh_and_unix_socket_see_the_same_cache(dev, ssh_nodes):
    ssh_node = ssh_nodes["nodes"][0]
    unix = next(n for n in dev["nodes"] if n["name"] == ssh_node["name"])
    over_ssh = connect(_ssh_spec(ssh_node))
    direct = connect(NodeSpec(name=unix["name"], docker_host=unix["docker_host"]))
    try:
        assert sorted(i.id for i in over_ssh.images()) == sorted(i.id for i in direct.images())
        assert over_ssh.running_image_ids() == direct.running_image_ids()
    finally:
        over_ssh.close()
        direct.close()


@pytest.mark.sshd
def test_ssh_refuses_a_host_key_it_does_not_know(ssh_nodes, tmp_path):
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    with pytest.raises(NodeError) as caught:
        connect(_ssh_spec(ssh_nodes["nodes"][0], known_hosts=str(empty)))
    assert caught.value.reason.startswith("ssh to ssh://root@127.0.1.")
    assert "not found in known_hosts" in caught.value.reason


@pytest.mark.sshd
def test_ssh_with_a_key_the_node_does_not_accept(ssh_nodes, tmp_path):
    stranger = tmp_path / "id_stranger"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(stranger)], check=True)
    with pytest.raises(NodeError) as caught:
        connect(_ssh_spec(ssh_nodes["nodes"][0], key_path=str(stranger)))
    assert "Authentication failed" in caught.value.reason


def test_pulling_a_digest_the_registry_lacks_is_a_permanent_failure(dev):
    node = dev["nodes"][0]
    runtime = connect(NodeSpec(name=node["name"], docker_host=node["docker_host"]))
    ref = ImageRef.parse("rl360-test/absent/ghost:1", default_registry=dev["registry"])
    try:
        with pytest.raises(NodeError) as caught:
            runtime.pull(ref, "sha256:" + "0" * 64)
    finally:
        runtime.close()
    assert not caught.value.transient
    assert "manifest unknown" in caught.value.reason or "not found" in caught.value.reason
