"""The same prewarm through sshd on 127.0.1.x with paramiko (cluster/dev/sshd-nodes.sh + docker-nodes.sh).

Each sshd node's sessions reach that node's dockerd, so what the prewarm pulls over SSH is checked on
the daemons directly through their unix sockets.
"""

from __future__ import annotations

import json

import pytest

from tests.images.conftest import node_digests, write_images, write_profile

pytestmark = [pytest.mark.docker, pytest.mark.sshd]


def ssh_profile_nodes(ssh_nodes: dict, names: list[str]) -> list[dict]:
    by_name = {n["name"]: n for n in ssh_nodes["nodes"]}
    return [{"name": name, "docker_host": f"ssh://{by_name[name]['user']}@{by_name[name]['host']}:{by_name[name]['port']}",
             "key_path": by_name[name]["key_path"], "known_hosts": by_name[name]["known_hosts"]} for name in names]


def test_prewarm_over_ssh_with_paramiko(dev, ssh_nodes, images, tmp_path, cli, state_path):
    names = [n["name"] for n in ssh_nodes["nodes"] if n["name"] in {d["name"] for d in dev["nodes"]}][:3]
    assert len(names) >= 2, "the sshd nodes and the Docker nodes should share names n1.."
    alpha, beta = images.push("alpha"), images.push("beta")
    image_list = write_images(tmp_path / "images.toml",
                              {"alpha": {"ref": alpha["short_ref"]}, "beta": {"ref": beta["short_ref"]}})
    nodes = ssh_profile_nodes(ssh_nodes, names)
    assert all(n["docker_host"].startswith("ssh://root@127.0.1.") for n in nodes)
    profile = write_profile(tmp_path / "ssh.toml", nodes)

    proc = cli("prewarm-images", "--profile", str(profile), "--images", str(image_list), "--wave-size", "2", "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["pulled"] == 2 * len(names) and all(len(w) <= 2 for w in report["waves"])

    state = json.loads(state_path.read_text())
    sockets = {d["name"]: d["docker_host"] for d in dev["nodes"]}
    for name in names:
        assert state["nodes"][name]["docker_host"].startswith("ssh://")
        assert state["nodes"][name]["address"].startswith("127.0.1.")
        held = node_digests(sockets[name])
        for image in (alpha, beta):
            assert state["nodes"][name]["images"][image["ref"]]["digest"] == image["digest"]
            assert f"{image['repo']}@{image['digest']}" in held

    again = json.loads(cli("prewarm-images", "--profile", str(profile), "--images", str(image_list), "--json").stdout)
    assert again["pulled"] == 0 and {c["status"] for c in again["cells"]} == {"warm"}
